"""What every kind of suite figures shares: sweep rows by mode and C, spreads over trials, paired
per-trial ratios and their formatting. Pure functions of result JSON."""
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


OVERLAP = "+overlap"        # the figures' name of a mode's overlapped-loop twin: 'dynamic+overlap' (figure_rows)


def row_loop(row: Mapping) -> str:
    """A sweep row's executor loop, "serial" | "overlap": its `loop`, else (rows that do not record
    it) its mode's suffix: {"mode": "dynamic+overlap"} -> "overlap"; {"mode": "dynamic"} -> "serial"."""
    return row.get("loop") or ("overlap" if row["mode"].endswith(OVERLAP) else "serial")


def overlap_twins(rows: Sequence[Mapping]) -> set[str]:
    """The modes (as the rows name them) run by the overlapped loop of a sweep that ran the serial
    loop too: their figures are their serial twins' with OVERLAP ({"baseline+serial": serial,
    "baseline": overlap} -> {"baseline"}); empty when one loop ran every mode."""
    loops = {r["mode"]: row_loop(r) for r in rows}
    return {m for m, loop in loops.items() if loop == "overlap"} if set(loops.values()) == {"serial", "overlap"} else set()


def figure_rows(rows: Sequence[Mapping]) -> list[Mapping]:
    """The rows under the names the figures key on: each mode's policy part (sweep_modes.split_mode),
    and OVERLAP after it for the overlapped loop's modes of a sweep that ran both loops. Serial
    beside overlapped ('baseline+serial', 'baseline+overlap' or, on CPU, 'baseline',
    'baseline+overlap') -> 'baseline', 'baseline+overlap'; one loop ('baseline', 'dynamic+overlap')
    -> 'baseline', 'dynamic'."""
    from dynspec.benchmarks.sweep_modes import split_mode

    twins = overlap_twins(rows)
    out = []
    for r in rows:
        name = split_mode(r["mode"])[0] + (OVERLAP if r["mode"] in twins else "")
        out.append(r if name == r["mode"] else {**r, "mode": name})
    return out


SWEEP_MODES = ("baseline", "static", "dynamic")


def _fmt_ratio(r: Mapping | None) -> str:
    if not r:
        return "-"
    if "median" not in r:
        return f"{r['of_medians']:.3f}"
    return f"{r['median']:.3f} [{r['min']:.3f}..{r['max']:.3f}]"


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


def verdict(a: Mapping, b: Mapping) -> str:
    """a against b from their trials: "tie" when the min..max spreads overlap, else "win" / "loss".

    a 100 [95..104] vs b 90 [86..96] -> "tie";  a 100 [98..104] vs b 90 [86..96] -> "win"."""
    lo_a, hi_a = a.get("tok_per_s_min", a["output_tok_per_s"]), a.get("tok_per_s_max", a["output_tok_per_s"])
    lo_b, hi_b = b.get("tok_per_s_min", b["output_tok_per_s"]), b.get("tok_per_s_max", b["output_tok_per_s"])
    if lo_a <= hi_b and lo_b <= hi_a:
        return "tie"
    return "win" if lo_a > hi_b else "loss"
