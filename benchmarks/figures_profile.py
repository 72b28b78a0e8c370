"""Figures of profile and mixed_step outputs (summary.suite_figures "decode_floor", "mixed_step",
"tp", "cost_model"): the b=1 decode step against the GEMM floor, mixed steps per execution mode,
TP=1 against TP=2, the installed cost model. Pure functions of their JSON."""
from __future__ import annotations

from typing import Mapping, Sequence

from dynspec.benchmarks.figures_common import spread
from dynspec.errors import DynspecError


def decode_vs_gemm_floor(profile: Mapping) -> dict | None:
    """Plain decode at b=1 with 1024 tokens of context over the GEMM floor, from one profile --floor JSON."""
    fl = profile.get("floor")
    if not isinstance(fl, Mapping) or not fl.get("gemm_floor_ms") or not fl.get("decode_ms"):
        return None
    return {"ratio": fl["decode_ms"] / fl["gemm_floor_ms"], "decode_ms": fl["decode_ms"],
            "gemm_floor_ms": fl["gemm_floor_ms"], "context_len": fl.get("context_len"), "method": fl.get("method"),
            "decode_graph_ms": fl.get("decode_graph_ms"), "decode_overlap_ms": fl.get("decode_overlap_ms")}


def floor_trials(profiles: Sequence[Mapping]) -> dict:
    """Several profile --floor runs (each its decode and its GEMM floor, timed side by side) -> the
    median trial (the lower middle one for an even count, so ratio = its decode_ms / gemm_floor_ms)
    with min..max and every trial: ratios 1.21, 1.20, 1.24 -> ratio 1.21, min 1.20, max 1.24."""
    trials = [dict(decode_vs_gemm_floor(p), command=p.get("command")) for p in profiles]
    ratios = [t["ratio"] for t in trials]
    mid = sorted(trials, key=lambda t: t["ratio"])[(len(trials) - 1) // 2]
    return dict(mid, min=min(ratios), max=max(ratios), trials=trials)


# floor figures beside decode_ms / floor_ms / ratio, each run's num / den (den None: num itself):
# the graphs replayed alone, the step served by the overlapped loop (gemm_floor.overlap_decode_ms)
FLOOR_EXTRA = (("graph_ms", "decode_graph_ms", None), ("overlap_ms", "decode_overlap_ms", None),
               ("graph_ratio", "decode_graph_ms", "gemm_floor_ms"),
               ("overlap_ratio", "decode_overlap_ms", "gemm_floor_ms"),
               ("overlap_vs_graph", "decode_overlap_ms", "decode_graph_ms"))


def floor_figures(profiles: Sequence[Mapping]) -> dict:
    """Several profile --floor runs -> decode_ms, floor_ms and decode / floor, each median, min, max."""
    trials = [decode_vs_gemm_floor(p) for p in profiles]
    if any(t is None for t in trials):
        raise DynspecError("a floor profile has no 'floor' with gemm_floor_ms and decode_ms (profile --floor)")
    fig = {k: spread([t[src] for t in trials]) for k, src in
           (("decode_ms", "decode_ms"), ("floor_ms", "gemm_floor_ms"), ("ratio", "ratio"))}
    for k, num, den in FLOOR_EXTRA:            # runs with the overlapped step, where every run has both times
        if all(t.get("decode_overlap_ms") and t.get(num) and (den is None or t.get(den)) for t in trials):
            fig[k] = spread([t[num] / (t[den] if den else 1.0) for t in trials])
    fig.update(context_len=trials[0]["context_len"], method=trials[0]["method"],
               median_trial=floor_trials(profiles)["ratio"], commands=[p.get("command") for p in profiles])
    return fig


def floor_table(fig: Mapping) -> dict:
    rows = [[k, f"{fig[k]['median']:.4g}", f"{fig[k]['min']:.4g}", f"{fig[k]['max']:.4g}", fig[k]["n"]]
            for k in ("decode_ms", "floor_ms", "ratio", *(x for x, _, _ in FLOOR_EXTRA)) if k in fig]
    return {"header": ["figure", "median", "min", "max", "trials"], "rows": rows}


def floor_plot(fig: Mapping) -> dict:
    return {"title": f"b=1 decode at context {fig['context_len']} vs the GEMM floor", "x": "", "y": "ms",
            "bars": {k: [fig[k]["median"], fig[k]["min"], fig[k]["max"]] for k in ("decode_ms", "floor_ms")}}


def mixed_figures(doc: Mapping) -> dict:
    """{"points": {"b:K:chunk": {"<mode>": ms}}} from every numeric `<mode>_ms` field of each point,
    and, where the run timed kernels, {"where": {"b:K:chunk": kernel_split.point_split}}: the full
    graphs' step and the decode step by GEMMs, attention, the rest and the wall outside kernels."""
    from dynspec.benchmarks.kernel_split import point_split

    pts, where = {}, {}
    for p in doc["points"]:
        pts[p["point"]] = {k[:-3]: v for k, v in p.items() if k.endswith("_ms") and isinstance(v, (int, float))}
        if (s := point_split(p)) is not None:
            where[p["point"]] = s
    return {"points": pts, **({"where": where} if where else {}), "context_len": doc.get("context_len"),
            "device": doc.get("device"), "statistic": doc.get("statistic"), "command": doc.get("command")}


def mixed_table(fig: Mapping) -> dict:
    """One row a point: each mode's ms; with kernel timing, full / decode, the full step's GEMMs,
    attention, rest and wall minus kernels (the decode step's in brackets) and gemm_floor."""
    modes = sorted({m for v in fig["points"].values() for m in v})
    where = fig.get("where", {})
    parts = ("gemm", "attention", "rest")
    header = ["point b:K:chunk", *[f"{m} ms" for m in modes]]
    if where:
        header += ["full / decode", *[f"{x} ms (decode)" for x in parts], "wall - kernels ms (decode)",
                   "floor: chunk adds GEMMs only"]
    rows = []
    for p, v in fig["points"].items():
        row = [p, *[f"{v[m]:.3f}" if m in v else "-" for m in modes]]
        if where:
            w = where.get(p)
            if w is None:
                row += ["-"] * (len(header) - len(row))
            else:
                mx, dc = w["mixed"], w["decode"]
                ratio = f"{v['full'] / v['decode']:.3f}" if v.get("full") and v.get("decode") else "-"
                row += [ratio, *[f"{mx[x + '_ms']:.2f} ({dc[x + '_ms']:.2f})" for x in parts],
                        f"{mx['wall_ms'] - mx['kernel_ms']:.2f} ({dc['wall_ms'] - dc['kernel_ms']:.2f})",
                        f"{w['gemm_floor']:.3f}" if w["gemm_floor"] is not None else "-"]
        rows.append(row)
    return {"header": header, "rows": rows}


def mixed_plot(fig: Mapping) -> dict:
    return {"title": f"ms per step at context {fig['context_len']}", "x": "", "y": "ms",
            "groups": fig["points"]}


def tp_figures(tp1: Mapping, tp2: Mapping) -> dict:
    """The same profile at TP=1 and TP=2: iteration ms per (b, K), TP=1 / TP=2 per shape, and the
    b=1 decode / GEMM floor of each (profile --floor)."""
    from dynspec.runtime.policy.cost_model import Profile

    def it(p):               # its one table, in either profile format
        table = Profile.from_json(p, "tp profile").table(where="tp profile").iteration_ms
        return {f"{b}:{k}": ms for b, row in sorted(table.items()) for k, ms in sorted(row.items())}

    one, two = it(tp1), it(tp2)
    return {"iteration_ms": {"tp1": one, "tp2": two},
            "tp1_over_tp2": {s: one[s] / two[s] for s in one if s in two and two[s] > 0},
            "floor": {"tp1": decode_vs_gemm_floor(tp1), "tp2": decode_vs_gemm_floor(tp2)},
            "commands": [tp1.get("command"), tp2.get("command")]}


def tp_table(fig: Mapping) -> dict:
    one, two = fig["iteration_ms"]["tp1"], fig["iteration_ms"]["tp2"]
    return {"header": ["b:K", "TP=1 ms", "TP=2 ms", "TP=1 / TP=2"],
            "rows": [[s, f"{one[s]:.3f}", f"{two[s]:.3f}", f"{r:.3f}"] for s, r in fig["tp1_over_tp2"].items()]}


def tp_plot(fig: Mapping) -> dict:
    return {"title": "iteration ms, TP=1 vs TP=2", "x": "", "y": "ms",
            "groups": {s: {"tp1": fig["iteration_ms"]["tp1"][s], "tp2": fig["iteration_ms"]["tp2"][s]}
                       for s in fig["tp1_over_tp2"]}}


def cost_model_figures(profile: Mapping, path) -> dict:
    """The installed cost model: iteration ms at every profiled (context, b, K), read by the one
    reader of the format (runtime/policy/cost_model.py CostModel)."""
    from dynspec.runtime.policy.cost_model import CostModel

    cm = CostModel.load(path)
    ms = {str(ctx): {f"{b}:{k}": cm.lookup(b, k, ctx).ms for b in cm.batch_sizes for k in cm.draft_lens}
          for ctx in cm.context_lens}
    return {"device": cm.device, "context_lens": list(cm.context_lens), "batch_sizes": list(cm.batch_sizes),
            "draft_lens": list(cm.draft_lens), "iteration_ms": ms, "command": profile.get("command")}


def cost_model_table(fig: Mapping) -> dict:
    ks = fig["draft_lens"]
    return {"header": ["context", "b", *[f"K={k} ms" for k in ks]],
            "rows": [[ctx, b, *[f"{t[f'{b}:{k}']:.3f}" for k in ks]] for ctx, t in fig["iteration_ms"].items()
                     for b in fig["batch_sizes"]]}


def cost_model_plot(fig: Mapping) -> dict:
    series = {f"context {ctx}, K={k}": [[b, t[f"{b}:{k}"], t[f"{b}:{k}"], t[f"{b}:{k}"]] for b in fig["batch_sizes"]]
              for ctx, t in fig["iteration_ms"].items() for k in fig["draft_lens"]}
    return {"title": "iteration ms per (context, b, K)", "x": "batch size b", "y": "ms", "xlog": True,
            "series": series}


def draft_sync_figures(profile: Mapping) -> dict:
    """What K=0 costs and what resuming costs, from a profile (docs/design.md, "Draft sync"), at its
    first context: {"draft_sync": "lazy", "context_len": 128,
                    "k0_vs_decode": {"64": 1.002, ...},          # iteration_ms K=0 / decode_ms
                    "catch_up": {"tokens": 100, "vs_decode": {"64": 0.41, ...}}}   # (K=1 with catch-up
    - K=1) / decode_ms; catch_up None without profile --catch-up."""
    t = profile["tables"][0]
    it, dec = t["iteration_ms"], t.get("decode_ms") or {}
    k0 = {b: it[b]["0"] / dec[b] for b in it if "0" in it[b] and dec.get(b)}
    cu, out = profile.get("catch_up"), None
    if isinstance(cu, Mapping):
        out = {"tokens": cu["tokens"], "vs_decode": {b: (ms - it[b]["1"]) / dec[b] for b, ms in cu["ms"].items()
                                                      if b in it and "1" in it[b] and dec.get(b)}}
    sync = profile.get("draft_sync") or ("warm" if profile.get("keep_warm") else "off")   # (older profiles)
    return {"draft_sync": sync, "context_len": t["context_len"], "k0_vs_decode": k0,
            "catch_up": out, "eager_fallbacks": profile.get("eager_fallbacks")}


def draft_sync_note(fig: Mapping) -> str:
    """One summary line: the K=0 step over plain decode at b >= 64, and the catch-up at b = 64."""
    k0 = ", ".join(f"b={b} {r:.3f}" for b, r in fig["k0_vs_decode"].items() if int(b) >= 64)
    line = f"Draft sync {fig['draft_sync']} (profile, context {fig['context_len']}): K=0 step / plain decode {k0}."
    if fig.get("eager_fallbacks"):
        line += f" ({fig['eager_fallbacks']} steps ran eagerly: a graph was missing.)"
    cu = fig["catch_up"]
    if cu and "64" in cu["vs_decode"]:
        line += (f" Resuming after {cu['tokens']} K=0 steps at b=64: the catch-up costs"
                 f" {cu['vs_decode']['64']:.2f} plain decode steps.")
    return line
