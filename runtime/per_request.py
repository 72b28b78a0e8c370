"""Per-request draft length: each decode row gets its own K_i, decided once per iteration before
anything is shaped (docs/design.md, "Per-request draft length").

A row policy answers `decide_rows(RowInputs) -> RowDecision`; the executor builds the inputs from
its row table (runtime/row_table.py: each request's own counts shrunk toward the pooled
estimate) and plans the step with row_k = the decision's ks (plan.StepPlan.row_k).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class RowInputs:
    batch_size: int                  # b decode rows
    context: float                   # mean KV length of the rows
    pool: tuple[float, ...]          # the pooled per-position estimate (AcceptanceEstimate.rates)
    rates: np.ndarray                # [b, P] each row's per-position rates, shrunk toward the pool
    idle: np.ndarray                 # [b] iterations since each row last drafted (0: it drafted last time)
    max_k: int                       # the largest K_i the engine and the token budget allow
    keep_warm: bool = True           # the engine may keep the draft warm at K=0


@dataclass(frozen=True)
class RowDecision:
    ks: tuple[int, ...]              # [b] K_i
    keep_warm: bool                  # all K_i = 0: extend the draft's cache over the new tokens
    predicted_ms: float | None       # the cost model's time of the step
    gain: float | None               # predicted tokens / ms over plain decode's
    probes: tuple[int, ...] = ()     # rows given K_i >= 1 to measure their acceptance
    reason: str = "best"

    @property
    def k(self) -> int:
        return max(self.ks, default=0)

    @property
    def probe(self) -> bool:
        return bool(self.probes)


@runtime_checkable
class RowPolicy(Protocol):
    """A Policy (runtime/policy.py) that sets each row's K."""

    shrinkage: float                 # pseudo-trials of the pool in each row's rates (row_table.py)

    def decide_rows(self, inputs: RowInputs) -> RowDecision: ...
