"""Per-request acceptance counts of the requests in flight, one row per cache slot, and their
shrunk per-position rates (docs/design.md, "Per-request draft length").

A row that drafted K_i and accepted n_i was tried at positions 1..min(n_i + 1, K_i) and accepted
at 1..n_i: position j is tried only once j - 1 were accepted, so hits / trials at j estimates the
conditional rate a_j. The counts are numpy arrays updated for every row of a step at once (a
policy decided every iteration at b = 256 rows cannot afford an object per row).

Shrinkage toward the pool (the executor's AcceptanceEstimate) with `weight` pseudo-trials:
    r_j = (hits_j + weight * pool_j) / (trials_j + weight)
Worked example, pool (0.6, 0.5), weight 4, a request that drafted K=2 four times and accepted
2, 2, 2, 0: position 1 tried 4 times, 3 hits; position 2 tried 3 times, 3 hits;
    r_1 = (3 + 2.4) / 8 = 0.675        r_2 = (3 + 2.0) / 7 = 0.714
A request just admitted has no counts: r = pool.

The per-request policy reads the optimistic form (`optimistic`): the same Beta posterior, each
position's mean plus z standard deviations, so a row with few trials is priced as if it might be
easy and drafts early, while its own trials quickly pull it to its rate. Posterior at position j:
    a_j = hits_j + weight * pool_j        b_j = misses_j + weight * (1 - pool_j)
    ucb_j = a_j / (a_j + b_j) + z * sqrt(mean (1 - mean) / (a_j + b_j + 1))
Worked example, pool 0.3 at every position, weight 1, z 1:
    new row                     mean .30  ucb .30 + sqrt(.21 / 2)   = .62
    accepts 3 of 3 at j = 1     mean .83  ucb .83 + sqrt(.144 / 5)  = 1.0, capped at UCB_CAP .99
    rejects 3 of 3 at j = 1     mean .075 ucb .075 + sqrt(.069 / 5) = .19
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dynspec.errors import DynspecError


UCB_CAP = 0.99        # no optimistic rate reaches 1: E[tokens | K] stays finite in K


def _padded(pool: Sequence[float], positions: int) -> list[float]:
    """The pool's rates over `positions`, its last rate repeated (0.5 for an empty pool)."""
    p = list(pool[:positions])
    return p + [p[-1] if p else 0.5] * (positions - len(p))


class RowTable:
    """hits / trials [slots, positions] (float64): counts of the request holding each slot."""

    def __init__(self, slots: int, positions: int):
        if slots < 1 or positions < 1:
            raise DynspecError(f"row table needs slots >= 1 and positions >= 1 (got {slots}, {positions})")
        self.hits = np.zeros((slots, positions))
        self.trials = np.zeros((slots, positions))
        self._j = np.arange(1, positions + 1)                          # [P] positions 1..P

    @property
    def positions(self) -> int:
        return self.hits.shape[1]

    def reset(self, slot: int) -> None:
        """A new request took `slot`: no counts (it starts at the pool's rates)."""
        self.hits[slot] = 0.0
        self.trials[slot] = 0.0

    def update(self, slots: Sequence[int], ks: Sequence[int], accepted: Sequence[int]) -> None:
        """One step's rows: slot, K_i drafted, n_i accepted (n_i <= K_i).
        slots (3, 5), ks (2, 1), accepted (1, 1): slot 3 tried at 1, 2, hit at 1; slot 5 tried
        and hit at 1."""
        if len(slots) == 1:                            # one row (C = 1): no arrays
            k, n, row = ks[0], accepted[0], slots[0]
            if n > k:
                raise DynspecError(f"accepted {list(accepted)} exceeds the drafted {list(ks)}")
            self.trials[row, :min(n + 1, k)] += 1.0
            self.hits[row, :n] += 1.0
            return
        s = np.asarray(slots, dtype=np.int64)
        k = np.asarray(ks, dtype=np.int64)[:, None]
        n = np.asarray(accepted, dtype=np.int64)[:, None]
        if np.any(n > k):
            raise DynspecError(f"accepted {list(accepted)} exceeds the drafted {list(ks)}")
        j = self._j[None, :]                                           # [1, P]
        np.add.at(self.trials, s, (j <= np.minimum(n + 1, k)).astype(np.float64))
        np.add.at(self.hits, s, (j <= n).astype(np.float64))

    def optimistic(self, slots: Sequence[int], pool: Sequence[float], weight: float, z: float) -> np.ndarray:
        """[b, P] each slot's upper confidence rate per position (module docstring), in [0, UCB_CAP]."""
        if weight <= 0 or z < 0:
            raise DynspecError(f"optimistic rates: weight {weight} must be > 0 and z {z} >= 0")
        s = np.asarray(slots, dtype=np.int64)
        p = np.array(_padded(pool, self.positions))
        n = self.trials[s] + weight
        mean = (self.hits[s] + weight * p) / n
        return np.minimum(mean + z * np.sqrt(mean * (1.0 - mean) / (n + 1.0)), UCB_CAP)

    def rates(self, slots: Sequence[int], pool: Sequence[float], weight: float) -> np.ndarray:
        """[b, P] each slot's per-position rates shrunk toward `pool` ([P] conditional rates)."""
        if weight <= 0:
            raise DynspecError(f"shrinkage weight {weight} must be > 0")
        p = _padded(pool, self.positions)
        if len(slots) == 1:                            # one row (C = 1): two reads, the rest in Python
            h, t = self.hits[slots[0]].tolist(), self.trials[slots[0]].tolist()
            return np.array([[(hj + weight * pj) / (tj + weight) for hj, tj, pj in zip(h, t, p)]])
        s = np.asarray(slots, dtype=np.int64)
        return (self.hits[s] + weight * np.array(p)) / (self.trials[s] + weight)
