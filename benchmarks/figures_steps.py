"""Where a mode's time goes, by kind of iteration: the median trial's step_times of each row
(benchmarks/sweep_rows.py), summed over replicas into prompt-only steps (no decode row), decode
steps at K=0 and at K>0, and mixed steps (prompt tokens beside decode rows) at K=0 and at K>0;
"catch-up" overlays the steps that wrote a lazy catch-up. Pure functions of sweep rows.

Worked example, one replica, steps (b, K, prompt tokens, catch-up entries, us):
    (0, 0, 8192, 0, 250000.0), (200, 0, 0, 0, 13000.0), (180, 0, 128, 0, 22000.0), (40, 1, 0, 96, 9000.0)
    -> {"prompt only": [1, 250.0], "decode K=0": [1, 13.0], "mixed K=0": [1, 22.0], "decode K>0": [1, 9.0],
        "mixed K>0": [0, 0.0], "catch-up": [1, 9.0]}
"""
from __future__ import annotations

from typing import Mapping, Sequence

KINDS = ("prompt only", "decode K=0", "decode K>0", "mixed K=0", "mixed K>0")
CATCH_UP = "catch-up"


def step_kind(batch_size: int, k: int, prefill_tokens: int) -> str:
    """(0, 0, 512) -> "prompt only"; (64, 0, 0) -> "decode K=0"; (64, 2, 128) -> "mixed K>0"."""
    if not batch_size:
        return "prompt only"
    return f"{'mixed' if prefill_tokens else 'decode'} K{'>0' if k else '=0'}"


def time_split(step_times: Mapping) -> dict[str, list]:
    """{kind: [steps, ms]} of one row's step_times, every KINDS entry and CATCH_UP (module docstring)."""
    f = list(step_times["fields"])
    ib, ik, ip, ic, iu = (f.index(x) for x in ("batch_size", "k", "prefill_tokens", "catch_up_tokens", "step_us"))
    out = {kind: [0, 0.0] for kind in (*KINDS, CATCH_UP)}
    for rep in step_times.get("replicas") or ():
        for s in rep:
            for kind in (step_kind(s[ib], s[ik], s[ip]),) + ((CATCH_UP,) if s[ic] else ()):
                out[kind][0] += 1
                out[kind][1] += s[iu] / 1e3
    return {kind: [n, round(ms, 1)] for kind, (n, ms) in out.items()}


def split_at(rows: Sequence[Mapping]) -> dict | None:
    """The time split of every mode at the largest closed-loop C whose rows carry step_times:
    {"concurrency": C, "modes": {mode: time_split}}; None where no row carries them (older runs)."""
    cs = [int(r["concurrency"]) for r in rows if r.get("concurrency") is not None and r.get("step_times")]
    if not cs:
        return None
    c = max(cs)
    return {"concurrency": c, "modes": {r["mode"]: time_split(r["step_times"]) for r in rows
                                        if r.get("concurrency") == c and r.get("step_times")}}


def _kinds(split: Mapping) -> str:
    return ", ".join(f"{kind} {ms:.0f} ({n})" for kind, (n, ms) in split.items() if n and kind != CATCH_UP) + (
        f"; catch-up in {split[CATCH_UP][0]} of them" if split.get(CATCH_UP, [0])[0] else "")


def split_note(name: str, sp: Mapping, base: str = "baseline") -> str:
    """One line: each mode's ms in steps by kind (steps), and each mode's difference from `base`
    by kind, e.g. 'sweep_mix50 at C=256, ms in steps by kind (steps), median trial: baseline
    decode K=0 2449 (269), ...; adaptive - baseline: decode K=0 -1063, decode K>0 +1109, ... = +17 ms'."""
    modes = sp["modes"]
    parts = [f"{m}: {_kinds(s)}" for m, s in modes.items()]
    if base in modes:
        for m, s in modes.items():
            if m == base:
                continue
            d = {kind: s[kind][1] - modes[base][kind][1] for kind in KINDS}
            parts.append(f"{m} - {base}: " + ", ".join(f"{kind} {v:+.0f}" for kind, v in d.items() if round(v))
                         + f" = {sum(d.values()):+.0f} ms")
    return f"{name} at C={sp['concurrency']}, ms in steps by kind (steps), median trial: " + "; ".join(parts)
