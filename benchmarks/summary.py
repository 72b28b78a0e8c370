"""Headline figures from sweep results (and the profile measured with them). Pure + a thin CLI.

    python -m dynspec.benchmarks.summary --regime A=results/h200_A.json --regime B=results/h200_B.json \\
        --profile A=results/h200_A_profile.json --fixed-baseline B=results/h200_B_fixed.json \\
        --peak-bandwidth-tbps 4.8 --out results/h200_summary.json

Figures (per regime where it applies):
    crossover_concurrency        smallest C at which baseline out-runs static (null: never in the sweep)
    dynamic_ratio_by_concurrency dynamic / max(baseline, static) at each C
    max_dynamic_gain             the largest of those ratios, with its regime and C
    c1_speedup                   dynamic / baseline at C = 1 (first regime)
    decode_bandwidth_fraction    target weight bytes / plain decode step at b = 1 / peak bandwidth
    host_overhead_fraction       (policy + planning) / engine step time of dynamic at C = 1
Version 2 adds (ratios use the medians of the trials; a spread is min..max over trials):
    dynamic_verdict_by_concurrency  "win" | "tie" | "loss" of dynamic against the better of
                                 baseline and static; "tie" when their trial spreads overlap
    trial_spread                 {regime: {mode: {C: {median, min, max, trials}}}} (tok/s)
    ttft_ms                      {regime: {mode: {C: {p50, p99}}}}; Poisson rows under "poisson@C"
    open_loop                    {regime: {mode: {C: {rate, tok_per_s, p99_latency_s}}}} beside the closed loop
    decode_vs_gemm_floor         plain decode at b=1, 1024 context / the GEMMs alone (profile --floor)
    varied_vs_fixed_baseline     {"64": r, "256": r}: baseline tok/s with varied lengths (the regime's
                                 sweep, or --varied-baseline: the same loads as the fixed one) / with
                                 fixed lengths of the same mean (--fixed-baseline)
    varied_vs_fixed_baseline_steady  the same ratio of steady_tok_per_s (iterations with >= 0.9 C
                                 decode rows). Lopsided: the fixed run's steady figure leaves out all
                                 its prefill, which runs in iterations without decode rows
    varied_steady_vs_fixed_baseline  the varied run's steady_tok_per_s / the fixed run's
                                 output_tok_per_s (lockstep waves have no drain tail). Leans high:
                                 the top counts only full iterations, the bottom every wave's prefill
    varied_vs_fixed_baseline_sustained  the same ratio of sustained_tok_per_s (tokens emitted before
                                 the last submission / the time until then, both runs; null for
                                 sweeps that predate it)
    figure_commands              {figure: [the commands whose outputs it is computed from]}
"""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import Mapping, Sequence

from dynspec.errors import DynspecError


def _tps(rows: Sequence[Mapping], mode: str, field: str = "output_tok_per_s") -> dict[int, float]:
    """{C: rows' `field`} of one mode's closed-loop rows; rows without the field are left out."""
    return {int(r["concurrency"]): float(r[field]) for r in rows
            if r["mode"] == mode and r.get("concurrency") is not None and r.get(field) is not None}


def crossover_concurrency(rows: Sequence[Mapping]) -> int | None:
    """Smallest C where baseline's throughput is above static's; None if it never is."""
    base, stat = _tps(rows, "baseline"), _tps(rows, "static")
    for c in sorted(set(base) & set(stat)):
        if base[c] > stat[c]:
            return c
    return None


def dynamic_ratio_by_concurrency(rows: Sequence[Mapping]) -> dict[str, float]:
    """{"<C>": dynamic / max(baseline, static)} over the C's where dynamic and another mode ran."""
    dyn, base, stat = _tps(rows, "dynamic"), _tps(rows, "baseline"), _tps(rows, "static")
    out = {}
    for c in sorted(dyn):
        others = [x[c] for x in (base, stat) if c in x]
        if others and max(others) > 0:
            out[str(c)] = dyn[c] / max(others)
    return out


def c1_speedup(rows: Sequence[Mapping]) -> float | None:
    dyn, base = _tps(rows, "dynamic"), _tps(rows, "baseline")
    return dyn[1] / base[1] if 1 in dyn and 1 in base and base[1] > 0 else None


def host_overhead_fraction(rows: Sequence[Mapping], mode: str = "dynamic", concurrency: int = 1) -> float | None:
    for r in rows:
        if r["mode"] == mode and r.get("concurrency") == concurrency:
            return r.get("host_overhead_fraction")
    return None


