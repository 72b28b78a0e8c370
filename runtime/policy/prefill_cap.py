"""Prefill-aware K for a schedule (docs/design.md, "Prefill-aware K"): an iteration that ends a
waiting prompt's prefill runs at K <= prefill_k, so that prompt's first token comes out of a
shorter step; every other iteration runs the schedule's K. A schedule has no cost model to weigh
the prompt's wait against the rows' tokens (the cost-model policies weigh it: prefill_price.py),
so the cap is the operator's setting, and its trade-off is measured (`sim_ttft`).

    schedule 68:2, prefill_k 0, budget 8192, b = 40 rows:
      prompts waiting (100, 300)  K=2 leaves 8192 - 120 tokens, both prompts end in it  -> K = 0
      no prompt waiting                                                                  -> K = 2
      b = 100 (above 68)          the schedule's K is 0 already                          -> K = 0

The reference engine only: TensorRT-LLM's dynamic draft length reads the batch size alone.
Pure: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule, one_k
from dynspec.runtime.policy.prefill_price import finishing
from dynspec.runtime.policy.step_decision import StepDecision, StepInputs


@dataclass(frozen=True)
class PrefillCap:
    """A DraftSchedule with K capped at prefill_k on the iterations that end a prompt's prefill."""
    schedule: DraftSchedule
    prefill_k: int
    registered_as = "schedule"       # POLICIES' name for it (runtime/policy/__init__.py registered_name)

    def __post_init__(self) -> None:
        if isinstance(self.prefill_k, bool) or not isinstance(self.prefill_k, int) or self.prefill_k < 0:
            raise DynspecError(f"prefill K {self.prefill_k!r} must be an integer >= 0")

    # ---- Policy (runtime/policy/__init__.py) -------------------------------------------------------
    @property
    def max_draft_len(self) -> int:
        return self.schedule.max_draft_len

    @property
    def drafts(self) -> bool:
        return self.schedule.drafts

    @property
    def chooses_keep_warm(self) -> bool:
        return self.schedule.chooses_keep_warm

    @property
    def reads_prompts(self) -> bool:
        """The executor hands it the prompts waiting (StepInputs.waiting)."""
        return True

    def choices(self, batch_size: int) -> tuple[int, ...]:
        """The schedule's choices at b, and the cap where it is lower: "68:2" capped at 1 -> (0, 1, 2) at b=40."""
        return tuple(sorted({*self.schedule.choices(batch_size), min(self.prefill_k, self.schedule.draft_len(batch_size))}))

    def decide(self, x: StepInputs) -> StepDecision:
        k = self.schedule.draft_len(self.schedule.emitting(x))
        if k > self.prefill_k and x.waiting and finishing(x.waiting, x.token_budget - x.batch_size * (k + 1)):
            k = self.prefill_k
        return one_k(k, x)

    def to_spec(self) -> str:
        """The schedule's CLI form and the cap: '68:2,256:1 prefill-k 0'."""
        return f"{self.schedule.to_spec()} prefill-k {self.prefill_k}"


def capped(schedule: DraftSchedule, prefill_k: int | None) -> "DraftSchedule | PrefillCap":
    """The schedule as served with engine.json prefill_k or --prefill-k: itself where no cap is set."""
    return schedule if prefill_k is None else PrefillCap(schedule, prefill_k)
