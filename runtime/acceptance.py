"""How many drafted tokens a verify step accepts.

`Greedy` is the real, lossless rule: accept the longest prefix of drafts that equals the
target's own greedy tokens. `Bernoulli(p)` is a labelled benchmark model for random-weight
checkpoints, where real acceptance is meaningless: each draft is accepted with probability p,
in order, until the first rejection. Its output is NOT the target's greedy output, so only the
benchmarks may use it (the executor refuses it unless told it runs a benchmark).

A Bernoulli draft is accepted iff u(seed, request key, position) < p, where u is a hash of the
drafted token's position in its request (`draft_uniforms`), not a draw from a stream. So, as
with a real draft, whether position j is accepted is a property of the request, the same for
every K, mode and trial (common random numbers): comparing static K=3 with a dynamic K=4 on
the same requests then measures the K, not the luck of the draws.

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


_M31 = 0x7FFFFFFF


def draft_uniforms(seed, key, positions):
    """u in [0, 1) for drafted tokens: seed (int or 0-d int64 tensor), key [B] each row's request
    key, positions [B, K] the drafts' positions -> [B, K] float32 (torch, graph-safe: int64 ops
    only, every product below 2^62). A fixed integer hash, so u depends on nothing else.
    Example: draft_uniforms(0, tensor([7]), tensor([[12, 13]])) is the same in every run."""
    x = ((key[:, None] & _M31) * 0x2545F491 & _M31) + ((positions & _M31) * 0x6C8E9CF5 & _M31)
    x = (x + ((seed & _M31) * 0x1B873593 & _M31)) & _M31
    for c in (0x2C1B3C6D, 0x297A2D39):        # xorshift-multiply rounds: each a bijection mod 2^31
        x = (x ^ (x >> 15)) * c & _M31
    x = x ^ (x >> 16)
    return (x >> 7).float() * (1.0 / (1 << 24))   # 24 bits: exact in float32, at most 1 - 2^-24


def accepted_prefix(match):
    """[B, K] bool/0-1 tensor -> [B] length of the leading run of ones (torch, graph-safe)."""
    return match.long().cumprod(dim=1).sum(dim=1)
