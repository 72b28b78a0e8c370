"""Write a sweep's results: NAME.json (env + rows), NAME.md (a table), NAME.png (two panels).

NAME.json:
    {"env": {"device", "versions", "command", "acceptance_model", "world_size", ...},
     "rows": [{"mode": "dynamic", "concurrency": 4, "output_tok_per_s": 812.5, "p50_latency_s": ...,
               "p99_latency_s", "ttft_s", "tpot_s", "mean_k", "mean_accepted_len", "acceptance_model",
               "schedule", ...,
               "per_request": {"fields": ["output_len", "accepted_drafts", "drafted", "decode_steps", "mean_k",
                                          "acceptance", "key"],
                               "replicas": [[[32, 5, 12, 3, 4.0, 0.4167, 7], ...], ...]}}, ...]}
    per_request: the median trial's requests (metrics.request_table), each replica's in finishing order.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from dynspec.artifacts import write_json
from dynspec.benchmarks.figures_common import OVERLAP, crossover_concurrency, figure_rows, overlap_twins, row_loop, verdict
from dynspec.benchmarks.metrics import STEADY_FILL
from dynspec.benchmarks.sweep_modes import OVERLAP as OVERLAP_SUFFIX, SERIAL, split_mode

MODE_ORDER = ("baseline", "static", "dynamic")
MODE_STYLE = {"baseline": ("tab:gray", "o"), "static": ("tab:orange", "s"), "dynamic": ("tab:blue", "^")}
SUFFIX_ORDER = ("", SERIAL, OVERLAP_SUFFIX)     # a mode's loop suffixes (benchmarks/sweep_modes.py), in table order


def _split(mode: str) -> tuple[str, str]:
    """'dynamic+overlap' -> ('dynamic', '+overlap'); 'static:3' -> ('static:3', '')."""
    return split_mode(mode)


def _style(mode: str, dashed: bool | None = None) -> tuple:
    """(colour, marker, line style): its base mode's colour and marker, a dashed line for the
    overlapped loop's twin of a serial mode (dashed None: a figure name, whose OVERLAP suffix says
    so): 'baseline+overlap' -> ('tab:gray', 'o', '--')."""
    color, marker = MODE_STYLE.get(_split(mode)[0], (None, "x"))
    return color, marker, "--" if (mode.endswith(OVERLAP) if dashed is None else dashed) else "-"


def out_paths(out: str | os.PathLike) -> dict[str, Path]:
    """--out results/NAME -> results/NAME.json, .md, .png (a trailing .json is dropped)."""
    p = Path(out)
    if p.suffix in (".json", ".md", ".png"):
        p = p.with_suffix("")
    return {ext: p.with_name(p.name + "." + ext) for ext in ("json", "md", "png")}


def _load_key(row: Mapping) -> tuple:
    c = row.get("concurrency")
    return (0, c) if c is not None else (1, row.get("request_rate") or 0.0)


def _mode_key(mode: str) -> tuple:
    base, suffix = _split(mode)
    return (MODE_ORDER.index(base) if base in MODE_ORDER else len(MODE_ORDER), base, SUFFIX_ORDER.index(suffix))


def _row_key(row: Mapping) -> tuple:
    """Table order: by load, then baseline, static, dynamic, each mode's overlapped loop after it."""
    return _load_key(row), _mode_key(row["mode"])


