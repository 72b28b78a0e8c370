"""Figures from benchmark outputs (sweep, profile --floor, mixed_step JSON). Pure functions.

benchmarks/suite.py calls suite_figures(kind, results_dir, repeats) after a config's stages:
    sweep            per C: tok/s per mode (median, min, max over trials), static / baseline,
                     dynamic / baseline and dynamic / max(baseline, static) (per-trial ratios:
                     median, min, max; and the ratio of the medians), the verdict, acceptance
    decode_floor     decode_ms, floor_ms and decode / floor (profile --floor), median, min, max over runs
    mixed_step       ms per execution mode per point b:K:chunk
    varied_vs_fixed  per C: baseline tok/s with varied / with fixed lengths, with bounds from the spreads
    tp               iteration ms per (b, K) at TP=1 and TP=2, their ratio, each one's decode / floor
    adaptive         per sweep stage (sweep, sweep_*) and C: adaptive / baseline, / best of every static K and
                     dynamic, / dynamic (per-trial median, min, max), the policy's host cost per step,
                     settle iterations after a shift
    cost_model       the installed profile's iteration ms per (context, b, K)
    overlap          the serial executor loop beside the overlapped one: baseline engine idle share and
                     varied / fixed per C, regime B dynamic / max(baseline, static) per loop, the b=1
                     step over its graphs alone and over the GEMM floor per loop
Each kind also gives a table (summary.md) and a plot spec (summary.png), benchmarks/report.py.
"""
from __future__ import annotations

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


def _closed(rows: Sequence[Mapping], mode: str) -> dict[int, Mapping]:
    return {int(r["concurrency"]): r for r in rows if r["mode"] == mode and r.get("concurrency") is not None}


def varied_vs_fixed(varied_rows: Sequence[Mapping], fixed_rows: Sequence[Mapping],
                    field: str = "output_tok_per_s", fixed_field: str | None = None) -> dict[str, float | None]:
    """{"<C>": baseline `field` with varied lengths / `fixed_field` (default: the same) with fixed
    lengths} at every C of the fixed-length sweep; None where the varied sweep lacks that C or the
    field: varied 90 / fixed 100 tok/s at C=64 -> {"64": 0.9}."""
    v, f = _tps(varied_rows, "baseline", field), _tps(fixed_rows, "baseline", fixed_field or field)
    return {str(c): (v[c] / f[c] if c in v and f.get(c) else None) for c in sorted(_tps(fixed_rows, "baseline"))}


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


OVERLAP = "+overlap"        # a sweep mode's loop suffix (benchmarks/sweep.py): 'dynamic+overlap'
SWEEP_MODES = ("baseline", "static", "dynamic")


def loop_ratios(here: Mapping[str, Mapping], suffix: str = "") -> dict:
    """The ratios of one executor loop at one C, its modes named with `suffix` ('' serial,
    '+overlap'): static / baseline, dynamic / baseline, dynamic / max(baseline, static) and its
    verdict, each mode against its own loop's rivals (dynamic+overlap / baseline+overlap, ...)."""
    from dynspec.benchmarks.report import verdict

    base, stat, dyn = (here.get(m + suffix) for m in SWEEP_MODES)
    e: dict = {}
    for name, r in (("static", stat), ("dynamic", dyn)):
        if r is not None and base is not None:
            e[f"{name}_vs_baseline"] = paired_ratio(r, [base])
    rivals = [r for r in (base, stat) if r is not None]
    if dyn is not None and rivals:
        e["dynamic_vs_best"] = paired_ratio(dyn, rivals)
        e["dynamic_verdict"] = verdict(dyn, max(rivals, key=lambda r: r["output_tok_per_s"]))
    return e


