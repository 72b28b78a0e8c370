"""Per-request figures (summary.suite_figures "per_request"): the per-request draft-length policy
of each sweep case against the batch-level adaptive policy, the baseline and the best static K,
per load point (closed loop and Poisson); its host cost per step; each request's K against its
true acceptance rate; and where each mode's time goes at the largest load (figures_steps). Pure
functions of sweep JSON (one PNG writer, per_request_png).

A case's values, e.g. mix50 (bernoulli-mix:0.9@0.5,0.2@0.5) with C = 16 and a Poisson point:
    {"by_load": {"16": {"load": "C=16", "per_request_vs_adaptive": {"median": 1.08, "min": ..., ...},
                        "per_request_vs_baseline": ..., "adaptive_vs_baseline": ...,
                        "per_request_vs_best_static": ..., "best_static": "static:2", "host_cost": None, ...},
                 "poisson@16": {"load": "Poisson at C=16's rate", ...}},
     "scatter": {"concurrency": 16, "modes": {"per-request": {"points": [[0.9, 3.2], [0.2, 0.4], ...],
                                                              "requests": 96, "by_rate": {"0.2": 0.4, "0.9": 3.2}},
                                              "adaptive": {...}}}, ...}"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Mapping, Sequence

from dynspec.benchmarks.figures_adaptive import host_cost
from dynspec.benchmarks.figures_common import _commands, _fmt_ratio, _trials, figure_rows, paired_ratio, spread
from dynspec.benchmarks.figures_steps import split_at, split_note

PER_REQUEST = "per-request"
SCATTER_MODES = (PER_REQUEST, "adaptive")
SCATTER_MIN_C = 16          # the scatter's load: the largest closed-loop C at or above this
SCATTER_POINTS = 150        # at most this many requests a mode a panel (deterministic stride)
BY_RATE_MAX = 8             # median K per true rate only when the case has at most this many rates
REPO = Path(__file__).resolve().parents[1]


def load_label(row: Mapping) -> tuple[tuple, str, str]:
    """(sort key, values key, table text) of a row's load point: closed loop C=16 ->
    ((0, 16), "16", "C=16"); Poisson at C=16's rate -> ((1, 16), "poisson@16", "Poisson at C=16's rate");
    Poisson at a plain rate 2.5/s -> ((2, 2.5), "poisson 2.5/s", "Poisson 2.5 req/s")."""
    c, m, rate = row.get("concurrency"), row.get("matched_concurrency"), row.get("request_rate")
    if c is not None:
        return (0, int(c)), str(c), f"C={c}"
    if m is not None:
        return (1, int(m)), f"poisson@{m}", f"Poisson at C={m}'s rate"
    return (2, float(rate or 0.0)), f"poisson {rate:g}/s", f"Poisson {rate:g} req/s"


def _static(mode: str) -> bool:
    return mode == "static" or mode.startswith("static:")


def load_ratios(here: Mapping[str, Mapping]) -> dict:
    """The ratios at one load point, {mode: row} (paired_ratio: median, min, max of the per-trial
    ratios, and of_medians). per-request [120, 126, 121], adaptive [100, 105, 110] ->
    per_request_vs_adaptive per trial 1.20, 1.20, 1.10 -> median 1.20, min 1.10."""
    pr, ad, base = here.get(PER_REQUEST), here.get("adaptive"), here.get("baseline")
    statics = [m for m in here if _static(m)]
    e: dict = {}
    for name, top, bottom in (("per_request_vs_adaptive", pr, ad), ("per_request_vs_baseline", pr, base),
                              ("adaptive_vs_baseline", ad, base)):
        if top is not None and bottom is not None:
            e[name] = paired_ratio(top, [bottom])
    if statics:
        e["best_static"] = max(statics, key=lambda m: here[m]["output_tok_per_s"])
        for name, top in (("per_request_vs_best_static", pr), ("adaptive_vs_best_static", ad)):
            if top is not None:
                e[name] = paired_ratio(top, [here[m] for m in statics])
    return e


def _model(text: str | None, seed: int):
    """The sweep's acceptance model as parsed by the sweep (seed included); a trace path that does
    not resolve from here is tried under the repo; None when it cannot be read."""
    from dynspec.errors import DynspecError
    from dynspec.runtime.policy.acceptance import parse_acceptance

    if not text:
        return None
    try:
        return parse_acceptance(text, seed=seed)
    except DynspecError:
        if text.strip().lower().startswith("trace:") and not Path(text.strip()[6:].strip()).is_absolute():
            try:
                return parse_acceptance("trace:" + str(REPO / text.strip()[6:].strip()), seed=seed)
            except DynspecError:
                return None
        return None


def true_rates(table: Mapping, model) -> list[tuple[float, float, float | None]]:
    """(true rate, mean K, observed acceptance) of each request of a row's per_request table, in
    table order (replica, then finishing order); the rate is rate_of(resolve(model, n), key), n the
    replica's request count. Requests without a rate (real acceptance) or a K (no decode step) are
    left out. bernoulli-mix:0.9@0.5,0.2@0.5: every rate is 0.9 or 0.2."""
    from dynspec.runtime.policy.acceptance import rate_of, resolve

    if model is None or not table:
        return []
    f = list(table["fields"])
    ik, imk, iacc = f.index("key"), f.index("mean_k"), f.index("acceptance")
    out = []
    for rep in table.get("replicas") or ():
        m = resolve(model, max(len(rep), 1))
        for req in rep:
            rate = None if req[ik] is None else rate_of(m, req[ik])
            if rate is not None and req[imk] is not None:
                out.append((float(rate), float(req[imk]), req[iacc]))
    return out


def stride(xs: Sequence, n: int = SCATTER_POINTS) -> list:
    """At most n of xs, evenly spaced, first kept: 10 items, n 4 -> indices 0, 2, 5, 7."""
    return list(xs) if len(xs) <= n else [xs[i * len(xs) // n] for i in range(n)]


def scatter(named: Sequence[Mapping], model) -> dict | None:
    """Each scatter mode's requests at the largest closed-loop C >= SCATTER_MIN_C of the per-request
    mode: [true rate, mean K] points (stride), their count and, with few distinct rates, the
    median K per rate; None without such a C."""
    cs = [int(r["concurrency"]) for r in named
          if r["mode"] == PER_REQUEST and r.get("concurrency") is not None and r.get("per_request")]
    cs = [c for c in cs if c >= SCATTER_MIN_C]
    if not cs:
        return None
    c = max(cs)
    modes = {}
    for r in named:
        if r["mode"] in SCATTER_MODES and r.get("concurrency") == c and r.get("per_request"):
            reqs = true_rates(r["per_request"], model)
            by: dict = {}
            for rate, k, _ in reqs:
                by.setdefault(rate, []).append(k)
            modes[r["mode"]] = {"points": [[rate, k] for rate, k, _ in stride(reqs)], "requests": len(reqs),
                                "by_rate": ({f"{x:g}": statistics.median(by[x]) for x in sorted(by)}
                                            if 0 < len(by) <= BY_RATE_MAX else None)}
    return {"concurrency": c, "modes": modes}


def per_request_sweep(doc: Mapping) -> dict:
    """One sweep case -> per load point: tok/s and mean K per mode, load_ratios, the per-request
    policy's host cost per step (figures_adaptive.host_cost: None where its rows carry no step
    records) and the adaptive policy's beside it; and the scatter of K against true rate."""
    named = figure_rows(doc["rows"])
    modes = list(dict.fromkeys(r["mode"] for r in named))
    loads: dict = {}
    for r in named:
        key, name, text = load_label(r)
        loads.setdefault((key, name, text), {})[r["mode"]] = r
    by_load: dict = {}
    for (_, name, text), here in sorted(loads.items(), key=lambda kv: kv[0][0]):
        if PER_REQUEST not in here and "adaptive" not in here:
            continue
        e: dict = {"load": text,
                   "tok_per_s": {m: dict(spread(_trials(r)), median=r["output_tok_per_s"]) for m, r in here.items()},
                   "mean_k": {m: r.get("mean_k") for m, r in here.items()},
                   "p99_latency_s": {m: r.get("p99_latency_s") for m, r in here.items()}}
        e.update(load_ratios(here))
        e["host_cost"] = host_cost(here[PER_REQUEST]) if PER_REQUEST in here else None
        e["adaptive_host_cost"] = host_cost(here["adaptive"]) if "adaptive" in here else None
        by_load[name] = e
    env = doc["env"]
    text = env.get("acceptance_model") or next((r.get("acceptance_model") for r in named), None)
    out = {"by_load": by_load, "modes": modes, "acceptance_model": text, "seed": env.get("seed"),
           "workload": env.get("workload"), "scatter": scatter(named, _model(text, int(env.get("seed") or 0))),
           "commands": _commands(doc)}
    sp = split_at(named)
    return out if sp is None else dict(out, time_split=sp)     # runs before step_times: no key