def _fmt(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _load_label(r: Mapping) -> str:
    if r.get("concurrency") is not None:
        return f"C={r['concurrency']}"
    at = f" (Poisson, ~C={r['matched_concurrency']})" if r.get("matched_concurrency") is not None else " (Poisson)"
    return f"{r.get('request_rate'):.3g} req/s{at}"


def _spread(r: Mapping) -> str:
    if (r.get("trials") or 1) < 2:
        return "-"
    return f"{r['tok_per_s_min']:.1f}..{r['tok_per_s_max']:.1f}"


UNDERFULL_NOTE = 0.1   # list a closed-loop row when more than this share of its iterations ran under-full


def underfull_note(rows: Sequence[Mapping]) -> list[str]:
    """Closed-loop rows whose iterations ran with fewer than STEADY_FILL (0.9) x C decode rows more
    than UNDERFULL_NOTE (10%) of the time (the ramp and the drain of a finite run), with the rate
    over the full ones (steady_tok_per_s).
    Example: baseline at C=64, steady_fraction 0.78, steady 8170 tok/s ->
    "baseline C=64: 22% (8170 tok/s over the full ones)"."""
    hit = [r for r in sorted(rows, key=_row_key)
           if r.get("concurrency") is not None and r.get("steady_fraction") is not None
           and 1 - r["steady_fraction"] > UNDERFULL_NOTE]
    if not hit:
        return []
    items = "; ".join(f"{r['mode']} C={r['concurrency']}: {1 - r['steady_fraction']:.0%}"
                      + (f" ({r['steady_tok_per_s']:.0f} tok/s over the full ones)" if r.get("steady_tok_per_s") else "")
                      for r in hit)
    return ["", f"Under-full iterations (fewer than {STEADY_FILL:g} C decode rows: the ramp and the drain of a finite closed"
                f" loop, included in the tok/s above; more requests a point shrink them): {items}."]


def markdown(doc: Mapping) -> str:
    env, rows = doc["env"], doc["rows"]
    lines = [f"# {env.get('name', 'sweep')}", "",
             f"- device: {env.get('device')}  (replicas: {env.get('world_size', 1)}, engine: {env.get('engine')})",
             f"- acceptance model: **{env.get('acceptance_model')}**",
             f"- workload: {env.get('workload')}",
             "- schedules: " + ", ".join(f"{m}=`{s or 'K=0'}`" for m, s in (env.get('schedules') or {}).items()),
             f"- command: `{env.get('command')}`", ""]
    # "vs baseline": against the baseline of the row's own loop (dynamic+overlap / baseline+overlap)
    base = {(_load_key(r), row_loop(r)): r for r in rows if _split(r["mode"])[0] == "baseline"}
    lines.append("| mode | load | output tok/s | trials min..max | vs baseline | p50 lat s | p99 lat s | TTFT p50 ms"
                 " | TTFT p99 ms | TPOT ms | mean K | mean accepted len | acceptance | engine idle |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ms = lambda x: None if x is None else 1e3 * x      # noqa: E731
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"      # noqa: E731
    for r in sorted(rows, key=_row_key):
        b = base.get((_load_key(r), row_loop(r)))
        vs = "-"
        if b and b["output_tok_per_s"] > 0:
            vs = f"{r['output_tok_per_s'] / b['output_tok_per_s']:.2f}x"
            if r is not b and verdict(r, b) == "tie":
                vs += " (tie)"
        lines.append(
            f"| {r['mode']} | {_load_label(r)} | {r['output_tok_per_s']:.1f} | {_spread(r)} | {vs} |"
            f" {_fmt(r['p50_latency_s'])} | {_fmt(r['p99_latency_s'])} | {_fmt(ms(r.get('p50_ttft_s')))} |"
            f" {_fmt(ms(r.get('p99_ttft_s')))} | {_fmt(ms(r.get('tpot_s')))} | {r['mean_k']:.2f} |"
            f" {r['mean_accepted_len']:.2f} | {_fmt(r.get('acceptance_rate'), '.2f')} |"
            f" {pct(r.get('engine_idle_fraction'))} |"
        )
    n_trials = max((r.get("trials") or 1) for r in rows) if rows else 1
    if n_trials > 1:
        lines += ["", f"Each row is the median-throughput run of {n_trials} trials (mode order rotated per trial);"
                      " ratios use these medians, and a ratio whose trial spreads overlap is labelled (tie)."
                      " Every trial's tok/s is in the JSON (`trial_tok_per_s`)."]
    if any(r.get("matched_concurrency") is not None for r in rows):
        lines += ["", "Poisson rows: open-loop arrivals at the rate the baseline sustained in the closed loop"
                      " at that C (median trial), so both loops carry the same mean load."]
    over = sorted({r["mode"] for r in rows if row_loop(r) == "overlap"}, key=_mode_key)
    if over:
        both = len({row_loop(r) for r in rows}) > 1
        lines += ["", f"Ran the overlapped executor loop (Executor(loop=Loop.OVERLAPPED)): {', '.join(over)}"
                      + ("; the other modes the serial loop, and each mode's 'vs baseline' is against the baseline"
                         " of its own loop" if both else "")
                      + ". Engine idle: the share of the run's wall time outside the engine's steps (overlapped:"
                        " the steps' device time)."]
    lines += underfull_note(rows)
    named = figure_rows(rows)
    cross = crossover_concurrency(named)
    if any(r["mode"] == "static" for r in named) and base:
        lines += ["", f"Static-vs-baseline crossover (smallest C where baseline beats static): "
                      f"{'none in this sweep' if cross is None else f'C={cross}'}"]
    return "\n".join(lines) + "\n"


def plot(doc: Mapping, path: str | os.PathLike) -> None:
    """Panel 1: throughput vs concurrency per mode (median, min..max of trials; Poisson dotted).
    Panel 2: K per batch size, from iteration stats (marker area ~ share of iterations; prefill-only
    iterations, b=0, left out) over each mode's policy as a step line. Panel 3: TTFT p50 / p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    closed = [r for r in doc["rows"] if r.get("concurrency") is not None]
    xkey, xlabel = ("concurrency", "concurrency C (per replica)") if closed else \
        ("request_rate", "request rate (req/s per replica, open loop)")
    rows = closed or [r for r in doc["rows"] if r.get("request_rate") is not None]
    modes = sorted({r["mode"] for r in doc["rows"]}, key=_mode_key)
    twins = overlap_twins(doc["rows"])
    styles = {m: _style(m, m in twins) for m in modes}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.5))
    _throughput_panel(ax1, doc, rows, modes, styles, xkey, xlabel, bool(closed))
    _k_panel(ax2, doc, modes, styles)
    _ttft_panel(ax3, rows, modes, styles, xkey, xlabel)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput_panel(ax1, doc: Mapping, rows: Sequence[Mapping], modes: Sequence[str], styles: Mapping,
                      xkey: str, xlabel: str, closed: bool) -> None:
    """Output tok/s per mode against the load (median, min..max of trials); Poisson rows dotted."""
    for m in modes:
        color, marker, line = styles[m]
        pts = sorted((r[xkey], r["output_tok_per_s"], r.get("tok_per_s_min", r["output_tok_per_s"]),
                      r.get("tok_per_s_max", r["output_tok_per_s"])) for r in rows if r["mode"] == m)
        if pts:
            x, y, lo, hi = zip(*pts)
            ax1.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo)], [b - a for a, b in zip(y, hi)]],
                         marker=marker, color=color, label=m, capsize=3, linestyle=line)
        pois = sorted((r["matched_concurrency"], r["output_tok_per_s"]) for r in doc["rows"]
                      if r["mode"] == m and r.get("matched_concurrency") is not None)
        if closed and pois:
            ax1.plot(*zip(*pois), marker=marker, color=color, linestyle=":", alpha=0.7, label=f"{m} (Poisson)")
    ax1.set_xscale("log", base=2)
    xs = sorted({r[xkey] for r in rows})
    if xs:
        ax1.set_xticks(xs, [f"{x:g}" for x in xs])
    ax1.set_xlabel(xlabel)
    ax1.set_ylabel("output tokens / s (all replicas)")
    ax1.set_title(f"throughput (median, min..max of trials)  [acceptance {doc['env'].get('acceptance_model')}]",
                  fontsize=9)
    ax1.grid(True, alpha=0.3)
    if rows:
        ax1.legend()


def _k_panel(ax2, doc: Mapping, modes: Sequence[str], styles: Mapping) -> None:
    """K per batch size from the rows' k_by_batch (marker area ~ share of iterations, b=0 left
    out), over each mode's schedule as a step line."""
    from dynspec.runtime.policy import DraftSchedule

    sched = doc["env"].get("schedules") or {}
    max_b = 1
    for i, m in enumerate(modes):
        color, marker, _ = styles[m]
        counts: dict[tuple[int, int], int] = {}
        for r in doc["rows"]:
            if r["mode"] == m:
                for b, k, n in r.get("k_by_batch", []):
                    if b > 0:
                        counts[(b, k)] = counts.get((b, k), 0) + n
        if not counts:
            continue
        total = sum(counts.values())
        bs = [b for b, _ in counts]
        max_b = max(max_b, *bs)
        off = (i - (len(modes) - 1) / 2) * 0.06       # small vertical offset so modes do not hide each other
        ax2.scatter(bs, [k + off for _, k in counts], s=[20 + 400 * n / total for n in counts.values()],
                    color=color, marker=marker, alpha=0.6, label=f"{m} (iterations)")
    for i, m in enumerate(modes):
        spec = sched.get(m)
        if spec is None:
            continue
        s = DraftSchedule.parse(spec)
        xs = list(range(1, max_b + 1))
        ax2.step(xs, [s.draft_len(b) for b in xs], where="mid", color=styles[m][0],
                 alpha=0.5, linestyle="--", label=f"{m} policy")
    ax2.set_xscale("log", base=2)
    ticks = [2 ** i for i in range(max_b.bit_length() + 1) if 2 ** i <= max(max_b, 1) * 1.01]
    ax2.set_xticks(ticks, [str(t) for t in ticks])
    ax2.set_xlabel("batch size b (iteration)")
    ax2.set_ylabel("draft length K")
    ax2.set_title("K per iteration vs batch size")
    ax2.grid(True, alpha=0.3)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=8, loc="best")