def decode_bandwidth_fraction(profile: Mapping, peak_bytes_per_s: float, batch_size: int = 1) -> dict | None:
    """Weight streaming of the plain decode step at `batch_size` as a fraction of peak: from the
    profile's --floor block (b=1, 1024 context) when it has one, else its decode_ms at its context."""
    wb = profile.get("target_weight_bytes")
    fl = profile.get("floor") if isinstance(profile.get("floor"), Mapping) else {}
    dec, ctx = (fl.get("decode_ms"), fl.get("context_len")) if batch_size == 1 and fl.get("decode_ms") else (None, None)
    if dec is None:
        dec, ctx = (profile.get("decode_ms") or {}).get(str(batch_size)), profile.get("context_len")
    if dec is None:
        dec = (profile.get("iteration_ms", {}).get(str(batch_size)) or {}).get("0")
    if not wb or not dec:
        return None
    bps = wb / (dec / 1e3)
    return {"fraction": bps / peak_bytes_per_s, "decode_ms": dec, "weight_bytes": wb,
            "achieved_tb_per_s": bps / 1e12, "peak_tb_per_s": peak_bytes_per_s / 1e12, "context_len": ctx}


def _closed(rows: Sequence[Mapping], mode: str) -> dict[int, Mapping]:
    return {int(r["concurrency"]): r for r in rows if r["mode"] == mode and r.get("concurrency") is not None}


def dynamic_verdicts(rows: Sequence[Mapping]) -> dict[str, str]:
    """{"<C>": verdict of dynamic against the better (by median) of baseline and static}."""
    from dynspec.benchmarks.report import verdict

    dyn, others = _closed(rows, "dynamic"), [_closed(rows, m) for m in ("baseline", "static")]
    out = {}
    for c, d in sorted(dyn.items()):
        rivals = [o[c] for o in others if c in o]
        if rivals:
            out[str(c)] = verdict(d, max(rivals, key=lambda r: r["output_tok_per_s"]))
    return out


def trial_spread(rows: Sequence[Mapping]) -> dict:
    """{mode: {"<C>": {"median", "min", "max", "trials"}}} of closed-loop tok/s."""
    out: dict = {}
    for r in rows:
        if r.get("concurrency") is None:
            continue
        med = r["output_tok_per_s"]
        out.setdefault(r["mode"], {})[str(r["concurrency"])] = {
            "median": med, "min": r.get("tok_per_s_min", med), "max": r.get("tok_per_s_max", med),
            "trials": r.get("trials", 1)}
    return out


def _load_name(r: Mapping) -> str | None:
    if r.get("concurrency") is not None:
        return str(r["concurrency"])
    if r.get("matched_concurrency") is not None:
        return f"poisson@{r['matched_concurrency']}"
    return None if r.get("request_rate") is None else f"rate={r['request_rate']:g}"


def ttft_ms(rows: Sequence[Mapping]) -> dict:
    """{mode: {"<C>" | "poisson@<C>": {"p50": ms, "p99": ms}}}."""
    out: dict = {}
    for r in rows:
        name = _load_name(r)
        if name is None or r.get("p50_ttft_s") is None:
            continue
        out.setdefault(r["mode"], {})[name] = {"p50": 1e3 * r["p50_ttft_s"], "p99": 1e3 * r["p99_ttft_s"]}
    return out


def open_loop(rows: Sequence[Mapping]) -> dict:
    """{mode: {"<C>": {rate, tok_per_s, closed_tok_per_s, p99_latency_s, closed_p99_latency_s}}} for matched Poisson rows."""
    out: dict = {}
    for r in rows:
        c = r.get("matched_concurrency")
        if c is None:
            continue
        closed = _closed(rows, r["mode"]).get(int(c), {})
        out.setdefault(r["mode"], {})[str(c)] = {
            "rate_per_replica": r["request_rate"], "tok_per_s": r["output_tok_per_s"],
            "closed_tok_per_s": closed.get("output_tok_per_s"), "p99_latency_s": r["p99_latency_s"],
            "closed_p99_latency_s": closed.get("p99_latency_s")}
    return out


def varied_vs_fixed(varied_rows: Sequence[Mapping], fixed_rows: Sequence[Mapping],
                    field: str = "output_tok_per_s", fixed_field: str | None = None) -> dict[str, float | None]:
    """{"<C>": baseline `field` with varied lengths / `fixed_field` (default: the same) with fixed
    lengths} at every C of the fixed-length sweep (h200_fixed_baseline.sh: 64 and 256); None where
    the varied sweep lacks that C (or, for field="steady_tok_per_s", where a sweep predates it)."""
    v, f = _tps(varied_rows, "baseline", field), _tps(fixed_rows, "baseline", fixed_field or field)
    return {str(c): (v[c] / f[c] if c in v and f.get(c) else None) for c in sorted(_tps(fixed_rows, "baseline"))}