def sweep_figures(doc: Mapping) -> dict:
    """Per closed-loop C: tok/s per mode (median, min, max over trials), static / baseline and
    dynamic / baseline, dynamic / max(baseline, static) with its verdict, acceptance per mode.
    Modes of the overlapped loop ('baseline+overlap', ...) get the same ratios among themselves
    under "overlap", each one over its serial twin under "overlap_vs_serial", and (then) every mode
    its engine_idle_fraction under "idle"."""
    names = SWEEP_MODES + tuple(m + OVERLAP for m in SWEEP_MODES)
    modes = {m: _closed(doc["rows"], m) for m in names}
    by_c: dict = {}
    for c in sorted({c for rows in modes.values() for c in rows}):
        here = {m: rows[c] for m, rows in modes.items() if c in rows}
        e: dict = {"tok_per_s": {m: dict(spread(_trials(r)), median=r["output_tok_per_s"]) for m, r in here.items()},
                   "acceptance": {m: {k: r.get(k) for k in ("acceptance_rate", "mean_accepted_len", "mean_k")}
                                  for m, r in here.items()}}
        e.update(loop_ratios(here))
        if any(m.endswith(OVERLAP) for m in here):
            e["idle"] = {m: r.get("engine_idle_fraction") for m, r in here.items()}
            e["overlap"] = loop_ratios(here, OVERLAP)
            e["overlap_vs_serial"] = {m: paired_ratio(here[m + OVERLAP], [here[m]]) for m in SWEEP_MODES
                                      if m in here and m + OVERLAP in here}
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
    """One row per C; with overlapped modes, the overlapped loop's ratios (among its own modes)
    and each mode's engine idle share follow the serial ones."""
    names = SWEEP_MODES + tuple(m + OVERLAP for m in SWEEP_MODES)
    modes = [m for m in names if any(m in e["tok_per_s"] for e in fig["by_concurrency"].values())]
    over = any("overlap" in e for e in fig["by_concurrency"].values())
    ratio_keys = ("static_vs_baseline", "dynamic_vs_baseline", "dynamic_vs_best")
    rows = []
    for c, e in fig["by_concurrency"].items():
        tps = [f"{e['tok_per_s'][m]['median']:.1f}" if m in e["tok_per_s"] else "-" for m in modes]
        acc = e["acceptance"].get("dynamic") or e["acceptance"].get("static") or {}
        row = [c, *tps, *[_fmt_ratio(e.get(k)) for k in ratio_keys], e.get("dynamic_verdict", "-"),
               "-" if acc.get("acceptance_rate") is None else f"{acc['acceptance_rate']:.2f}"]
        if over:
            o = e.get("overlap") or {}
            idle = e.get("idle") or {}
            row += [*[_fmt_ratio(o.get(k)) for k in ratio_keys], o.get("dynamic_verdict", "-"),
                    *["-" if idle.get(m) is None else f"{100 * idle[m]:.1f}%" for m in modes]]
        rows.append(row)
    header = ["C", *[f"{m} tok/s" for m in modes], "static / baseline", "dynamic / baseline",
              "dynamic / max(baseline, static)", "verdict", "acceptance (dynamic)"]
    if over:
        header += ["overlap: static / baseline", "overlap: dynamic / baseline",
                   "overlap: dynamic / max(baseline, static)", "overlap: verdict", *[f"{m} idle" for m in modes]]
    notes = ["tok/s: the median trial. A ratio `m [lo..hi]` is the median, min and max of the per-trial"
             " ratios (trial t of every mode ran in one rotation at one load point); a bare ratio is of the"
             " medians. Verdict: tie when the trials' min..max spreads overlap."]
    if over:
        notes.append("overlap: the modes of the overlapped executor loop (+overlap) against each other"
                     " (dynamic+overlap / max(baseline+overlap, static+overlap)); idle: engine_idle_fraction,"
                     " the share of the run's wall time outside the engine's steps (overlapped: their device time).")
    return {"header": header, "rows": rows, "notes": notes}


def sweep_plot(fig: Mapping) -> dict:
    series: dict = {}
    for c, e in fig["by_concurrency"].items():
        for m, s in e["tok_per_s"].items():
            series.setdefault(m, []).append([int(c), s["median"], s["min"], s["max"]])
    return {"title": "output tok/s per mode (median, min..max of trials)", "x": "concurrency C per replica",
            "y": "output tokens / s", "xlog": True, "series": series}


# floor figures beside decode_ms / floor_ms / ratio, each run's num / den (den None: num itself):
# the graphs replayed alone, the step served by the overlapped loop (profile.overlap_decode_ms)
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