def per_request_figures(docs: Mapping[str, Mapping]) -> dict:
    """{stage name (sweep, sweep_<case>): per_request_sweep} of every sweep stage of the config."""
    return {"sweeps": {name: per_request_sweep(doc) for name, doc in docs.items()}}


HEADER = ["sweep", "acceptance", "load", "per-request tok/s", "per-request / adaptive", "per-request / baseline",
          "adaptive / baseline", "per-request / best static K", "adaptive / best static K",
          "mean K (per-request, adaptive)", "per-request host cost per step"]


def _fmt_k(e: Mapping) -> str:
    """{"per-request": 2.345, "adaptive": 1.5} -> "2.35, 1.50"; a missing one "-"."""
    return ", ".join("-" if e["mean_k"].get(m) is None else f"{e['mean_k'][m]:.2f}" for m in SCATTER_MODES)


def _fmt_cost(e: Mapping) -> str:
    """The per-request host cost: "0.45% (1.20%)" (exposed, all; figures_adaptive's form),
    "not recorded" where its rows carry no step records, "-" without a per-request row."""
    if PER_REQUEST not in e["tok_per_s"]:
        return "-"
    h = e.get("host_cost")
    if not h:
        return "not recorded"
    return (f"{100 * h['exposed_fraction']:.2f}% ({100 * h['fraction']:.2f}%)" if "exposed_fraction" in h
            else f"{100 * h['fraction']:.2f}%")


