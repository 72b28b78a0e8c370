"""Sweep figures (summary.suite_figures "sweep" and "varied_vs_fixed"): per C, tok/s per mode and
the ratios between modes, each loop's (serial, overlapped) modes against their own rivals; and
the baseline with varied against fixed lengths. Pure functions of sweep JSON."""
from __future__ import annotations

from typing import Mapping, Sequence

from dynspec.benchmarks.figures_common import (OVERLAP, SWEEP_MODES, _closed, _commands, _fmt_ratio, _tps,
                                               _trials, crossover_concurrency, figure_rows, paired_ratio, spread,
                                               verdict)
from dynspec.benchmarks.sweep_plan import closed_loop_floor


def varied_vs_fixed(varied_rows: Sequence[Mapping], fixed_rows: Sequence[Mapping],
                    field: str = "output_tok_per_s", fixed_field: str | None = None) -> dict[str, float | None]:
    """{"<C>": baseline `field` with varied lengths / `fixed_field` (default: the same) with fixed
    lengths} at every C of the fixed-length sweep; None where the varied sweep lacks that C or the
    field: varied 90 / fixed 100 tok/s at C=64 -> {"64": 0.9}."""
    v, f = _tps(varied_rows, "baseline", field), _tps(fixed_rows, "baseline", fixed_field or field)
    return {str(c): (v[c] / f[c] if c in v and f.get(c) else None) for c in sorted(_tps(fixed_rows, "baseline"))}


def loop_ratios(here: Mapping[str, Mapping], suffix: str = "") -> dict:
    """The ratios of one executor loop at one C, its modes named with `suffix` (figure_rows: '' the
    sweep's serial loop, or its only loop; '+overlap' the overlapped loop beside it): static / baseline, dynamic / baseline, dynamic / max(baseline, static) and its
    verdict, each mode against its own loop's rivals (dynamic+overlap / baseline+overlap, ...)."""
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
    Modes are named as figure_rows names them: with both executor loops in the sweep, the
    overlapped loop's ('baseline+overlap', ...) get the same ratios among themselves under
    "overlap", each one over its serial twin under "overlap_vs_serial", and (then) every mode its
    engine_idle_fraction under "idle"."""
    named = figure_rows(doc["rows"])
    names = SWEEP_MODES + tuple(m + OVERLAP for m in SWEEP_MODES)
    modes = {m: _closed(named, m) for m in names}
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
    return {"by_concurrency": by_c, "crossover_concurrency": crossover_concurrency(named),
            "schedules": doc["env"].get("schedules"), "acceptance_model": doc["env"].get("acceptance_model"),
            "workload": doc["env"].get("workload"), "commands": _commands(doc)}


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


def varied_fixed_figures(varied: Mapping, fixed: Mapping, mode: str = "baseline") -> dict:
    """Per C: `mode`'s tok/s with varied / with fixed lengths (ratio of medians), bounded by the
    trials' spreads (varied min / fixed max .. varied max / fixed min; the two runs' trials are not
    paired). Modes as figure_rows names them: with the serial baseline, a baseline of the overlapped
    loop beside it in both runs (baseline+overlap) gets the same under "overlap".
    engine_ratio: the same ratio on the steps' time alone (tokens / (iterations x mean step)): equal
    to the ratio when the host adds nothing; decode_rows: (varied, fixed) mean decode rows a step;
    iterations: (varied, fixed) each as [run, the workload's minimum] (sweep_plan.closed_loop_floor), and
    floor_rows_ratio: tokens an iteration at those minima, varied / fixed (the ratio if every step
    cost the same). Example: 49586 tokens in 917 steps of 7.10 ms against 49152 in 773 of 7.32 ->
    engine ratio (49586 / 6.511) / (49152 / 5.658) = 0.877; minima 917 and 773 -> floor rows ratio
    (49586 / 917) / (49152 / 773) = 0.850."""
    varied_rows, fixed_rows = figure_rows(varied["rows"]), figure_rows(fixed["rows"])
    v, f = _closed(varied_rows, mode), _closed(fixed_rows, mode)
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
    if not mode.endswith(OVERLAP) and _closed(varied_rows, over) and _closed(fixed_rows, over):
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
