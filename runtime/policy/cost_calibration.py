"""Served step time against the cost model's prediction, per option, from every pure-decode step
(docs/design.md, "The adaptive policy").

The profile times each (b, K) in isolation; a served step also pays what the profile does not
see (the draft-head refresh after a K=0 stretch, padding rows, a host that is busy elsewhere), and
the error is not the same for every K. The policy multiplies each profiled time by its option's
measured ratio, so a K whose served cost runs above its profile stops being chosen on the profile's
word alone.

Options (slots): 0 = K=0 plain decode, k = K=k speculation, max_k + 1 = K=0 with keep-warm,
max_k + 2 = a cold speculative step (rows whose draft head is rebuilt after plain decode: a
probe, or the first step back at K > 0), max_k + 3 = a ragged step (per-request K with rows at
different K_i, priced by split_cost.SplitCost: the whole-forward path, not the decode graphs).
A cold K=1 probe was measured at 6.27 ms where a warm K=1 step ran 5.83 and plain decode 5.10
(H200, b=16): pooled into slot 1 it would price the warm K=1 too high, and the probes too low.
Per slot, decayed sums of measured/predicted ratios with a half-life of `half_life` steps of that
slot (a slot that is not taken keeps its last ratio), each ratio clipped to [1/2, 2] so that one
stalled step (a garbage collection, a page fault) moves a scale by a bounded amount. A slot's
scale shrinks towards the pooled ratio g of every slot by `prior_weight` pseudo-steps:
    g = sum of all r / sum of all n   (1 with no data)      scale = (r + w g) / (n + w)
so a profile that is off by one factor everywhere (other clocks, another host) moves every K
alike and leaves the choice alone; only what differs between K's changes it. Shrinking towards 1
instead would make a K that ran once on a fast host look cheaper than the K's not yet run.
Worked example, w = 4, slot 1 measured at 1.10 and 1.14, slot 0 at 1.0 four times (half-life long):
    g = (2.24 + 4) / 6 = 1.04    slot 1: (2.24 + 4 x 1.04) / 6 = 1.067    slot 0: (4 + 4.16) / 8 = 1.02
    slot 2 (never run): 1.04
"""
from __future__ import annotations

from dataclasses import dataclass

from dynspec.errors import DynspecError

KEEP_WARM, COLD, RAGGED = -3, -2, -1     # scales()[...] of the slots after K = 0..max_k
EXTRA = 3                                # how many such slots


@dataclass(frozen=True)
class CostCalibration:
    max_k: int = 8
    half_life: float = 16.0          # steps of one slot
    prior_weight: float = 4.0
    ratios: tuple[float, ...] = ()   # [max_k + 4] decayed sums of measured / predicted
    counts: tuple[float, ...] = ()   # [max_k + 4] decayed step counts

    def __post_init__(self) -> None:
        if self.max_k < 0 or self.half_life <= 0 or self.prior_weight <= 0:
            raise DynspecError(f"cost calibration needs max_k >= 0, half_life > 0 and prior_weight > 0 "
                               f"(got {self.max_k}, {self.half_life}, {self.prior_weight})")
        zero = (0.0,) * (self.max_k + 1 + EXTRA)
        object.__setattr__(self, "ratios", tuple(self.ratios) or zero)
        object.__setattr__(self, "counts", tuple(self.counts) or zero)
        if len(self.ratios) != self.max_k + 1 + EXTRA or len(self.counts) != self.max_k + 1 + EXTRA:
            raise DynspecError(f"cost calibration sums must have {self.max_k + 1 + EXTRA} slots")
        object.__setattr__(self, "_scales", _pooled(self.ratios, self.counts, self.prior_weight))

    def slot(self, k: int, keep_warm: bool, cold: bool = False, ragged: bool = False) -> int:
        """cold: a K > 0 step with a row whose draft head is stale (Plan.stale), ragged or not (the
        refresh would price every ragged vector); ragged: a warm step whose rows drafted different
        K_i (Plan.row_k)."""
        if k == 0:
            return self.max_k + 1 if keep_warm else 0
        return self.max_k + 2 if cold else self.max_k + 3 if ragged else k

    def scales(self) -> tuple[float, ...]:
        """[max_k + 4] measured / predicted per slot (1.0 with no data at all; computed once, when the
        calibration is made)."""
        return self._scales

    def update(self, slot: int, measured_ms: float, predicted_ms: float) -> "CostCalibration":
        if not 0 <= slot <= self.max_k + EXTRA:
            raise DynspecError(f"cost calibration slot {slot} is outside 0..{self.max_k + EXTRA}")
        if not predicted_ms > 0 or not measured_ms >= 0:
            return self
        f = 0.5 ** (1.0 / self.half_life)
        ratios, counts = list(self.ratios), list(self.counts)
        ratios[slot] = ratios[slot] * f + min(2.0, max(0.5, measured_ms / predicted_ms))
        counts[slot] = counts[slot] * f + 1.0
        new = object.__new__(CostCalibration)           # same settings, new sums: no re-validation per step
        new.__dict__.update(max_k=self.max_k, half_life=self.half_life, prior_weight=self.prior_weight,
                            ratios=tuple(ratios), counts=tuple(counts),
                            _scales=_pooled(ratios, counts, self.prior_weight))
        return new


def _pooled(ratios, counts, w: float) -> tuple[float, ...]:
    """Each slot's scale (r + w g) / (n + w), g the pooled ratio of every slot (1 with no data)."""
    n_all = sum(counts)
    wg = w * (sum(ratios) / n_all if n_all > 0 else 1.0)
    return tuple([(r + wg) / (n + w) for r, n in zip(ratios, counts)])
