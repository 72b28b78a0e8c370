"""The suite's summary of one config (benchmarks/suite.py): OUT_DIR/summary.json (the figures),
summary.md (their table, how they were measured, the stage commands) and summary.png (the plot
spec summary.suite_figures gives). Reads the figures and the manifest only."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from dynspec.artifacts import write_json
from dynspec.benchmarks.report import MODE_STYLE, _split, _style


def suite_markdown(cfg, figs: Mapping, manifest: Mapping) -> str:
    """# NAME, the description, the figures' table, how it was measured, the stage commands."""
    t = figs["table"]
    lines = [f"# {cfg.name}", "", cfg.description.strip(), "",
             "| " + " | ".join(t["header"]) + " |", "|" + "---|" * len(t["header"])]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in t["rows"]]
    gpus = manifest.get("gpus") or []
    for note in t.get("notes", ()):
        lines += ["", note]
    lines += ["", f"- device: {cfg.engine.device}" + (f" ({gpus[0]['name']}, SM clock {gpus[0]['clocks_sm']})" if gpus else ""),
              f"- git commit: {manifest.get('git_commit')} (+{manifest.get('git_changed_paths')} changed paths)"
              + (f", the files as run: tree {manifest['git_worktree_tree']}" if manifest.get("git_worktree_tree") else "")
              + f"; torch {manifest.get('torch')}, python {manifest.get('python')}",
              f"- suite command: `{manifest.get('command')}`", "", "Stages:", ""]
    cases = manifest.get("cases") or {}
    for s in manifest.get("stages", []):
        lines.append(f"- `{s['name']}` ({s['wall_s']:.1f} s, rc {s['rc']}): `{s['command']}`")
        lines += [f"  - case `{c['name']}`: `{c['args']}`" for c in cases.get(s["name"], [])]
    return "\n".join(lines) + "\n"


def suite_plot(spec: Mapping, path: str | os.PathLike) -> None:
    """spec "series": {name: [[x, y, lo, hi], ...]} -> lines with error bars; "bars": {name: [y, lo, hi]};
    "groups": {group: {name: y}} -> grouped bars; "panels" (the per_request figures): their scatter."""
    if "panels" in spec:
        from dynspec.benchmarks.figures_per_request import per_request_png

        return per_request_png(spec, path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    if "series" in spec:
        for name, pts in spec["series"].items():
            x, y, lo, hi = zip(*sorted(pts))
            color, marker, line = _style(name) if _split(name)[0] in MODE_STYLE else (None, "o", "-")
            ax.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo)], [b - a for a, b in zip(y, hi)]],
                        marker=marker, color=color, label=name, capsize=3, linestyle=line)
        if spec.get("xlog"):
            ax.set_xscale("log", base=2)
            xs = sorted({p[0] for pts in spec["series"].values() for p in pts})
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.legend()
    elif "bars" in spec:
        names = list(spec["bars"])
        y = [spec["bars"][n][0] for n in names]
        err = [[v[0] - v[1] for v in spec["bars"].values()], [v[2] - v[0] for v in spec["bars"].values()]]
        ax.bar(names, y, yerr=err, capsize=4, color=["tab:blue", "tab:gray"][: len(names)])
    else:
        groups = list(spec["groups"])
        names = sorted({n for g in spec["groups"].values() for n in g})
        width = 0.8 / max(len(names), 1)
        for i, n in enumerate(names):
            ax.bar([j + i * width for j in range(len(groups))], [spec["groups"][g].get(n, 0) for g in groups],
                   width, label=n)
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(groups))], groups)
        ax.legend(fontsize=8)
    ax.set_title(spec["title"], fontsize=10)
    ax.set_xlabel(spec.get("x", ""))
    ax.set_ylabel(spec.get("y", ""))
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_suite_report(cfg, figs: Mapping, manifest: Mapping, out_dir: str | os.PathLike) -> None:
    """OUT_DIR/summary.json (the figures), summary.md, summary.png."""
    d = Path(out_dir)
    write_json(d / "summary.json", {"config": cfg.name, "description": cfg.description, "figures": cfg.figures,
                                    "values": figs["values"], "table": figs["table"]})
    (d / "summary.md").write_text(suite_markdown(cfg, figs, manifest))
    suite_plot(figs["plot"], d / "summary.png")
