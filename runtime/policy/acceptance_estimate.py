"""Online estimate of per-position draft acceptance, pooled over the batch, from every verify step.

a_j = P(draft j accepted | drafts 1..j-1 accepted), j = 1..K. A verify step at K with accepted
counts n_r (one per decode row) gives, for each position j <= K:
    trials_j = #rows with n_r >= j-1   (the rows whose window reached draft j)
    hits_j   = #rows with n_r >= j
Worked example, K=3, accepted (3, 0, 1):
    trials = (3, 2, 1)    hits = (2, 1, 1)    -> this step alone: a = (2/3, 1/2, 1)

Decay: counts are exponentially forgotten per drafted row, with a half-life of `half_life` rows
at position 1 (every position decays by the same factor, 2^(-rows / half_life), so a position
the policy stopped drafting fades with time, not only when it is drafted again). Half-life 64:
at b=1 an observation loses half its weight after 64 verify steps; at b=64, after one.

Rates shrink towards a prior chain (pseudo-count `prior_weight`):
    a_1 = (h_1 + w * prior_1) / (n_1 + w)
    a_j = (h_j + w * a_{j-1}) / (n_j + w)        j >= 2: an unmeasured position follows the one before
so positions that were not drafted lately (K stayed low) assume the acceptance of the last
measured one, and with no data at all the estimate is the prior.

Retirement: when decode rows leave the batch, their share of the counts goes with them
(`forget(kept / before)`), and the prior becomes the estimate's a_1 of that moment. At b=1 the
next request starts from the last one's a_1 with the prior's weight only, so requests of
different acceptance (a mix of code and chat) are each measured within a few steps; at b=64 a
retirement forgets 1/64.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from dynspec.errors import DynspecError

HALF_LIFE_ROWS = 64.0
PRIOR_WEIGHT = 4.0


@dataclass(frozen=True)
class AcceptanceEstimate:
    prior: float = 0.5                   # a_1 with no data
    positions: int = 8                   # how many draft positions are tracked
    half_life: float = HALF_LIFE_ROWS    # rows at position 1
    prior_weight: float = PRIOR_WEIGHT
    hits: tuple[float, ...] = ()         # [positions] decayed accepted counts
    trials: tuple[float, ...] = ()       # [positions] decayed drafted counts

    def __post_init__(self) -> None:
        if not 0.0 <= self.prior <= 1.0:
            raise DynspecError(f"acceptance prior {self.prior} is outside [0, 1]")
        if self.positions < 1 or self.half_life <= 0 or self.prior_weight <= 0:
            raise DynspecError(f"acceptance estimate needs positions >= 1, half_life > 0 and prior_weight > 0 "
                               f"(got {self.positions}, {self.half_life}, {self.prior_weight})")
        zero = (0.0,) * self.positions
        object.__setattr__(self, "hits", tuple(self.hits) or zero)
        object.__setattr__(self, "trials", tuple(self.trials) or zero)
        if len(self.hits) != self.positions or len(self.trials) != self.positions:
            raise DynspecError(f"acceptance estimate counts must have {self.positions} positions")
        object.__setattr__(self, "_rates", _chain(self.prior, self.prior_weight, self.hits, self.trials))

    def rates(self) -> tuple[float, ...]:
        """(a_1, ..., a_positions), each in [0, 1] (computed once, when the estimate is made)."""
        return self._rates

    @property
    def rows_seen(self) -> float:
        """Decayed count of rows drafted at position 1 (how much the estimate rests on data)."""
        return self.trials[0]

    def update(self, k: int, accepted: Sequence[int], row_k: Sequence[int] | None = None) -> "AcceptanceEstimate":
        """The estimate after one verify step at K with these per-row accepted counts (K=0 or no
        rows: unchanged). Accepted counts beyond `positions` are clipped to it. row_k: each row's
        own K_i (a per-request step); a row that accepted all K_i < K was not tried at K_i + 1.
        k 3, accepted (1, 2), row_k (3, 2): position 1 tried 2, hit 2; 2: tried 2, hit 1; 3: none."""
        rows = len(accepted)
        if k <= 0 or rows == 0:
            return self
        depth = min(k, self.positions)
        drafting = rows if row_k is None else sum(1 for x in row_k if x > 0)   # the clock: rows drafted at 1
        f = 0.5 ** (drafting / self.half_life)
        if not isinstance(accepted, (tuple, list)):
            accepted = tuple(accepted)
        hits, trials = [h * f for h in self.hits], [t * f for t in self.trials]   # positions past K: decay only
        if row_k is None or all(x == k for x in row_k):
            rejected, capped = accepted.count, None     # rows rejected at j + 1 (a C-level count)
        else:                                           # a row that accepted all its K_i stops untried
            rejected = Counter(n for n, kr in zip(accepted, row_k) if n < kr).__getitem__
            capped = Counter(kr for n, kr in zip(accepted, row_k) if n >= kr)
        reached = rows                        # #rows with n_r >= j at position j + 1
        for j in range(depth):
            cut = capped[j] if capped else 0  # rows at their own K_i = j: not tried at j + 1
            trials[j] += reached - cut
            reached -= cut + rejected(j)
            hits[j] += reached
        new = object.__new__(AcceptanceEstimate)        # same settings, new counts: no re-validation per step
        new.__dict__.update(prior=self.prior, positions=self.positions, half_life=self.half_life,
                            prior_weight=self.prior_weight, hits=tuple(hits), trials=tuple(trials),
                            _rates=_chain(self.prior, self.prior_weight, hits, trials))
        return new

    def forget(self, keep: float) -> "AcceptanceEstimate":
        """The counts scaled by `keep` in [0, 1] (the share of the batch's rows still in it), the
        prior moved to the current a_1. forget(1.0) is the estimate itself."""
        if not 0.0 <= keep <= 1.0:
            raise DynspecError(f"acceptance estimate: keep {keep} is outside [0, 1]")
        if keep == 1.0:
            return self
        return AcceptanceEstimate(self.rates()[0], self.positions, self.half_life, self.prior_weight,
                                  tuple(h * keep for h in self.hits), tuple(n * keep for n in self.trials))


def _chain(prior: float, w: float, hits: Sequence[float], trials: Sequence[float]) -> tuple[float, ...]:
    """The module docstring's chain of shrunk rates: a_1 towards the prior, a_j towards a_{j-1}."""
    out, prev = [], prior
    for h, n in zip(hits, trials):
        prev = (h + w * prev) / (n + w)
        out.append(prev)
    return tuple(out)
