"""Write a sweep's results: NAME.json (env + rows), NAME.md (a table), NAME.png (two panels).

NAME.json:
    {"env": {"device", "versions", "command", "acceptance_model", "world_size", ...},
     "rows": [{"mode": "dynamic", "concurrency": 4, "output_tok_per_s": 812.5, "p50_latency_s": ...,
               "p99_latency_s", "ttft_s", "tpot_s", "mean_k", "mean_accepted_len", "acceptance_model",
               "schedule", ...}, ...]}
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from dynspec.artifacts import write_json

MODE_ORDER = ("baseline", "static", "dynamic")
MODE_STYLE = {"baseline": ("tab:gray", "o"), "static": ("tab:orange", "s"), "dynamic": ("tab:blue", "^")}


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
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def _fmt(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def markdown(doc: Mapping) -> str:
    env, rows = doc["env"], doc["rows"]
    lines = [f"# {env.get('name', 'sweep')}", "",
             f"- device: {env.get('device')}  (replicas: {env.get('world_size', 1)}, engine: {env.get('engine')})",
             f"- acceptance model: **{env.get('acceptance_model')}**",
             f"- workload: {env.get('workload')}",
             f"- schedules: " + ", ".join(f"{m}=`{s or 'K=0'}`" for m, s in (env.get('schedules') or {}).items()),
             f"- command: `{env.get('command')}`", ""]
    base = {_load_key(r): r["output_tok_per_s"] for r in rows if r["mode"] == "baseline"}
    lines.append("| mode | load | output tok/s | vs baseline | p50 lat s | p99 lat s | TTFT s | TPOT ms | mean K"
                 " | mean accepted len | acceptance |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (_load_key(r), _mode_key(r["mode"]))):
        load = f"C={r['concurrency']}" if r.get("concurrency") is not None else f"{r.get('request_rate'):g} req/s"
        b = base.get(_load_key(r))
        vs = f"{r['output_tok_per_s'] / b:.2f}x" if b else "-"
        tpot = None if r.get("tpot_s") is None else 1e3 * r["tpot_s"]
        lines.append(
            f"| {r['mode']} | {load} | {r['output_tok_per_s']:.1f} | {vs} | {_fmt(r['p50_latency_s'])} |"
            f" {_fmt(r['p99_latency_s'])} | {_fmt(r.get('ttft_s'))} | {_fmt(tpot)} | {r['mean_k']:.2f} |"
            f" {r['mean_accepted_len']:.2f} | {_fmt(r.get('acceptance_rate'), '.2f')} |"
        )
    n_trials = max((r.get("trials") or 1) for r in rows) if rows else 1
    if n_trials > 1:
        lines += ["", f"Each row is the median-throughput run of {n_trials} trials (mode order rotated per trial);"
                      " every trial's tok/s is in the JSON (`trial_tok_per_s`)."]
    from dynspec.benchmarks.summary import crossover_concurrency

    cross = crossover_concurrency(rows)
    if any(r["mode"] == "static" for r in rows) and base:
        lines += ["", f"Static-vs-baseline crossover (smallest C where baseline beats static): "
                      f"{'none in this sweep' if cross is None else f'C={cross}'}"]
    return "\n".join(lines) + "\n"


def plot(doc: Mapping, path: str | os.PathLike) -> None:
    """Panel 1: throughput vs concurrency per mode. Panel 2: K per batch size, from iteration stats
    (marker area ~ share of iterations) over each mode's policy as a step line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    closed = [r for r in doc["rows"] if r.get("concurrency") is not None]
    xkey, xlabel = ("concurrency", "concurrency C (per replica)") if closed else \
        ("request_rate", "request rate (req/s per replica, open loop)")
    rows = closed or [r for r in doc["rows"] if r.get("request_rate") is not None]
    modes = sorted({r["mode"] for r in doc["rows"]}, key=_mode_key)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for m in modes:
        color, marker = MODE_STYLE.get(m, (None, "x"))
        pts = sorted((r[xkey], r["output_tok_per_s"]) for r in rows if r["mode"] == m)
        if pts:
            ax1.plot(*zip(*pts), marker=marker, color=color, label=m)
    ax1.set_xscale("log", base=2)
    xs = sorted({r[xkey] for r in rows})
    if xs:
        ax1.set_xticks(xs, [f"{x:g}" for x in xs])
    ax1.set_xlabel(xlabel)
    ax1.set_ylabel("output tokens / s (all replicas)")
    ax1.set_title(f"throughput  [acceptance {doc['env'].get('acceptance_model')}]")
    ax1.grid(True, alpha=0.3)
    if rows:
        ax1.legend()

    sched = doc["env"].get("schedules") or {}
    max_b = 1
    for i, m in enumerate(modes):
        color, marker = MODE_STYLE.get(m, (None, "x"))
        counts: dict[tuple[int, int], int] = {}
        for r in doc["rows"]:
            if r["mode"] == m:
                for b, k, n in r.get("k_by_batch", []):
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
        from dynspec.runtime.policy import DraftSchedule

        s = DraftSchedule.parse(spec)
        xs = list(range(1, max_b + 1))
        ax2.step(xs, [s.draft_len(b) for b in xs], where="mid", color=MODE_STYLE.get(m, (None,))[0],
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
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(doc: Mapping, out: str | os.PathLike) -> dict[str, Path]:
    paths = out_paths(out)
    write_json(paths["json"], doc)
    paths["md"].write_text(markdown(doc))
    plot(doc, paths["png"])
    return paths


def rows_by(rows: Sequence[Mapping], mode: str) -> dict:
    """{concurrency: row} for one mode."""
    return {r["concurrency"]: r for r in rows if r["mode"] == mode and r.get("concurrency") is not None}