def per_request_table(fig: Mapping) -> dict:
    rows = []
    for name, sw in fig["sweeps"].items():
        for e in sw["by_load"].values():
            pr = e["tok_per_s"].get(PER_REQUEST)
            best = f" ({e['best_static']})" if e.get("best_static") else ""
            rows.append([name, sw["acceptance_model"], e["load"], "-" if pr is None else f"{pr['median']:.1f}",
                         _fmt_ratio(e.get("per_request_vs_adaptive")), _fmt_ratio(e.get("per_request_vs_baseline")),
                         _fmt_ratio(e.get("adaptive_vs_baseline")),
                         _fmt_ratio(e.get("per_request_vs_best_static")) + best,
                         _fmt_ratio(e.get("adaptive_vs_best_static")) + best, _fmt_k(e), _fmt_cost(e)])
    notes = ["Ratios: median [min..max] of the per-trial ratios (trial t of every mode ran in one rotation at one"
             " load point); best static K: the static mode with the highest median tok/s there. At a Poisson point"
             " tok/s follows the arrival rate (p99_latency_s per mode is in summary.json)."]
    recorded = [e for sw in fig["sweeps"].values() for e in sw["by_load"].values() if e.get("host_cost")]
    notes.append("Host cost: median policy time / median step time over the per-request iterations, the exposed part"
                 " then all of it (figures_adaptive.host_cost)." if recorded else
                 "Host cost: not recorded — these per-request rows carry no per-iteration policy records"
                 " (adaptive_steps).")
    notes += [scatter_note(name, sw["scatter"]) for name, sw in fig["sweeps"].items() if sw.get("scatter")]
    notes += [split_note(name, sw["time_split"]) for name, sw in fig["sweeps"].items() if sw.get("time_split")]
    return {"header": HEADER, "rows": rows, "notes": notes}


def scatter_note(name: str, sc: Mapping) -> str:
    """'sweep_mix50 at C=64, median K by true rate: per-request 0.2 -> 0.40, 0.9 -> 3.10;
    adaptive 0.2 -> 1.80, 0.9 -> 1.80' (or the request counts where the rates are many)."""
    parts = []
    for m, s in sc["modes"].items():
        by = s.get("by_rate")
        parts.append(f"{m} " + (", ".join(f"{r} -> {k:.2f}" for r, k in by.items()) if by
                                else f"{s['requests']} requests"))
    return f"{name} at C={sc['concurrency']}, median K by true rate: " + "; ".join(parts)


def per_request_plot(fig: Mapping) -> dict:
    """"panels": {sweep: {"concurrency", "series": {mode: [[rate, K], ...]}}} (the scatter,
    per_request_png); "series": the closed-loop per-request / adaptive and / baseline ratios by C
    ([C, median, min, max]), for a plotter that draws lines only."""
    series: dict = {}
    for name, sw in fig["sweeps"].items():
        for key, e in sw["by_load"].items():
            for what in ("per_request_vs_adaptive", "per_request_vs_baseline"):
                r = e.get(what)
                if key.isdigit() and r and "median" in r:
                    series.setdefault(f"{name}: {what.replace('_vs_', ' / ')}", []).append(
                        [int(key), r["median"], r["min"], r["max"]])
    panels = {name: {"concurrency": sw["scatter"]["concurrency"],
                     "series": {m: s["points"] for m, s in sw["scatter"]["modes"].items()}}
              for name, sw in fig["sweeps"].items() if sw.get("scatter")}
    return {"title": "per-request K against the request's true acceptance rate", "x": "true acceptance rate",
            "y": "mean K of the request", "panels": panels, "series": series, "xlog": True}


def per_request_png(spec: Mapping, path) -> None:
    """The scatter panels of per_request_plot as a PNG: one panel a sweep (at most 3 a row), each
    mode's requests as points; without panels a single note that no requests were recorded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = spec.get("panels") or {}
    n = max(len(panels), 1)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    style = {PER_REQUEST: ("tab:green", "o"), "adaptive": ("tab:purple", "x")}
    for ax, (name, p) in zip(axes.flat, panels.items()):
        for m, pts in p["series"].items():
            if pts:
                color, marker = style.get(m, (None, "."))
                ax.scatter([x for x, _ in pts], [y for _, y in pts], s=14, alpha=0.55, c=color, marker=marker, label=m)
        ax.set_title(f"{name} (C={p['concurrency']})", fontsize=9)
        ax.set_xlabel(spec.get("x", ""), fontsize=8)
        ax.set_ylabel(spec.get("y", ""), fontsize=8)
        ax.set_xlim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if not panels:
        axes.flat[0].text(0.5, 0.5, "no per-request tables at C >= 16", ha="center", va="center")
    for ax in list(axes.flat)[len(panels) or 1:]:
        ax.set_visible(False)
    fig.suptitle(spec.get("title", ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
