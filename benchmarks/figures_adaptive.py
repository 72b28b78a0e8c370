"""Adaptive figures (summary.suite_figures "adaptive"): the adaptive mode of each sweep against
every other mode, its policy's host cost per step and how fast it settles after an acceptance
shift. Pure functions of sweep JSON."""
from __future__ import annotations

from typing import Mapping, Sequence

from dynspec.benchmarks.figures_common import _closed, _commands, _fmt_ratio, _trials, figure_rows, paired_ratio, spread


SETTLE_TOLERANCE = 0.05


def _steps(row: Mapping) -> tuple[list[str], list[list[list]]]:
    """The adaptive row's (fields, trials [replica [iteration record]])."""
    st = row.get("adaptive_steps") or {}
    return list(st.get("fields") or ()), list(st.get("trials") or ())


def host_cost(row: Mapping) -> dict | None:
    """median policy_us / median step_us over every adaptive iteration of the row's trials and
    replicas: policy 20, 30, 25 us and steps 10000, 12000, 11000 us -> 25 / 11000 = 0.00227; the
    same of policy_exposed_us (the part no launched step ran under; runtime/serving/executor.py) where
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
    named = figure_rows(doc["rows"])
    modes = list(dict.fromkeys(r["mode"] for r in named))
    rows = {m: _closed(named, m) for m in modes}
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
