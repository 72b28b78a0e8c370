"""What a draft-length policy reads and answers each iteration (runtime/policy/__init__.py, "Policy").

The executor (runtime/serving/planning.py KDecider) builds one StepInputs per iteration with decode rows,
holding everything any policy reads, and every policy answers `decide(StepInputs) -> StepDecision`:
the K of each row (`ks`; K = max K_i), whether a K=0 step keeps the draft warm, the cost model's
time of the step, the predicted gain over plain decode, the rows drafting to measure their
acceptance (probes) and why. A schedule or a constant K gives every row one K (one_k):

    3 rows, schedule "4:2"      -> StepDecision(ks=(2, 2, 2), keep_warm=True), k 2
    3 rows, a per-row decision  -> StepDecision(ks=(3, 0, 1), ..., probes=(2,)), k 3, probe True
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, eq=False)
class StepInputs:
    """One iteration's inputs. The first eleven fields are the batch-level rule's
    (runtime/policy/adaptive.py, PolicyInputs); the rest are each row's, for a policy that sets each row's K."""

    batch_size: int                  # b decode rows
    context: float                   # mean KV length of the decode rows
    acceptance: tuple[float, ...]    # the pooled per-position estimate a_1, a_2, ... (AcceptanceEstimate.rates)
    previous_k: int = 0              # K of the last iteration with decode rows
    since_spec: int = 0              # iterations with rows since the last one at K > 0
    max_k: int = 32                  # the largest K the engine and this iteration's token budget allow
    bucket: int = 0                  # padded rows the step runs at (0: batch_size)
    cost_scale: tuple[float, ...] = ()   # CostCalibration.scales() (empty: all 1)
    keep_warm: bool = True           # the engine may keep the draft warm at K=0
    plain_steps: float = math.inf    # plain-decode steps calibrated (CostCalibration.counts[0]; inf: none to explore)
    probes: int = 0                  # probes run since the last speculative step that was not a probe
    rates: "np.ndarray | None" = None    # [b, P] each row's rates as the policy reads them (its row_rates);
                                         # None: the policy reads none
    idle: Sequence[int] = ()         # [b] iterations since each row last drafted (0: it drafted last time)
    row_probes: Sequence[int] = ()   # [b] each row's probes since it last drafted other than as a probe
    packed: bool = True              # the engine verifies each row's K_i + 1 tokens in this step (Engine.packs_rows;
                                     # without a prompt chunk: packs_rows_alone); False: every row padded to max K_i
    waiting: tuple[int, ...] = ()    # prompt tokens each waiting request still needs, in chunk order
                                     # (runtime/policy/prefill_price.py); empty: no prompt waits
    token_budget: int = 0            # the engine's max_num_tokens (0: unknown)
    lazy: bool = False               # lazy draft sync: what a K=0 step leaves behind, a drafting step catches up
    behind: int = 0                  # lazy: the draft entries this step catches up first if it drafts
                                     # (runtime/serving/draft_sync.py: each row's min(draft_behind, cap) - 1)


@dataclass(frozen=True)
class StepDecision:
    ks: tuple[int, ...]              # [b] K_i
    keep_warm: bool                  # all K_i = 0: extend the draft's cache over the new tokens
    predicted_ms: float | None = None    # the cost model's time of the step, unscaled (None: not predicted)
    gain: float | None = None        # predicted tokens / ms over plain decode's (None: not predicted)
    probes: tuple[int, ...] = ()     # rows given K_i >= 1 to measure their acceptance
    reason: str = "best"
    policy: str = "schedule"         # what chose K, the iteration stats' label: schedule | adaptive | per-request

    @property
    def k(self) -> int:
        return max(self.ks, default=0)

    @property
    def probe(self) -> bool:
        return bool(self.probes)

    def capped(self, max_k: int) -> "StepDecision":
        """Every K_i at most max_k: ks (4, 1) capped at 3 -> (3, 1)."""
        return replace(self, ks=tuple(min(k, max_k) for k in self.ks))


def one_k(k: int, x: StepInputs) -> StepDecision:
    """K for every row of the step, the executor's keep-warm at K=0: a schedule's decision."""
    return StepDecision((int(k),) * x.batch_size, x.keep_warm)