def decode_vs_gemm_floor(profile: Mapping) -> dict | None:
    """Plain decode at b=1 with 1024 tokens of context over the GEMM floor, from one profile --floor JSON."""
    fl = profile.get("floor")
    if not isinstance(fl, Mapping) or not fl.get("gemm_floor_ms") or not fl.get("decode_ms"):
        return None
    return {"ratio": fl["decode_ms"] / fl["gemm_floor_ms"], "decode_ms": fl["decode_ms"],
            "gemm_floor_ms": fl["gemm_floor_ms"], "context_len": fl.get("context_len"), "method": fl.get("method")}


def floor_trials(profiles: Sequence[Mapping]) -> dict:
    """Several profile --floor runs (each its decode and its GEMM floor, timed side by side) -> the
    median trial (the lower middle one for an even count, so ratio = its decode_ms / gemm_floor_ms)
    with min..max and every trial: ratios 1.21, 1.20, 1.24 -> ratio 1.21, min 1.20, max 1.24."""
    trials = [dict(decode_vs_gemm_floor(p), command=p.get("command")) for p in profiles]
    ratios = [t["ratio"] for t in trials]
    mid = sorted(trials, key=lambda t: t["ratio"])[(len(trials) - 1) // 2]
    return dict(mid, min=min(ratios), max=max(ratios), trials=trials)


def summarize(regimes: Mapping[str, Mapping], profiles: Mapping[str, Mapping] | None = None,
              peak_bytes_per_s: float | None = None, bandwidth_profile: str | None = None,
              tunes: Mapping[str, Mapping] | None = None, fixed: Mapping[str, Mapping] | None = None,
              varied: Mapping[str, Mapping] | None = None,
              floor_profile: Mapping | Sequence[Mapping] | None = None) -> dict:
    """regimes: {"A": sweep NAME.json doc}; profiles: {"A": profile.json doc}; tunes: {"A": tune.json doc}.
    fixed / varied: {"B": baseline sweep} with fixed / varied lengths (varied defaults to the regime's
    own sweep); floor_profile: the profile --floor JSON that decode_vs_gemm_floor comes from, or
    several (their median: floor_trials; default: the first profile that has a floor).
    The bandwidth figure comes from profiles[bandwidth_profile] (default: the first regime's, else the first)."""
    if not regimes:
        raise DynspecError("no regimes to summarize")
    profiles = profiles or {}
    first = next(iter(regimes))
    ratios = {name: dynamic_ratio_by_concurrency(doc["rows"]) for name, doc in regimes.items()}
    best = max(((r, name, c) for name, rs in ratios.items() for c, r in rs.items()), default=None)
    bw = None
    if peak_bytes_per_s and profiles:
        pname = bandwidth_profile or (first if first in profiles else next(iter(profiles)))
        if pname not in profiles:
            raise DynspecError(f"bandwidth profile {pname!r} is not one of the profiles {sorted(profiles)}")
        bw = decode_bandwidth_fraction(profiles[pname], peak_bytes_per_s)
        if bw is not None:
            bw["profile"] = pname
    commands = []
    for name, doc in profiles.items():
        if doc.get("command"):
            commands.append({"what": f"profile {name}", "command": doc["command"]})
    for name, doc in (tunes or {}).items():
        commands.append({"what": f"tune {name}", "command": doc.get("command"), "schedule": doc.get("schedule")})
    for name, doc in regimes.items():
        commands += [{"what": f"sweep {name}", "command": c} for c in _commands(doc)]
    for what, docs in (("fixed", fixed), ("varied", varied)):
        commands += [{"what": f"{what}-length baseline {name}", "command": c}
                     for name, doc in (docs or {}).items() for c in _commands(doc)]
    floor = None
    if floor_profile is not None:
        many = [floor_profile] if isinstance(floor_profile, Mapping) else list(floor_profile)
        if not many or any(decode_vs_gemm_floor(p) is None for p in many):
            raise DynspecError("--floor-profile has no 'floor' with gemm_floor_ms and decode_ms (run profile --floor)")
        commands += [{"what": "profile --floor", "command": p.get("command")} for p in many]
        floor = dict(floor_trials(many), profile="floor")
    else:                      # the first --profile with a floor
        floor = next((dict(f, profile=n) for n, f in ((n, decode_vs_gemm_floor(p)) for n, p in profiles.items())
                      if f is not None), None)
    for name in fixed or {}:
        if name not in regimes:
            raise DynspecError(f"--fixed-baseline {name}: no --regime {name} to compare it with")
    for name, doc in (varied or {}).items():
        if name not in (fixed or {}):
            raise DynspecError(f"--varied-baseline {name}: no --fixed-baseline {name} to compare it with")
        same_env(doc["env"], fixed[name]["env"], f"--varied-baseline {name} and --fixed-baseline {name}")
    varied_docs = {n: (varied or {}).get(n, regimes[n]) for n in fixed or {}}
    sweep_cmds = [c for doc in regimes.values() for c in _commands(doc)]
    figure_commands = {
        "decode_vs_gemm_floor": ([t["command"] for t in floor["trials"]] if floor and "trials" in floor else
                                 [profiles[floor["profile"]].get("command")] if floor else []),
        "varied_vs_fixed_baseline": [c for n in fixed or {} for c in _commands(varied_docs[n])]
                                    + [c for d in (fixed or {}).values() for c in _commands(d)],
        "trial_spread": sweep_cmds, "ttft_ms": sweep_cmds, "open_loop": sweep_cmds,
        "dynamic_ratio_by_concurrency": sweep_cmds, "c1_speedup": sweep_cmds[:1],
        "decode_bandwidth_fraction": [profiles[bw["profile"]].get("command")] if bw else [],
    }
    vf = vfs = vsf = vfh = None
    if fixed:
        name = next(iter(fixed))
        vf = varied_vs_fixed(varied_docs[name]["rows"], fixed[name]["rows"])
        vfs = varied_vs_fixed(varied_docs[name]["rows"], fixed[name]["rows"], "steady_tok_per_s")
        vsf = varied_vs_fixed(varied_docs[name]["rows"], fixed[name]["rows"], "steady_tok_per_s", "output_tok_per_s")
        vfh = varied_vs_fixed(varied_docs[name]["rows"], fixed[name]["rows"], "sustained_tok_per_s")
    return {
        "version": 2,
        "decode_bandwidth_fraction": None if bw is None else bw["fraction"],
        "decode_bandwidth": bw,
        "dynamic_ratio_by_concurrency": ratios,
        "min_dynamic_ratio": {name: (min(rs.values()) if rs else None) for name, rs in ratios.items()},
        "crossover_concurrency": {name: crossover_concurrency(doc["rows"]) for name, doc in regimes.items()},
        "max_dynamic_gain": None if best is None else best[0],
        "max_dynamic_gain_at": None if best is None else {"regime": best[1], "concurrency": int(best[2])},
        "c1_speedup": c1_speedup(regimes[first]["rows"]),
        "c1_speedup_regime": first,
        "host_overhead_fraction": host_overhead_fraction(regimes[first]["rows"]),
        "acceptance_model": {name: doc["env"].get("acceptance_model") for name, doc in regimes.items()},
        "schedules": {name: doc["env"].get("schedules") for name, doc in regimes.items()},
        "commands": commands,
        "dynamic_verdict_by_concurrency": {name: dynamic_verdicts(doc["rows"]) for name, doc in regimes.items()},
        "trial_spread": {name: trial_spread(doc["rows"]) for name, doc in regimes.items()},
        "ttft_ms": {name: ttft_ms(doc["rows"]) for name, doc in regimes.items()},
        "open_loop": {name: open_loop(doc["rows"]) for name, doc in regimes.items()},
        "decode_vs_gemm_floor": None if floor is None else floor["ratio"],
        "gemm_floor": floor,
        "varied_vs_fixed_baseline": vf,
        "varied_vs_fixed_baseline_steady": vfs,
        "varied_steady_vs_fixed_baseline": vsf,
        "varied_vs_fixed_baseline_sustained": vfh,
        "varied_vs_fixed_regime": None if not fixed else next(iter(fixed)),
        "figure_commands": figure_commands,
    }


# ---- suite figures (benchmarks/suite.py): one config's stage outputs -> figures ------------------
def spread(xs: Sequence[float]) -> dict:
    """[1.02, 0.98, 1.05] -> {"median": 1.02, "min": 0.98, "max": 1.05, "n": 3}."""
    import statistics

    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _trials(row: Mapping) -> list[float]:
    return list(row.get("trial_tok_per_s") or [row["output_tok_per_s"]])


def paired_ratio(top: Mapping, bottoms: Sequence[Mapping]) -> dict:
    """top's tok/s over the best of `bottoms`, trial by trial (trial t of every mode ran in one
    rotation at one load point), with the ratio of the medians beside it:
    dynamic [110, 100, 120], baseline [100, 100, 100], static [90, 105, 95] ->
    per trial 1.10, 0.952, 1.20 -> median 1.10, min 0.952, max 1.20; of_medians 110 / 100 = 1.10."""
    best = max(b["output_tok_per_s"] for b in bottoms)
    out = {"of_medians": top["output_tok_per_s"] / best if best > 0 else None}
    t, bs = _trials(top), [_trials(b) for b in bottoms]
    if all(len(b) == len(t) for b in bs) and all(min(b) > 0 for b in bs):
        out.update(spread([x / max(col) for x, col in zip(t, zip(*bs))]))
    return out


def sweep_figures(doc: Mapping) -> dict:
    """Per closed-loop C: tok/s per mode (median, min, max over trials), static / baseline and
    dynamic / baseline, dynamic / max(baseline, static) with its verdict, acceptance per mode."""
    from dynspec.benchmarks.report import verdict

    modes = {m: _closed(doc["rows"], m) for m in ("baseline", "static", "dynamic")}
    by_c: dict = {}
    for c in sorted({c for rows in modes.values() for c in rows}):
        here = {m: rows[c] for m, rows in modes.items() if c in rows}
        e: dict = {"tok_per_s": {m: dict(spread(_trials(r)), median=r["output_tok_per_s"]) for m, r in here.items()},
                   "acceptance": {m: {k: r.get(k) for k in ("acceptance_rate", "mean_accepted_len", "mean_k")}
                                  for m, r in here.items()}}
        for m in ("static", "dynamic"):
            if m in here and "baseline" in here:
                e[f"{m}_vs_baseline"] = paired_ratio(here[m], [here["baseline"]])
        rivals = [here[m] for m in ("baseline", "static") if m in here]
        if "dynamic" in here and rivals:
            e["dynamic_vs_best"] = paired_ratio(here["dynamic"], rivals)
            e["dynamic_verdict"] = verdict(here["dynamic"], max(rivals, key=lambda r: r["output_tok_per_s"]))
        by_c[str(c)] = e
    return {"by_concurrency": by_c, "crossover_concurrency": crossover_concurrency(doc["rows"]),
            "schedules": doc["env"].get("schedules"), "acceptance_model": doc["env"].get("acceptance_model"),
            "workload": doc["env"].get("workload"), "commands": _commands(doc)}


def _fmt_ratio(r: Mapping | None) -> str:
    if not r:
        return "-"
    if "median" not in r:
        return f"{r['of_medians']:.3f}"
    return f"{r['median']:.3f} [{r['min']:.3f}..{r['max']:.3f}]"


def sweep_table(fig: Mapping) -> dict:
    modes = [m for m in ("baseline", "static", "dynamic")
             if any(m in e["tok_per_s"] for e in fig["by_concurrency"].values())]
    rows = []
    for c, e in fig["by_concurrency"].items():
        tps = [f"{e['tok_per_s'][m]['median']:.1f}" if m in e["tok_per_s"] else "-" for m in modes]
        acc = e["acceptance"].get("dynamic") or e["acceptance"].get("static") or {}
        rows.append([c, *tps, _fmt_ratio(e.get("static_vs_baseline")), _fmt_ratio(e.get("dynamic_vs_baseline")),
                     _fmt_ratio(e.get("dynamic_vs_best")), e.get("dynamic_verdict", "-"),
                     "-" if acc.get("acceptance_rate") is None else f"{acc['acceptance_rate']:.2f}"])
    return {"header": ["C", *[f"{m} tok/s" for m in modes], "static / baseline", "dynamic / baseline",
                       "dynamic / max(baseline, static)", "verdict", "acceptance (dynamic)"], "rows": rows}


def sweep_plot(fig: Mapping) -> dict:
    series: dict = {}
    for c, e in fig["by_concurrency"].items():
        for m, s in e["tok_per_s"].items():
            series.setdefault(m, []).append([int(c), s["median"], s["min"], s["max"]])
    return {"title": "output tok/s per mode (median, min..max of trials)", "x": "concurrency C per replica",
            "y": "output tokens / s", "xlog": True, "series": series}


def floor_figures(profiles: Sequence[Mapping]) -> dict:
    """Several profile --floor runs -> decode_ms, floor_ms and decode / floor, each median, min, max."""
    trials = [decode_vs_gemm_floor(p) for p in profiles]
    if any(t is None for t in trials):
        raise DynspecError("a floor profile has no 'floor' with gemm_floor_ms and decode_ms (profile --floor)")
    fig = {k: spread([t[src] for t in trials]) for k, src in
           (("decode_ms", "decode_ms"), ("floor_ms", "gemm_floor_ms"), ("ratio", "ratio"))}
    fig.update(context_len=trials[0]["context_len"], method=trials[0]["method"],
               median_trial=floor_trials(profiles)["ratio"], commands=[p.get("command") for p in profiles])
    return fig


def floor_table(fig: Mapping) -> dict:
    rows = [[k, f"{fig[k]['median']:.4g}", f"{fig[k]['min']:.4g}", f"{fig[k]['max']:.4g}", fig[k]["n"]]
            for k in ("decode_ms", "floor_ms", "ratio")]
    return {"header": ["figure", "median", "min", "max", "trials"], "rows": rows}


def floor_plot(fig: Mapping) -> dict:
    return {"title": f"b=1 decode at context {fig['context_len']} vs the GEMM floor", "x": "", "y": "ms",
            "bars": {k: [fig[k]["median"], fig[k]["min"], fig[k]["max"]] for k in ("decode_ms", "floor_ms")}}


def mixed_figures(doc: Mapping) -> dict:
    """{"b:K:chunk": {"<mode>": ms}} from every numeric `<mode>_ms` field of each point."""
    pts = {}
    for p in doc["points"]:
        pts[p["point"]] = {k[:-3]: v for k, v in p.items() if k.endswith("_ms") and isinstance(v, (int, float))}
    return {"points": pts, "context_len": doc.get("context_len"), "device": doc.get("device"),
            "statistic": doc.get("statistic"), "command": doc.get("command")}


def mixed_table(fig: Mapping) -> dict:
    modes = sorted({m for v in fig["points"].values() for m in v})
    return {"header": ["point b:K:chunk", *[f"{m} ms" for m in modes]],
            "rows": [[p, *[f"{v[m]:.3f}" if m in v else "-" for m in modes]] for p, v in fig["points"].items()]}


def mixed_plot(fig: Mapping) -> dict:
    return {"title": f"ms per step at context {fig['context_len']}", "x": "", "y": "ms",
            "groups": fig["points"]}


def varied_fixed_figures(varied: Mapping, fixed: Mapping) -> dict:
    """Per C: baseline tok/s with varied / with fixed lengths (ratio of medians), bounded by the
    trials' spreads (varied min / fixed max .. varied max / fixed min; the two runs' trials are not paired)."""
    v, f = _closed(varied["rows"], "baseline"), _closed(fixed["rows"], "baseline")
    out = {}
    for c in sorted(set(v) & set(f)):
        vt, ft = _trials(v[c]), _trials(f[c])
        out[str(c)] = {"ratio": v[c]["output_tok_per_s"] / f[c]["output_tok_per_s"], "low": min(vt) / max(ft),
                       "high": max(vt) / min(ft), "varied_tok_per_s": v[c]["output_tok_per_s"],
                       "fixed_tok_per_s": f[c]["output_tok_per_s"],
                       "sustained_ratio": (v[c]["sustained_tok_per_s"] / f[c]["sustained_tok_per_s"]
                                           if v[c].get("sustained_tok_per_s") and f[c].get("sustained_tok_per_s")
                                           else None)}
    return {"by_concurrency": out, "varied_workload": varied["env"].get("workload"),
            "fixed_workload": fixed["env"].get("workload"), "commands": _commands(varied) + _commands(fixed)}


def varied_fixed_table(fig: Mapping) -> dict:
    return {"header": ["C", "varied tok/s", "fixed tok/s", "varied / fixed", "bounds", "sustained ratio"],
            "rows": [[c, f"{e['varied_tok_per_s']:.1f}", f"{e['fixed_tok_per_s']:.1f}", f"{e['ratio']:.3f}",
                      f"{e['low']:.3f}..{e['high']:.3f}",
                      "-" if e["sustained_ratio"] is None else f"{e['sustained_ratio']:.3f}"]
                     for c, e in fig["by_concurrency"].items()]}


def varied_fixed_plot(fig: Mapping) -> dict:
    return {"title": "baseline tok/s: varied / fixed lengths", "x": "concurrency C", "y": "ratio", "xlog": True,
            "series": {"varied / fixed": [[int(c), e["ratio"], e["low"], e["high"]]
                                          for c, e in fig["by_concurrency"].items()]}}


def tp_figures(tp1: Mapping, tp2: Mapping) -> dict:
    """The same profile at TP=1 and TP=2: iteration ms per (b, K), TP=1 / TP=2 per shape, and the
    b=1 decode / GEMM floor of each (profile --floor)."""
    def it(p):
        return {f"{b}:{k}": ms for b, row in p["iteration_ms"].items() for k, ms in row.items()}

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


def _read(path) -> dict:
    from dynspec.artifacts import read_json

    return read_json(path, "stage output")


def suite_figures(kind: str, results, repeats: Mapping[str, int]) -> dict:
    """A config's figures from its stage outputs in `results` (benchmarks/suite.py writes them):
    {"values": ..., "table": {"header", "rows"}, "plot": {...}} (report.write_suite_report)."""
    from pathlib import Path

    d = Path(results)
    if kind == "sweep":
        fig = sweep_figures(_read(d / "sweep.json"))
        return {"values": fig, "table": sweep_table(fig), "plot": sweep_plot(fig)}
    if kind == "decode_floor":
        n = repeats.get("floor", 1)
        names = ["floor"] if n == 1 else [f"floor{i}" for i in range(1, n + 1)]
        fig = floor_figures([_read(d / f"{x}.json") for x in names])
        return {"values": fig, "table": floor_table(fig), "plot": floor_plot(fig)}
    if kind == "mixed_step":
        fig = mixed_figures(_read(d / "mixed.json"))
        return {"values": fig, "table": mixed_table(fig), "plot": mixed_plot(fig)}
    if kind == "varied_vs_fixed":
        fig = varied_fixed_figures(_read(d / "varied.json"), _read(d / "fixed.json"))
        return {"values": fig, "table": varied_fixed_table(fig), "plot": varied_fixed_plot(fig)}
    if kind == "tp":
        fig = tp_figures(_read(d / "tp1.json"), _read(d / "tp2.json"))
        return {"values": fig, "table": tp_table(fig), "plot": tp_plot(fig)}
    raise DynspecError(f"unknown figures {kind!r}")


def _named(items: Sequence[str], flag: str, many: bool = False) -> dict[str, str | list[str]]:
    """['A=x.json'] -> {'A': 'x.json'}; many: ['A=x', 'A=y'] -> {'A': ['x', 'y']} (a name once otherwise)."""
    out: dict = {}
    for it in items or ():
        name, sep, path = it.partition("=")
        if not sep or not name or not path:
            raise DynspecError(f"{flag} {it!r} is not NAME=PATH (e.g. A=results/h200_A.json)")
        if many:
            out.setdefault(name, []).append(path)
        elif name in out:
            raise DynspecError(f"{flag} {name} is given twice ({out[name]} and {path})")
        else:
            out[name] = path
    return out


# what two sweeps of one regime must share to be joined (the request count and the load points may differ)
SAME_ENV = ("acceptance_model", "device", "dtype", "engine", "engine_source", "keep_warm", "max_seq_len", "seed",
            "trials", "replicas", "cuda_graphs", "versions")
SAME_ENV_IF_RECORDED = ("mixed_graphs", "whole_mixed_graphs", "triton_kernels", "fused_rope")   # sweeps before one was recorded are not refused for it


def same_env(a: Mapping, b: Mapping, what: str) -> None:
    """Refuse two sweep envs that differ in SAME_ENV (or in SAME_ENV_IF_RECORDED where both record
    it), naming `what` and the first key: "... differ in env acceptance_model: 'x' vs 'y'"."""
    for key in SAME_ENV + tuple(k for k in SAME_ENV_IF_RECORDED if k in a and k in b):
        if a.get(key) != b.get(key):
            raise DynspecError(f"{what} differ in env {key}: {a.get(key)!r} vs {b.get(key)!r}")


def _lengths(env: Mapping) -> str:
    """'synthetic: input_len 64:192, ...; max(2, ceil(2 x C)) requests ...' -> the part before ';'."""
    return str(env.get("workload", "")).split(";")[0]


def merge_sweeps(docs: Sequence[Mapping], where: Sequence[str]) -> dict:
    """Several sweeps of one regime (e.g. C=1..64 in one call, C=128 in another) -> one: the rows
    together, each tagged with its "source" file, and the first env with every file's command and
    workload under "sources". Refused, naming both files: a (mode, load) in two files, or envs
    that differ in SAME_ENV, the lengths or the dynamic schedule (so a ratio never mixes regimes).
    [{rows: [baseline C=1]}, {rows: [baseline C=128]}] -> rows of both."""
    seen: dict = {}
    rows = []
    first = docs[0]["env"]
    for doc, path in zip(docs, where):
        env = doc["env"]
        same_env(first, env, f"sweep results {where[0]} and {path}")
        if _lengths(env) != _lengths(first):
            raise DynspecError(f"sweep results {where[0]} and {path} have other workloads: "
                               f"{_lengths(first)!r} vs {_lengths(env)!r}")
        if (env.get("schedules") or {}).get("dynamic") != (first.get("schedules") or {}).get("dynamic"):
            raise DynspecError(f"sweep results {where[0]} and {path} have other dynamic schedules")
        for r in doc["rows"]:
            key = (r.get("mode"), r.get("concurrency"), r.get("request_rate"))
            if key in seen:
                raise DynspecError(f"sweep results {seen[key]} and {path} both have mode {key[0]} at "
                                   f"C={key[1]}" + (f" rate {key[2]}" if key[2] is not None else ""))
            seen[key] = path
            rows.append(dict(r, source=path))
    env = dict(first, commands=[d["env"].get("command") for d in docs],
               sources=[{"file": p, "command": d["env"].get("command"), "workload": d["env"].get("workload"),
                         "max_batch_size": d["env"].get("max_batch_size")} for d, p in zip(docs, where)])
    return {"env": env, "rows": rows}


def _commands(doc: Mapping) -> list:
    return list(doc["env"].get("commands") or [doc["env"].get("command")])


def make_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="python -m dynspec.benchmarks.summary", description=__doc__.splitlines()[0])
    p.add_argument("--regime", action="append", required=True, metavar="NAME=SWEEP.json",
                   help="a regime's sweep; repeat a NAME to join sweeps of other loads (e.g. C=128 from another call)")
    p.add_argument("--open-loop", action="append", metavar="NAME=SWEEP.json",
                   help="join only this sweep's open-loop (--poisson-at) rows to regime NAME (its closed-loop "
                        "rows stay out: a load point the regime's sweeps already ran)")
    p.add_argument("--profile", action="append", metavar="NAME=PROFILE.json")
    p.add_argument("--tune", action="append", metavar="NAME=TUNE.json", help="`dynspec tune --report` output")
    p.add_argument("--fixed-baseline", action="append", metavar="NAME=SWEEP.json",
                   help="a baseline sweep with fixed lengths of regime NAME's means (varied_vs_fixed_baseline); "
                        "repeat a NAME to join sweeps of other loads")
    p.add_argument("--varied-baseline", action="append", metavar="NAME=SWEEP.json",
                   help="the baseline sweep with regime NAME's varied lengths at the fixed one's loads "
                        "(default: the regime's own sweep); repeat a NAME to join sweeps of other loads")
    p.add_argument("--floor-profile", metavar="PROFILE.json", action="append",
                   help="a profile --floor JSON for decode_vs_gemm_floor; repeat for the median of several "
                        "(default: the first --profile with one)")
    p.add_argument("--bandwidth-profile", metavar="NAME", help="which --profile gives decode_bandwidth_fraction")
    p.add_argument("--peak-bandwidth-tbps", type=float, help="device memory bandwidth, e.g. 4.8 for an H200")
    p.add_argument("--out", required=True, help="summary JSON path")
    return p


