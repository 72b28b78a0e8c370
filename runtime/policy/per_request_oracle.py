"""The per-request oracle: the per-request policy told each request's true acceptance rate
(benchmarks only; docs/design.md, "Per-request draft length").

It runs PerRequestPolicy's allocation and rules unchanged (the same cost model, cap, margin and
uniform-vector rule) on rates it reads from the acceptance model instead of learning them: a
Bernoulli mix knows each request's p, trace replay its share of accepted first drafts
(acceptance.rate_of). It never probes (it has nothing to learn). Its throughput is the ceiling of
any learned per-request policy on the same engine and cost model, so a learned policy is judged by
the share of the oracle's gain over the batch-level adaptive policy that it reaches:
    share = (per-request - adaptive) / (oracle - adaptive)
Worked example: adaptive 5000 tok/s, oracle 6000, per-request 5850 -> share 0.85.
The executor refuses it on real (greedy) acceptance, where no rate is known: it is never served.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from dynspec.errors import DynspecError
from dynspec.runtime.policy.per_request import PerRequestPolicy, RowInputs, Truth
from dynspec.runtime.policy.row_table import RowTable
from dynspec.runtime.policy.step_decision import StepDecision


class PerRequestOracle(PerRequestPolicy):
    """PerRequestPolicy on each request's true rate at every position (module docstring)."""

    def row_rates(self, table: RowTable, slots: Sequence[int], pool: Sequence[float], keys: Sequence[int],
                  truth: Truth | None) -> np.ndarray:
        """[b, P] the true rate of each row's request, the same at every position."""
        rates = [truth(k) for k in keys] if truth is not None else [None]
        if any(r is None for r in rates):
            raise DynspecError("the per-request oracle needs a benchmark acceptance model that knows each request's"
                               " rate (bernoulli, bernoulli-mix, shift or trace); real acceptance has none")
        return np.repeat(np.asarray(rates, dtype=np.float64)[:, None], table.positions, axis=1)

    def decide_rows(self, x: RowInputs) -> StepDecision:
        """PerRequestPolicy's decision with no row due for a probe."""
        return super().decide_rows(replace(x, idle=np.zeros(x.batch_size, dtype=np.int64), probes=()))

    def __str__(self) -> str:
        return "per-request oracle: " + super().__str__()
