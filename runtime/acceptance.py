"""How many drafted tokens a verify step accepts.

`Greedy` is the real, lossless rule: accept the longest prefix of drafts that equals the
target's own greedy tokens. `Bernoulli(p)` is a labelled benchmark model for random-weight
checkpoints, where real acceptance is meaningless: each draft is accepted with probability p,
in order, until the first rejection. Its output is NOT the target's greedy output, so only the
benchmarks may use it (the executor refuses it unless told it runs a benchmark).

Worked example, K=3:
    drafts   [a, b, c]      target greedy [a, b, x, y]
    match    [1, 1, 0]   -> cumprod [1, 1, 0] -> accepted 2; emitted [a, b, x]
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from dynspec.errors import DynspecError


@dataclass(frozen=True)
class Greedy:
    @property
    def lossless(self) -> bool:
        return True

    def __str__(self) -> str:
        return "real"


@dataclass(frozen=True)
class Bernoulli:
    p: float
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise DynspecError(f"acceptance probability {self.p} is outside [0, 1]")

    @property
    def lossless(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"bernoulli:{self.p:g}"


AcceptanceModel = Greedy | Bernoulli


def parse_acceptance(text: str, seed: int = 0) -> AcceptanceModel:
    """'real' -> Greedy(); 'bernoulli:0.7' -> Bernoulli(0.7)."""
    t = text.strip().lower()
    if t in ("real", "greedy"):
        return Greedy()
    m = re.fullmatch(r"bernoulli:([0-9]*\.?[0-9]+)", t)
    if not m:
        raise DynspecError(f"acceptance model {text!r} is not 'real' or 'bernoulli:P' (e.g. bernoulli:0.7)")
    return Bernoulli(float(m.group(1)), seed)


def accepted_prefix(match):
    """[B, K] bool/0-1 tensor -> [B] length of the leading run of ones (torch, graph-safe)."""
    return match.long().cumprod(dim=1).sum(dim=1)
