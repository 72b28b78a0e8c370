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
    per_request      per sweep stage (sweep, sweep_*) and load point (closed-loop C, Poisson): per-request /
                     adaptive, / baseline, adaptive / baseline, each / the best static K (per-trial median,
                     min, max), the per-request policy's host cost per step (where its rows record steps);
                     plot: each request's mean K against its true acceptance rate (figures_per_request)
    cost_model       the installed profile's iteration ms per (context, b, K)
    overlap          the serial executor loop beside the overlapped one: baseline engine idle share and
                     varied / fixed per C, regime B dynamic / max(baseline, static) per loop, the b=1
                     step over its graphs alone and over the GEMM floor per loop
Each kind also gives a table (summary.md) and a plot spec (summary.png), benchmarks/suite_report.py.
The figures live in figures_sweep, figures_profile, figures_adaptive, figures_per_request and
figures_overlap (shared parts: figures_common); this module reads a config's stage outputs and
picks the kind.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from dynspec.benchmarks.figures_adaptive import adaptive_figures, adaptive_plot, adaptive_table
from dynspec.benchmarks.figures_per_request import per_request_figures, per_request_plot, per_request_table
from dynspec.benchmarks.figures_common import figure_rows
from dynspec.benchmarks.figures_steps import split_at, split_note
from dynspec.benchmarks.figures_overlap import overlap_figures, overlap_plot, overlap_table
from dynspec.benchmarks.figures_profile import (cost_model_figures, cost_model_plot, cost_model_table,
                                                draft_sync_figures, draft_sync_note, floor_figures, floor_plot,
                                                floor_table, mixed_figures, mixed_plot, mixed_table,
                                                tp_figures, tp_plot, tp_table)
from dynspec.benchmarks.figures_sweep import (sweep_figures, sweep_plot, sweep_table, varied_fixed_figures,
                                              varied_fixed_plot, varied_fixed_table)
from dynspec.errors import DynspecError


def sweep_stage_names(names) -> list[str]:
    """The stages the adaptive and per_request figures read: 'sweep' and 'sweep_*', in order."""
    return [n for n in names if n == "sweep" or n.startswith("sweep_")]


def _floor_names(repeats: Mapping[str, int]) -> list[str]:
    """The floor stage's outputs: 'floor', or 'floor1'..'floorN' when it repeats N > 1 times."""
    n = repeats.get("floor", 1)
    return ["floor"] if n == 1 else [f"floor{i}" for i in range(1, n + 1)]


def _read(path) -> dict:
    from dynspec.artifacts import read_json

    return read_json(path, "stage output")


def _with_draft_sync(d: Path, fig: dict, table_of) -> tuple[dict, dict]:
    """fig and its table, with the profile's draft-sync costs (figures_profile.draft_sync_figures)
    where the config profiled (profile.json beside the sweep)."""
    table = table_of(fig)
    if (d / "profile.json").is_file():
        fig = dict(fig, draft_sync=draft_sync_figures(_read(d / "profile.json")))
        table = dict(table, notes=[*table.get("notes", ()), draft_sync_note(fig["draft_sync"])])
    return fig, table


def suite_figures(kind: str, results, repeats: Mapping[str, int]) -> dict:
    """A config's figures from its stage outputs in `results` (benchmarks/suite.py writes them):
    {"values": ..., "table": {"header", "rows"}, "plot": {...}} (suite_report.write_suite_report)."""
    d = Path(results)
    if kind == "sweep":
        doc = _read(d / "sweep.json")
        fig, table = _with_draft_sync(d, sweep_figures(doc), sweep_table)
        sp = split_at(figure_rows(doc["rows"]))
        if sp is not None:                # where each mode's time goes at the largest load (figures_steps)
            fig, table = dict(fig, time_split=sp), dict(table, notes=[*table.get("notes", ()), split_note("sweep", sp)])
        return {"values": fig, "table": table, "plot": sweep_plot(fig)}
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
        fig = adaptive_figures({n: _read(d / f"{n}.json") for n in sweep_stage_names(repeats)})
        return {"values": fig, "table": adaptive_table(fig), "plot": adaptive_plot(fig)}
    if kind == "per_request":
        fig = per_request_figures({n: _read(d / f"{n}.json") for n in sweep_stage_names(repeats)})
        return {"values": fig, "table": per_request_table(fig), "plot": per_request_plot(fig)}
    if kind == "cost_model":
        fig = cost_model_figures(_read(d / "profile.json"), d / "profile.json")
        return {"values": fig, "table": cost_model_table(fig), "plot": cost_model_plot(fig)}
    if kind == "sim_validate":
        from dynspec.benchmarks.simulate import validation_figures

        return validation_figures(_read(d / "validation.json"))
    if kind in ("sim_ttft", "serving_ttft"):
        from dynspec.benchmarks.figures_ttft import stage_names, ttft_figures

        names = stage_names(list(repeats)) if kind == "sim_ttft" else sweep_stage_names(repeats)
        return ttft_figures({n: _read(d / f"{n}.json") for n in names}, measured=kind == "serving_ttft")
    if kind == "overlap":
        names = _floor_names(repeats)
        fig = overlap_figures(*(_read(d / f"sweep_{c}.json") for c in ("varied", "fixed", "regime_b")),
                              [_read(d / f"{x}.json") for x in names])
        return {"values": fig, "table": overlap_table(fig), "plot": overlap_plot(fig)}
    raise DynspecError(f"unknown figures {kind!r}")