def varied_fixed_figures(varied: Mapping, fixed: Mapping, mode: str = "baseline") -> dict:
    """Per C: `mode`'s tok/s with varied / with fixed lengths (ratio of medians), bounded by the
    trials' spreads (varied min / fixed max .. varied max / fixed min; the two runs' trials are not
    paired). With the serial baseline, a baseline+overlap in both runs gets the same under "overlap".
    engine_ratio: the same ratio on the steps' time alone (tokens / (iterations x mean step)): equal
    to the ratio when the host adds nothing; decode_rows: (varied, fixed) mean decode rows a step;
    iterations: (varied, fixed) each as [run, the workload's minimum] (sweep.closed_loop_floor), and
    floor_rows_ratio: tokens an iteration at those minima, varied / fixed (the ratio if every step
    cost the same). Example: 49586 tokens in 917 steps of 7.10 ms against 49152 in 773 of 7.32 ->
    engine ratio (49586 / 6.511) / (49152 / 5.658) = 0.877; minima 917 and 773 -> floor rows ratio
    (49586 / 917) / (49152 / 773) = 0.850."""
    from dynspec.benchmarks.sweep import closed_loop_floor

    v, f = _closed(varied["rows"], mode), _closed(fixed["rows"], mode)
    out = {}
    for c in sorted(set(v) & set(f)):
        vt, ft = _trials(v[c]), _trials(f[c])
        its = [[v[c].get("iterations"), closed_loop_floor(varied["env"], v[c])],
               [f[c].get("iterations"), closed_loop_floor(fixed["env"], f[c])]]
        floors = [its[0][1], its[1][1]]
        out[str(c)] = {"ratio": v[c]["output_tok_per_s"] / f[c]["output_tok_per_s"], "low": min(vt) / max(ft),
                       "high": max(vt) / min(ft), "varied_tok_per_s": v[c]["output_tok_per_s"],
                       "fixed_tok_per_s": f[c]["output_tok_per_s"],
                       "sustained_ratio": (v[c]["sustained_tok_per_s"] / f[c]["sustained_tok_per_s"]
                                           if v[c].get("sustained_tok_per_s") and f[c].get("sustained_tok_per_s")
                                           else None),
                       "engine_ratio": _ratio(_per_engine_second(v[c]), _per_engine_second(f[c])),
                       "decode_rows": [v[c].get("mean_decode_rows"), f[c].get("mean_decode_rows")],
                       "iterations": its,
                       "floor_rows_ratio": _ratio(_per(v[c].get("output_tokens"), floors[0]),
                                                  _per(f[c].get("output_tokens"), floors[1]))}
    fig = {"by_concurrency": out, "varied_workload": varied["env"].get("workload"),
           "fixed_workload": fixed["env"].get("workload"), "commands": _commands(varied) + _commands(fixed)}
    over = mode + OVERLAP
    if not mode.endswith(OVERLAP) and _closed(varied["rows"], over) and _closed(fixed["rows"], over):
        fig["overlap"] = varied_fixed_figures(varied, fixed, over)["by_concurrency"]
    return fig


