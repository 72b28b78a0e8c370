"""Overlap figures (summary.suite_figures "overlap", benchmarks/configs/overlap.toml): the serial
executor loop beside the overlapped one. Pure functions of sweep and profile --floor JSON."""
from __future__ import annotations

from typing import Mapping, Sequence

from dynspec.benchmarks.figures_common import OVERLAP, _commands, _fmt_ratio, figure_rows, spread
from dynspec.benchmarks.figures_profile import decode_vs_gemm_floor, floor_figures
from dynspec.benchmarks.figures_sweep import _fmt_iterations, _loops, sweep_figures, varied_fixed_figures


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
    rows = {(r["mode"], r["concurrency"]): r for r in figure_rows(varied["rows"])
            if r.get("gpu_gap_fraction") is not None}
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
