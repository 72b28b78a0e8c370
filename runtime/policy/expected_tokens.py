"""E[tokens a row gains per step | K drafts]: the one definition the policies, `dynspec tune` and the
start-up tuning share (docs/design.md, "The adaptive policy")."""
from __future__ import annotations

from typing import Sequence

from dynspec.errors import DynspecError


def expected_tokens(k: int, acceptance: float | Sequence[float]) -> float:
    """E[tokens per row per step | K drafts] under one rate or per-position conditional rates
    (the policy's and `dynspec tune`'s): 1 + sum_{i<=K} prod_{j<=i} a_j.
    expected_tokens(3, 0.7) = 1 + 0.7 + 0.49 + 0.343 = 2.533."""
    if k < 0:
        raise DynspecError(f"negative draft length K={k}")
    if isinstance(acceptance, (int, float)):
        a = float(acceptance)
        if not 0.0 <= a <= 1.0:
            raise DynspecError(f"acceptance rate {a} is outside [0, 1]")
        return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
    rates = [float(x) for x in acceptance]
    for i, a in enumerate(rates[:k]):
        if not 0.0 <= a <= 1.0:
            raise DynspecError(f"per-position acceptance rate {i + 1} = {a} is outside [0, 1]")
    return _expected_upto(k, rates)[k]


def _expected_upto(k: int, rates: Sequence[float]) -> list[float]:
    """[E(0), E(1), .., E(k)] of expected_tokens, built position by position (rates unchecked).
    rates (0.5, 0.5): [1, 1.5, 1.75]."""
    if k > len(rates):
        raise DynspecError(f"K={k} needs {k} per-position acceptance rates; {len(rates)} given")
    out, e, run = [1.0], 1.0, 1.0
    for a in rates[:k]:
        run *= a
        e += run
        out.append(e)
    return out
