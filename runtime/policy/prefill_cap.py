"""Prefill-aware K for a schedule (docs/design.md, "Prefill-aware K"): an iteration that ends a
waiting prompt's prefill runs at K <= the cap at its batch size, so that prompt's first token comes
out of a shorter step; every other iteration runs the schedule's K. The cap is a second schedule
(tiers of (max_batch_size, K); above the last bound K = 0), or one K for every batch size:

    schedule 68:2, cap 0, budget 8192, b = 40 rows:
      prompts waiting (100, 300)  K=2 leaves 8192 - 120 tokens, both prompts end in it  -> K = 0
      no prompt waiting                                                                  -> K = 2
      b = 100 (above 68)          the schedule's K is 0 already                          -> K = 0
    schedule 1:3,71:2, cap 37:1: b = 16 ending a prefill -> K = 1; b = 64 -> K = 0; b = 16 without -> 2

A schedule has no cost model at serving time, so the cap is the operator's, chosen on the serving
simulator for the loads expected (`sim_ttft`) and measured on the device (`serving`,
`serving_ttft`). The cost-model policies weigh the prompt themselves (prefill_price.py).

The text form, one reader for the CLI flags and engine.json prefill_k: "0" or "1" (one K; in
engine.json an integer), "37:1" (tiers), "@FILE" (the CLI flags only: a file holding one K or tiers). The reference engine only: TensorRT-LLM's
dynamic draft length reads the batch size alone. Pure: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from dynspec.errors import DynspecError
from dynspec.runtime.policy import MAX_BATCH_SIZE, MAX_DRAFT_LEN, DraftSchedule, ScheduleError, one_k
from dynspec.runtime.policy.prefill_price import finishing
from dynspec.runtime.policy.schedule_args import spec_file
from dynspec.runtime.policy.step_decision import StepDecision, StepInputs


def constant_cap(k: int) -> DraftSchedule:
    """One K at every batch size: 1 -> tiers ((MAX_BATCH_SIZE, 1),); 0 -> no tier (K = 0 everywhere)."""
    return DraftSchedule(((MAX_BATCH_SIZE, k),) if k else ())


def cap_text(cap: DraftSchedule) -> str:
    """The cap's text form: constant_cap(0) -> '0', constant_cap(1) -> '1', tiers -> '37:1'."""
    if not cap.tiers:
        return "0"
    if len(cap.tiers) == 1 and cap.tiers[0][0] == MAX_BATCH_SIZE:
        return str(cap.tiers[0][1])
    return cap.to_spec()


def parse_cap(value: object, where: str = "--prefill-k") -> DraftSchedule:
    """A cap from its text form (module docstring), an int, or a DraftSchedule; a DynspecError naming
    `where` and the value otherwise. '2' -> constant_cap(2); '37:1' -> tiers ((37, 1),); '@cap.txt' -> its text."""
    if isinstance(value, DraftSchedule):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise DynspecError(f"{where} {value} must be at least 0")
        if value > MAX_DRAFT_LEN:
            raise DynspecError(f"{where} {value} exceeds the draft-length limit {MAX_DRAFT_LEN}")
        return constant_cap(value)
    if not isinstance(value, str):
        raise DynspecError(f"{where} {value!r} must be a K >= 0, tiers like '37:1', or @FILE")
    text = value.strip()
    if not text:
        raise DynspecError(f"{where} is empty; give a K >= 0, tiers like '37:1', or @FILE")
    if text.startswith("@"):
        return parse_cap(spec_file(text, where, "a K or tiers"), f"{where} ({text[1:]})")
    if text.isascii() and text.isdigit():
        return parse_cap(int(text), where)
    if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        raise DynspecError(f"{where} {text} must be at least 0")
    try:
        return DraftSchedule.parse(text)
    except ScheduleError as e:
        raise DynspecError(f"{where} {value!r}: {e}") from None


@dataclass(frozen=True)
class PrefillCap:
    """A DraftSchedule with K capped by `cap` (at the step's rows) on the iterations that end a prompt's prefill."""
    schedule: DraftSchedule
    cap: DraftSchedule
    registered_as = "schedule"       # POLICIES' name for it (runtime/policy/__init__.py registered_name)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cap", parse_cap(self.cap, "prefill K"))

    @property
    def prefill_k(self) -> str:
        """The cap's text form ('0', '37:1')."""
        return cap_text(self.cap)

    @property
    def limit(self) -> str:
        """The cap in words: 'K<=0'; tiers: 'K<=1 up to 37 rows, 0 above'."""
        text = self.prefill_k
        if text.isdigit():
            return f"K<={text}"
        return "K<=" + ", ".join(f"{k} up to {bound} rows" for bound, k in self.cap.tiers) + ", 0 above"

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
        """The schedule's choices at b, each capped by every cap K of as many rows or more:
        "68:2" capped at 1 -> (0, 1, 2) at b=40; capped at "37:1" -> (0, 1, 2) at b=16, (0, 2) at b=40."""
        ks = self.schedule.choices(batch_size)
        caps = {0, self.cap.draft_len(batch_size)} | {k for bound, k in self.cap.tiers if bound >= batch_size}
        return tuple(sorted({*ks, *(min(k, c) for k in ks for c in caps)}))

    def decide(self, x: StepInputs) -> StepDecision:
        """The schedule's K, capped where a prompt's prefill ends. The cap is read at the rows emitting
        (DraftSchedule.emitting); a lower K leaves more budget, so more prompts may end, and the cap is
        read again at that count until it holds (schedule 68:2, cap 37:1, b = 36, waiting (8000, 100):
        K=2 ends one prompt, 37 rows, cap 1; K=1 ends both, 38 rows, cap 0 -> K = 0)."""
        k = self.schedule.draft_len(self.schedule.emitting(x))
        while x.waiting and (ending := finishing(x.waiting, x.token_budget - x.batch_size * (k + 1))):
            cap = self.cap.draft_len(x.batch_size + ending)
            if k <= cap:
                break
            k = cap
        return one_k(k, x)

    def to_spec(self) -> str:
        """The schedule's CLI form and the cap: '68:2,256:1 prefill-k 0', '1:3,71:2 prefill-k 37:1'."""
        return f"{self.schedule.to_spec()} prefill-k {self.prefill_k}"


def capped(schedule: DraftSchedule, prefill_k: object = None) -> "DraftSchedule | PrefillCap":
    """The schedule as served with engine.json prefill_k or --prefill-k (any form parse_cap reads):
    itself where no cap is set."""
    return schedule if prefill_k is None else PrefillCap(schedule, parse_cap(prefill_k))


def json_form(cap: DraftSchedule) -> int | str:
    """engine.json prefill_k of a cap: one K as an integer (0, 1), tiers as their text ('37:1')."""
    text = cap_text(cap)
    return int(text) if text.isdigit() else text