def _per_engine_second(row: Mapping) -> float | None:
    """A sweep row's output tokens over its steps' time (iterations x mean_step_ms); None where the
    row does not report them."""
    if not (row.get("output_tokens") and row.get("iterations") and row.get("mean_step_ms")):
        return None
    return row["output_tokens"] / (row["iterations"] * row["mean_step_ms"] / 1e3)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _per(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def _fmt_iterations(its: Sequence | None) -> str:
    """[[912, 912], [768, 768]] -> '912 / 912, 768 / 768' (run / minimum: varied, fixed)."""
    side = lambda x: "-" if not x or None in x else f"{x[0]} / {x[1]}"
    return "-" if not its or all(None in x for x in its) else f"{side(its[0])}, {side(its[1])}"


def _loops(fig: Mapping) -> dict:
    """{"serial": by C, "overlap": by C (when the runs had baseline+overlap)} of varied_fixed_figures."""
    return {"serial": fig["by_concurrency"], **({"overlap": fig["overlap"]} if fig.get("overlap") else {})}


def varied_fixed_table(fig: Mapping) -> dict:
    opt = lambda x: "-" if x is None else f"{x:.3f}"
    return {"header": ["loop", "C", "varied tok/s", "fixed tok/s", "varied / fixed", "bounds", "sustained ratio",
                       "on the steps' time", "iterations / minimum (varied, fixed)", "tokens a step at the minima"],
            "rows": [[loop, c, f"{e['varied_tok_per_s']:.1f}", f"{e['fixed_tok_per_s']:.1f}", f"{e['ratio']:.3f}",
                      f"{e['low']:.3f}..{e['high']:.3f}", opt(e["sustained_ratio"]), opt(e.get("engine_ratio")),
                      _fmt_iterations(e.get("iterations")), opt(e.get("floor_rows_ratio"))]
                     for loop, by_c in _loops(fig).items() for c, e in by_c.items()],
            "notes": ["Minimum: the fewest iterations the closed loop allows at one token a row an iteration, no"
                      " token budget (benchmarks/workload.py closed_loop_iterations); tokens a step at the minima:"
                      " varied / fixed, the ratio if every step cost the same."]}


def varied_fixed_plot(fig: Mapping) -> dict:
    return {"title": "baseline tok/s: varied / fixed lengths", "x": "concurrency C", "y": "ratio", "xlog": True,
            "series": {("varied / fixed" if loop == "serial" else f"varied / fixed ({loop})"):
                       [[int(c), e["ratio"], e["low"], e["high"]] for c, e in by_c.items()]
                       for loop, by_c in _loops(fig).items()}}


def tp_figures(tp1: Mapping, tp2: Mapping) -> dict:
    """The same profile at TP=1 and TP=2: iteration ms per (b, K), TP=1 / TP=2 per shape, and the
    b=1 decode / GEMM floor of each (profile --floor)."""
    from dynspec.runtime.cost_model import Profile

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


# ---- adaptive configs: the adaptive mode against every other mode of a sweep -----------
SETTLE_TOLERANCE = 0.05


def _steps(row: Mapping) -> tuple[list[str], list[list[list]]]:
    """The adaptive row's (fields, trials [replica [iteration record]])."""
    st = row.get("adaptive_steps") or {}
    return list(st.get("fields") or ()), list(st.get("trials") or ())


def host_cost(row: Mapping) -> dict | None:
    """median policy_us / median step_us over every adaptive iteration of the row's trials and
    replicas: policy 20, 30, 25 us and steps 10000, 12000, 11000 us -> 25 / 11000 = 0.00227; the
    same of policy_exposed_us (the part no launched step ran under; runtime/executor.py) where
    recorded: exposed 10, 12, 11 us -> 11 / 11000 = 0.001."""
    import statistics

    fields, trials = _steps(row)
    if "policy_us" not in fields or "step_us" not in fields:
        return None
    its = [it for trial in trials for rep in trial for it in rep]
    pol = [it[fields.index("policy_us")] for it in its]
    step = [it[fields.index("step_us")] for it in its]
    if not its or statistics.median(step) <= 0:
        return None
    out = {"fraction": statistics.median(pol) / statistics.median(step), "policy_us": statistics.median(pol),
           "step_us": statistics.median(step), "iterations": len(its)}
    if "policy_exposed_us" in fields:
        exp = statistics.median(it[fields.index("policy_exposed_us")] for it in its)
        out.update(exposed_fraction=exp / statistics.median(step), policy_exposed_us=exp)
    return out


def settle_iterations(its: Sequence[Sequence], fields: Sequence[str], key: int, rate: float,
                      tol: float = SETTLE_TOLERANCE) -> int | None:
    """Iterations from the first whose oldest decode row has key >= `key` until the position-1
    estimate stays (to the run's end) within `tol` of `rate`; None when no iteration reaches the
    key or the estimate never stays. Keys (3, 5, 6, 7, 8), estimates (.8, .5, .3, .22, .21),
    key 5, rate 0.2 -> start at the 2nd, stays from the 4th -> 2."""
    ok, ak = fields.index("oldest_key"), fields.index("acceptance1")
    start = next((i for i, it in enumerate(its) if it[ok] is not None and it[ok] >= key), None)
    if start is None:
        return None
    j = len(its)
    while j > start and its[j - 1][ak] is not None and abs(its[j - 1][ak] - rate) <= tol:
        j -= 1
    return None if j == len(its) else j - start


def settle(row: Mapping) -> dict | None:
    """settle_iterations of every trial and replica of a shifted adaptive row: their spread, how
    many runs settled and how many did not; None without a shift."""
    sh = row.get("shift")
    fields, trials = _steps(row)
    if not sh or "oldest_key" not in fields:
        return None
    got = [settle_iterations(rep, fields, sh["key"], sh["after"]) for trial in trials for rep in trial]
    done = [x for x in got if x is not None]
    out = {"shift_key": sh["key"], "before": sh["before"], "after": sh["after"], "tolerance": SETTLE_TOLERANCE,
           "runs": len(got), "unsettled": len(got) - len(done)}
    if done:
        out.update(spread(done))
    return out


def _k_hist(row: Mapping) -> dict:
    from collections import Counter

    fields, trials = _steps(row)
    if "k" not in fields:
        return {}
    c = Counter(it[fields.index("k")] for trial in trials for rep in trial for it in rep)
    return {str(k): c[k] for k in sorted(c)}


def _probes(row: Mapping) -> float | None:
    fields, trials = _steps(row)
    its = [it for trial in trials for rep in trial for it in rep]
    return sum(it[fields.index("probe")] for it in its) / len(its) if its and "probe" in fields else None


def adaptive_sweep(doc: Mapping) -> dict:
    """One sweep with an adaptive mode -> per C: tok/s per mode, adaptive / baseline, adaptive /
    best of (every static:K, static and dynamic present), adaptive / dynamic (paired_ratio: per-trial
    median [min..max]), the policy's host cost per step, its K histogram and probe share, and the
    settle iterations under a shift."""
    modes = list(dict.fromkeys(r["mode"] for r in doc["rows"]))
    rows = {m: _closed(doc["rows"], m) for m in modes}
    rivals = [m for m in modes if m == "dynamic" or m == "static" or m.startswith("static:")]
    by_c: dict = {}
    for c in sorted(rows.get("adaptive", {})):
        here = {m: rows[m][c] for m in modes if c in rows[m]}
        ad = here["adaptive"]
        e: dict = {"tok_per_s": {m: dict(spread(_trials(r)), median=r["output_tok_per_s"]) for m, r in here.items()},
                   "mean_k": {m: r.get("mean_k") for m, r in here.items()},
                   "acceptance_rate": ad.get("acceptance_rate")}
        if "baseline" in here:
            e["adaptive_vs_baseline"] = paired_ratio(ad, [here["baseline"]])
        best = [here[m] for m in rivals if m in here]
        if best:
            e["adaptive_vs_best"] = paired_ratio(ad, best)
            e["best_rival"] = max((m for m in rivals if m in here), key=lambda m: here[m]["output_tok_per_s"])
        if "dynamic" in here:
            e["adaptive_vs_dynamic"] = paired_ratio(ad, [here["dynamic"]])
        e.update(host_cost=host_cost(ad), settle=settle(ad), k_hist=_k_hist(ad), probe_fraction=_probes(ad))
        by_c[str(c)] = e
    costs = [e["host_cost"]["fraction"] for e in by_c.values() if e["host_cost"]]
    return {"by_concurrency": by_c, "modes": modes, "host_cost_max": max(costs) if costs else None,
            "schedules": doc["env"].get("schedules"), "acceptance_model": doc["env"].get("acceptance_model"),
            "workload": doc["env"].get("workload"), "commands": _commands(doc)}


def adaptive_figures(docs: Mapping[str, Mapping]) -> dict:
    """{stage name: adaptive_sweep} of every sweep stage of an adaptive config."""
    return {"sweeps": {name: adaptive_sweep(doc) for name, doc in docs.items()}}


def adaptive_table(fig: Mapping) -> dict:
    rows = []
    for name, sw in fig["sweeps"].items():
        for c, e in sw["by_concurrency"].items():
            st = e.get("settle") or {}
            rows.append([name, sw["acceptance_model"], c, f"{e['tok_per_s']['adaptive']['median']:.1f}",
                         _fmt_ratio(e.get("adaptive_vs_baseline")),
                         _fmt_ratio(e.get("adaptive_vs_best")) + (f" ({e['best_rival']})" if e.get("best_rival") else ""),
                         _fmt_ratio(e.get("adaptive_vs_dynamic")),
                         _fmt_host_cost(e.get("host_cost")),
                         "-" if "median" not in st else f"{st['median']:g} [{st['min']:g}..{st['max']:g}]"
                         + (f", {st['unsettled']} unsettled" if st.get("unsettled") else "")])
    return {"header": ["sweep", "acceptance", "C", "adaptive tok/s", "adaptive / baseline",
                       "adaptive / best of static K and dynamic", "adaptive / dynamic", "policy host cost per step",
                       "settle iterations after the shift"], "rows": rows,
            "notes": ["Ratios: median [min..max] of the per-trial ratios (trial t of every mode ran in one rotation at"
                      " one load point); the best rival is the one with the highest median tok/s. Host cost: median"
                      " policy time / median step time over the adaptive iterations: the part with no step running on the"
                      " device (the decision; serial loop on CUDA: the estimate update runs after the next launch),"
                      " then in brackets all of it. Settle: iterations from the"
                      f" first whose oldest decode row is past the shift until the position-1 estimate stays within"
                      f" {SETTLE_TOLERANCE} of the new rate, over trials."]}


def _fmt_host_cost(h: Mapping | None) -> str:
    """0.0045 exposed of 0.012 -> "0.45% (1.20%)"; without the exposed part "1.20%"."""
    if not h:
        return "-"
    if "exposed_fraction" not in h:
        return f"{100 * h['fraction']:.2f}%"
    return f"{100 * h['exposed_fraction']:.2f}% ({100 * h['fraction']:.2f}%)"


def adaptive_plot(fig: Mapping) -> dict:
    series: dict = {}
    for name, sw in fig["sweeps"].items():
        for c, e in sw["by_concurrency"].items():
            for what in ("adaptive_vs_baseline", "adaptive_vs_best"):
                r = e.get(what)
                if r and "median" in r:
                    label = f"{name} {sw['acceptance_model']}: {what.replace('_vs_', ' / ')}"
                    series.setdefault(label, []).append([int(c), r["median"], r["min"], r["max"]])
    return {"title": "adaptive / baseline and / best of static K and dynamic (per-trial median, min..max)",
            "x": "concurrency C per replica", "y": "ratio", "xlog": True, "series": series}


def cost_model_figures(profile: Mapping, path) -> dict:
    """The installed cost model: iteration ms at every profiled (context, b, K), read by the one
    reader of the format (runtime/cost_model.py CostModel)."""
    from dynspec.runtime.cost_model import CostModel

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


def overlap_figures(varied: Mapping, fixed: Mapping, regime: Mapping, floors: Sequence[Mapping]) -> dict:
    """benchmarks/configs/overlap.toml's figures, each {"serial": ..., "overlap": ...} per C:
    idle       baseline's engine_idle_fraction at varied lengths (0.083 = 8.3% of wall time)
    varied_vs_fixed  baseline varied / fixed (varied_fixed_figures, its bounds)
    regime_b   dynamic / max(baseline, static), each loop's modes against its own rivals
    floor      b=1 plain decode: the step / its graphs alone, the step / the GEMM floor (per run)."""
    v, rb = sweep_figures(varied)["by_concurrency"], sweep_figures(regime)["by_concurrency"]
    idle = {c: {"serial": e["idle"].get("baseline"), "overlap": e["idle"].get("baseline" + OVERLAP)}
            for c, e in v.items() if "idle" in e}
    loops = _loops(varied_fixed_figures(varied, fixed))
    vf = {c: {loop: by_c.get(c) for loop, by_c in loops.items()} for c in loops["serial"]}
    regime_b = {c: {"serial": e.get("dynamic_vs_best"), "overlap": (e.get("overlap") or {}).get("dynamic_vs_best"),
                    "verdicts": [e.get("dynamic_verdict"), (e.get("overlap") or {}).get("dynamic_verdict")]}
                for c, e in rb.items()}
    fl = floor_figures(floors)
    trials = [decode_vs_gemm_floor(p) for p in floors]
    floor = {"step_vs_graphs": {"serial": spread([t["decode_ms"] / t["decode_graph_ms"] for t in trials])
                                if all(t.get("decode_graph_ms") for t in trials) else None,
                                "overlap": fl.get("overlap_vs_graph")},
             "step_vs_floor": {"serial": fl["ratio"], "overlap": fl.get("overlap_ratio")},
             "step_ms": {"serial": fl["decode_ms"], "overlap": fl.get("overlap_ms")}}
    out = {"idle": idle, "varied_vs_fixed": vf, "regime_b": regime_b, "floor": floor, "floor_figures": fl,
           "commands": _commands(varied) + _commands(fixed) + _commands(regime) + fl["commands"]}
    rows = {(r["mode"], r["concurrency"]): r for r in varied["rows"] if r.get("gpu_gap_fraction") is not None}
    if rows:            # sweeps that record the device's own gaps between steps (metrics.gpu_gaps)
        out["gaps"] = {c: {loop: {k: rows[(m, int(c))][k] for k in ("gpu_gap_fraction", "gpu_gap_mixed_share",
                                                                     "gc_pause_fraction") if k in rows[(m, int(c))]}
                           for loop, m in (("serial", "baseline"), ("overlap", "baseline" + OVERLAP))
                           if (m, int(c)) in rows} for c in idle}
    return out


def overlap_table(fig: Mapping) -> dict:
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"
    vf = lambda e: "-" if not e else f"{e['ratio']:.3f} [{e['low']:.3f}..{e['high']:.3f}]"
    rows = [["baseline engine idle, varied lengths", c, pct(e["serial"]), pct(e["overlap"]), "overlap <= 2%"]
            for c, e in fig["idle"].items()]
    gap = lambda e: "-" if not e else pct(e["gpu_gap_fraction"]) + (
        "" if e["gpu_gap_mixed_share"] is None else f" ({100 * e['gpu_gap_mixed_share']:.0f}% before mixed)")
    rows += [["  of it, device gaps between steps", c, gap(e.get("serial")), gap(e.get("overlap")), "-"]
             for c, e in fig.get("gaps", {}).items()]
    gc_share = lambda e: "-" if not e or e.get("gc_pause_fraction") is None else pct(e["gc_pause_fraction"])
    rows += [["  the collector's pauses (wall time)", c, gc_share(e.get("serial")), gc_share(e.get("overlap")), "-"]
             for c, e in fig.get("gaps", {}).items() if any((e.get(loop) or {}).get("gc_pause_fraction") is not None
                                                            for loop in ("serial", "overlap"))]
    rows += [["baseline varied / fixed, 6 waves", c, vf(e.get("serial")), vf(e.get("overlap")), ">= 0.90"]
             for c, e in fig["varied_vs_fixed"].items()]
    eng = lambda e: "-" if not e or e.get("engine_ratio") is None else f"{e['engine_ratio']:.3f}"
    rows += [["  the same on the steps' time alone", c, eng(e.get("serial")), eng(e.get("overlap")), "-"]
             for c, e in fig["varied_vs_fixed"].items()]
    dr = lambda e: "-" if not e or None in e.get("decode_rows", [None]) else "{:.1f} / {:.1f}".format(*e["decode_rows"])
    rows += [["  mean decode rows a step, varied / fixed", c, dr(e.get("serial")), dr(e.get("overlap")), "-"]
             for c, e in fig["varied_vs_fixed"].items()]
    its = lambda e: "-" if not e else _fmt_iterations(e.get("iterations"))
    rows += [["  iterations / the workload's minimum (varied, fixed)", c, its(e.get("serial")), its(e.get("overlap")),
              "-"] for c, e in fig["varied_vs_fixed"].items()]
    fr = lambda e: "-" if not e or e.get("floor_rows_ratio") is None else f"{e['floor_rows_ratio']:.3f}"
    rows += [["  tokens a step at those minima, varied / fixed", c, fr(e.get("serial")), fr(e.get("overlap")), "-"]
             for c, e in fig["varied_vs_fixed"].items()]
    rows += [["regime B dynamic / max(baseline, static)", c, _fmt_ratio(e["serial"]), _fmt_ratio(e["overlap"]),
              "overlap >= serial"] for c, e in fig["regime_b"].items()]
    f = fig["floor"]
    rows += [["b=1 decode step ms", 1, _fmt_ratio(f["step_ms"]["serial"]), _fmt_ratio(f["step_ms"]["overlap"]), "-"],
             ["b=1 decode step / its graphs alone", 1, _fmt_ratio(f["step_vs_graphs"]["serial"]),
              _fmt_ratio(f["step_vs_graphs"]["overlap"]), "overlap <= 1.03"],
             ["b=1 decode step / GEMM floor", 1, _fmt_ratio(f["step_vs_floor"]["serial"]),
              _fmt_ratio(f["step_vs_floor"]["overlap"]), "overlap <= 1.16"]]
    return {"header": ["figure", "C", "serial loop", "overlapped loop", "target"], "rows": rows,
            "notes": ["Ratios: median [min..max] over trials (sweeps: per-trial ratios, trial t of every mode in one"
                      " rotation; varied / fixed: of the medians, bounded by the two runs' spreads; b=1: over the"
                      " three profile runs). Idle: engine_idle_fraction, the share of wall time outside the"
                      " engine's steps (overlapped: outside their device time). Minimum: the fewest iterations"
                      " the closed loop allows at one token a row an iteration, no token budget"
                      " (benchmarks/workload.py closed_loop_iterations)."]}


def overlap_plot(fig: Mapping) -> dict:
    groups = {f"varied/fixed C={c}": {loop: e["ratio"] for loop, e in by.items() if e}
              for c, by in fig["varied_vs_fixed"].items()}
    groups.update({f"regime B dyn/best C={c}": {loop: e[loop]["median"] if "median" in e[loop] else e[loop]["of_medians"]
                                                for loop in ("serial", "overlap") if e.get(loop)}
                   for c, e in fig["regime_b"].items()})
    groups.update({f"b=1 {what.replace('_vs_', '/')}": {loop: v["median"] if isinstance(v, Mapping) else v
                                                         for loop, v in fig["floor"][what].items() if v}
                   for what in ("step_vs_graphs", "step_vs_floor")})
    groups.update({f"idle C={c}": {loop: v for loop, v in e.items() if v is not None} for c, e in fig["idle"].items()})
    return {"title": "serial vs overlapped executor loop", "x": "", "y": "ratio (idle: share of wall time)",
            "groups": groups}


def _floor_names(repeats: Mapping[str, int]) -> list[str]:
    """The floor stage's outputs: 'floor', or 'floor1'..'floorN' when it repeats N > 1 times."""
    n = repeats.get("floor", 1)
    return ["floor"] if n == 1 else [f"floor{i}" for i in range(1, n + 1)]


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
        names = _floor_names(repeats)
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
    if kind == "adaptive":
        from dynspec.benchmarks.suite import sweep_stage_names

        fig = adaptive_figures({n: _read(d / f"{n}.json") for n in sweep_stage_names(repeats)})
        return {"values": fig, "table": adaptive_table(fig), "plot": adaptive_plot(fig)}
    if kind == "cost_model":
        fig = cost_model_figures(_read(d / "profile.json"), d / "profile.json")
        return {"values": fig, "table": cost_model_table(fig), "plot": cost_model_plot(fig)}
    if kind == "overlap":
        names = _floor_names(repeats)
        fig = overlap_figures(*(_read(d / f"sweep_{c}.json") for c in ("varied", "fixed", "regime_b")),
                              [_read(d / f"{x}.json") for x in names])
        return {"values": fig, "table": overlap_table(fig), "plot": overlap_plot(fig)}
    raise DynspecError(f"unknown figures {kind!r}")


def _named(items: Sequence[str], flag: str, many: bool = False) -> dict[str, str | list[str]]:
    """['A=x.json'] -> {'A': 'x.json'}; many: ['A=x', 'A=y'] -> {'A': ['x', 'y']} (a name once otherwise)."""
    out: dict = {}
    for it in items or ():
        name, sep, path = it.partition("=")
        if not sep or not name or not path:
            raise DynspecError(f"{flag} {it!r} is not NAME=PATH (e.g. A=a.json)")
        if many:
            out.setdefault(name, []).append(path)
        elif name in out:
            raise DynspecError(f"{flag} {name} is given twice ({out[name]} and {path})")
        else:
            out[name] = path
    return out


def _commands(doc: Mapping) -> list:
    return list(doc["env"].get("commands") or [doc["env"].get("command")])