def _ttft_panel(ax3, rows: Sequence[Mapping], modes: Sequence[str], styles: Mapping, xkey: str, xlabel: str) -> None:
    """TTFT p50 (solid) and p99 (dashed) per mode against the load."""
    from matplotlib.ticker import NullLocator

    for m in modes:
        color, marker, _ = styles[m]
        pts = sorted((r[xkey], 1e3 * r["p50_ttft_s"], 1e3 * r["p99_ttft_s"]) for r in rows
                     if r["mode"] == m and r.get("p50_ttft_s") is not None)
        if pts:
            x, p50, p99 = zip(*pts)
            ax3.plot(x, p50, marker=marker, color=color, label=f"{m} p50")
            ax3.plot(x, p99, marker=marker, color=color, linestyle="--", alpha=0.6, label=f"{m} p99")
    ax3.set_xscale("log", base=2)
    loads = sorted({r[xkey] for r in rows if r.get("p50_ttft_s") is not None})
    if loads:
        ax3.set_xticks(loads, [f"{x:g}" for x in loads])
    ax3.xaxis.set_minor_locator(NullLocator())
    ax3.set_yscale("log")
    ax3.set_xlabel(xlabel)
    ax3.set_ylabel("time to first token, ms")
    ax3.set_title("TTFT p50 (solid) and p99 (dashed)")
    ax3.grid(True, alpha=0.3)
    if ax3.get_legend_handles_labels()[0]:
        ax3.legend(fontsize=8, loc="best")


def write_all(doc: Mapping, out: str | os.PathLike, plot_png: bool = True) -> dict[str, Path]:
    """NAME.json, NAME.md and (plot_png) NAME.png; returns the paths written."""
    paths = out_paths(out)
    write_json(paths["json"], doc)
    paths["md"].write_text(markdown(doc))
    if not plot_png:
        return {k: v for k, v in paths.items() if k != "png"}
    plot(doc, paths["png"])
    return paths


def rows_by(rows: Sequence[Mapping], mode: str) -> dict:
    """{concurrency: row} for one mode."""
    return {r["concurrency"]: r for r in rows if r["mode"] == mode and r.get("concurrency") is not None}