def run(args: argparse.Namespace) -> int:
    from dynspec.artifacts import read_json, write_json

    def sweeps(items, flag: str, what: str, open_loop=None) -> dict:
        """{NAME: one sweep}, a NAME's several files joined (merge_sweeps); open_loop {NAME: [files]}
        adds only those files' open-loop rows."""
        out = {}
        extra = _named(open_loop, "--open-loop", many=True)
        named = _named(items, flag, many=True)
        for n in extra:
            if n not in named:
                raise DynspecError(f"--open-loop {n}: no {flag} {n} to join it to")
        for n, paths in named.items():
            docs = [read_json(p, f"{what} {n}") for p in paths]
            for p in extra.get(n, ()):
                doc = read_json(p, f"open-loop sweep {n}")
                rows = [r for r in doc.get("rows", ()) if r.get("request_rate") is not None]
                if not rows:
                    raise DynspecError(f"--open-loop {n} ({p}): no open-loop rows (sweep --poisson-at)")
                docs.append(dict(doc, rows=rows))
            paths = list(paths) + list(extra.get(n, ()))
            for doc, path in zip(docs, paths):
                if "rows" not in doc or "env" not in doc:
                    raise DynspecError(f"{what} {n} ({path}): missing 'env' or 'rows'")
            out[n] = docs[0] if len(docs) == 1 else merge_sweeps(docs, paths)
        return out

    regimes = sweeps(args.regime, "--regime", "sweep result", args.open_loop)
    profiles = {n: read_json(p, f"profile {n}") for n, p in _named(args.profile, "--profile").items()}
    tunes = {n: read_json(p, f"tune report {n}") for n, p in _named(args.tune, "--tune").items()}
    fixed = sweeps(args.fixed_baseline, "--fixed-baseline", "fixed-length sweep")
    varied = sweeps(args.varied_baseline, "--varied-baseline", "varied-length sweep")
    floor = [read_json(p, "floor profile") for p in args.floor_profile] if args.floor_profile else None
    for path, doc in zip(args.floor_profile or (), floor or ()):
        if decode_vs_gemm_floor(doc) is None:
            raise DynspecError(f"--floor-profile {path}: no 'floor' with gemm_floor_ms and decode_ms "
                               f"(run profile --floor)")
    peak = args.peak_bandwidth_tbps * 1e12 if args.peak_bandwidth_tbps else None
    doc = summarize(regimes, profiles, peak, args.bandwidth_profile, tunes, fixed, varied, floor)
    cmd = getattr(args, "command_line", None) or "python -m dynspec.benchmarks.summary " + shlex.join(sys.argv[1:])
    doc["commands"].append({"what": "summary", "command": cmd})
    write_json(args.out, doc)
    import json

    print(json.dumps({k: doc[k] for k in ("decode_bandwidth_fraction", "crossover_concurrency", "max_dynamic_gain",
                                          "c1_speedup", "host_overhead_fraction", "min_dynamic_ratio",
                                          "dynamic_verdict_by_concurrency", "decode_vs_gemm_floor",
                                          "varied_vs_fixed_baseline")}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return run(args)
    except DynspecError as e:
        print(f"dynspec summary: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
