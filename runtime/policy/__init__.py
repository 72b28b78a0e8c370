"""The draft-length policy: batch size -> K. This package owns everything that picks K: the registry
(here), the step-decision protocol and the policies, their cost and acceptance models, the
schedule renderings, limits and flags, and tuning.

Internal form (the one unambiguous form every dialect is rendered from):
    tiers = ((4, 4), (8, 2), (32, 1))
    batch 1..4 -> K=4, 5..8 -> K=2, 9..32 -> K=1, 33.. -> K=0
Bounds are inclusive upper bounds; above the last bound K is 0. CLI form: "4:4,8:2,32:1".

Bounds: K <= MAX_DRAFT_LEN and every batch-size bound <= MAX_BATCH_SIZE (see below).

DraftSchedule's from_/to_ methods delegate to the modules that render it:
    runtime/policy/schedule_trtllm.py  TRT-LLM `draft_len_schedule`:
                                       1.2.x {1: 4, 5: 2, 9: 1, 33: 0}, 1.3.x {4: 4, 8: 2, 32: 1}
    runtime/policy/schedule_vllm.py    vLLM `speculative_token_schedule`:
                                       [[1, 4, 4], [5, 8, 2], [9, 32, 1], [33, 2147483647, 0]]

Every policy the executor runs implements `Policy` (below); POLICIES (at the end) names each one
for the command line, engine.json and the benchmarks' labels.
"""
from __future__ import annotations

import bisect
import importlib
import re
from dataclasses import dataclass, replace
from typing import Mapping, Protocol, runtime_checkable

from dynspec.errors import DynspecError
from dynspec.runtime.policy.schedule_limits import (MAX_BATCH_SIZE, MAX_DRAFT_LEN, ScheduleError, canonical_tiers,
                                                     validate_tiers)
from dynspec.runtime.policy.schedule_trtllm import tiers_from_trtllm, trtllm_from_tiers
from dynspec.runtime.policy.schedule_vllm import tiers_from_vllm, vllm_from_tiers
from dynspec.runtime.policy.prefill_price import finishing
from dynspec.runtime.policy.step_decision import StepDecision, StepInputs, one_k


@runtime_checkable
class Policy(Protocol):
    """What the executor, the engine's sizing and its graph capture read of a draft-length policy:

        policy                  max_draft_len  drafts  choices(6)     chooses_keep_warm
        DraftSchedule "4:4,8:2" 4              True    (0, 2)         False
        DraftSchedule ""        0              False   (0,)           False
        ConstantK(0)            0              True    (0,)           False
        AdaptivePolicy K 0..3   3              True    (0, 1, 2, 3)   True

    Each iteration it answers `decide(StepInputs) -> StepDecision` (runtime/policy/step_decision.py).
    Optional hooks: initial_estimate() / initial_calibration() start the pooled estimate and the cost
    ratios (runtime/policy/adaptive.py); with row_rates(table, slots, pool, keys, truth) the executor keeps
    each row's counts and hands it the rows' rates, StepInputs.rates (runtime/policy/per_request.py);
    with reads_prompts True it is handed the prompts waiting, StepInputs.waiting (prefill_price.py)."""

    @property
    def max_draft_len(self) -> int: ...            # the largest K it may pick: the engine is sized for it

    @property
    def drafts(self) -> bool: ...                  # its plans carry the draft (False: the target alone)

    @property
    def chooses_keep_warm(self) -> bool: ...       # its K=0 steps run with or without keep-warm, its choice

    def choices(self, batch_size: int) -> tuple[int, ...]: ...   # every K it may pick at that batch size

    def decide(self, inputs: StepInputs) -> StepDecision: ...   # this iteration's K of each row


# ASCII digits only: str.isdigit() and re's \d also accept '４' or '١'.
_TIER = re.compile(r"[ \t]*([0-9]{1,12})[ \t]*:[ \t]*(-?[0-9]{1,12})[ \t]*", re.ASCII)


@dataclass(frozen=True)
class DraftSchedule:
    """Ordered (max_batch_size, K) tiers; K non-increasing; K=0 above the last bound."""

    tiers: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        tiers = tuple(tuple(t) for t in self.tiers)
        validate_tiers(tiers)
        object.__setattr__(self, "tiers", canonical_tiers(tiers))

    # ---- lookup -------------------------------------------------------------------------
    @property
    def max_draft_len(self) -> int:
        return self.tiers[0][1] if self.tiers else 0

    @property
    def bounds(self) -> tuple[int, ...]:
        return tuple(b for b, _ in self.tiers)

    def draft_len(self, batch_size: int) -> int:
        """K for a batch of `batch_size` requests. Pure."""
        if batch_size < 1:
            raise ScheduleError(f"batch size {batch_size} is below 1")
        i = bisect.bisect_left(self.bounds, batch_size)
        return self.tiers[i][1] if i < len(self.tiers) else 0

    __call__ = draft_len

    def decide(self, x: StepInputs) -> StepDecision:
        """Its K at the rows that emit a token in this step, for every row: the b decode rows and the
        prompts whose prefill the step ends (StepInputs.waiting; each emits its first token here):
        "4:4,8:2" at b=6 -> ks (2,) * 6; at b=4 with one prompt ending -> its K at 5, ks (2,) * 4.
        The prompts finishing are counted at the rows' K (K=4 at b=4 above): a lower K leaves more
        budget, so the count is a lower bound and K an upper one."""
        return one_k(self.draft_len(self.emitting(x)), x)

    def emitting(self, x: StepInputs) -> int:
        """b + the prompts whose prefill ends in the step at the schedule's K at b (prefill_price.finishing)."""
        k = self.draft_len(x.batch_size)
        if not k or not x.waiting:
            return x.batch_size
        return x.batch_size + finishing(x.waiting, x.token_budget - x.batch_size * (k + 1))

    # ---- Policy -------------------------------------------------------------------------
    @property
    def drafts(self) -> bool:
        """A schedule with a tier drafts; one without runs the target alone."""
        return self.max_draft_len > 0

    @property
    def chooses_keep_warm(self) -> bool:
        """Every K=0 step keeps the draft warm when the executor does."""
        return False

    def choices(self, batch_size: int) -> tuple[int, ...]:
        """Every K at b decode rows: its own, and those of more rows emitting (prompts ending their
        prefill beside them): "4:4,8:2".choices(6) == (0, 2), .choices(2) == (0, 2, 4)."""
        return tuple(sorted({self.draft_len(batch_size), 0} | {k for bound, k in self.tiers if bound >= batch_size}))

    @property
    def reads_prompts(self) -> bool:
        """A schedule that drafts counts the prompts whose prefill a step ends (StepInputs.waiting)."""
        return self.drafts

    def ranges(self, max_batch_size: int) -> tuple[tuple[int, int, int], ...]:
        """(first, last, K) runs covering 1..max_batch_size; O(tiers), not O(max_batch_size).

        "4:4,8:2" with max_batch_size 40 -> ((1, 4, 4), (5, 8, 2), (9, 40, 0))"""
        if not 1 <= max_batch_size <= MAX_BATCH_SIZE:
            raise ScheduleError(f"max batch size {max_batch_size} is outside 1..{MAX_BATCH_SIZE}")
        out, start = [], 1
        for bound, k in self.tiers + ((max_batch_size, 0),):
            if start > max_batch_size:
                break
            end = min(bound, max_batch_size)
            if end >= start:
                out.append((start, end, k))
            start = end + 1
        return tuple(out)

    def reachable(self, max_batch_size: int) -> tuple[int, ...]:
        """Every K that some batch size in 1..max_batch_size gets, largest first."""
        return tuple(sorted({k for _, _, k in self.ranges(max_batch_size)}, reverse=True))

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def threshold(cls, max_draft_len: int, disable_above: int) -> "DraftSchedule":
        """K=max_draft_len for batches 1..disable_above, K=0 above."""
        if max_draft_len < 1:
            raise ScheduleError(f"max_draft_len={max_draft_len} must be at least 1")
        if disable_above < 1:
            raise ScheduleError(f"disable_above={disable_above} must be at least 1")
        return cls(((disable_above, max_draft_len),))

    @classmethod
    def static(cls, k: int, max_batch_size: int) -> "DraftSchedule":
        """The same K for every batch size up to max_batch_size."""
        if k < 0:
            raise ScheduleError(f"negative draft length K={k}")
        return cls(((max_batch_size, k),))

    @classmethod
    def parse(cls, spec: str, max_draft_len: int | None = None) -> "DraftSchedule":
        """'4:4,8:2,32:1' -> tiers ((4, 4), (8, 2), (32, 1)). An empty spec means K=0 everywhere."""
        text = (spec or "").strip()
        tiers: list[tuple[int, int]] = []
        if text:
            for part in text.split(","):
                m = _TIER.fullmatch(part)
                if not m:
                    raise ScheduleError(
                        f"cannot parse schedule tier {part.strip()!r} in {spec!r}; expected 'max_batch:K' like '4:4,8:2'"
                        " (ASCII digits, at most 12 each)"
                    )
                tiers.append((int(m.group(1)), int(m.group(2))))
        validate_tiers(tiers, max_draft_len)
        return cls(tuple(tiers))

    @classmethod
    def from_vllm(cls, schedule: object, num_speculative_tokens: int,
                  max_batch_size: int | None = None) -> "DraftSchedule":
        """vLLM's `speculative_token_schedule` -> the schedule vLLM actually runs
        (runtime/policy/schedule_vllm.py tiers_from_vllm, with vLLM's rules)."""
        return cls(tiers_from_vllm(schedule, num_speculative_tokens, max_batch_size))

    @classmethod
    def from_trtllm(cls, schedule: Mapping[int | str, int], version: str) -> "DraftSchedule":
        """Inverse of to_trtllm for the named version's dialect (runtime/policy/schedule_trtllm.py)."""
        return cls(tiers_from_trtllm(schedule, version))

    # ---- renderers ----------------------------------------------------------------------
    def to_trtllm(self, version: str) -> dict[int, int]:
        """The exact `draft_len_schedule` dict that TRT-LLM `version` must receive
        (runtime/policy/schedule_trtllm.py)."""
        return trtllm_from_tiers(self.tiers, version)

    def to_vllm(self) -> list[list[int]]:
        """vLLM `speculative_token_schedule` (run it with num_speculative_tokens=max_draft_len):
        "4:4,8:2" -> [[1, 4, 4], [5, 8, 2], [9, 2147483647, 0]] (runtime/policy/schedule_vllm.py)."""
        return vllm_from_tiers(self.tiers)

    def to_spec(self) -> str:
        """CLI form; DraftSchedule.parse(s.to_spec()) == s."""
        return ",".join(f"{b}:{k}" for b, k in self.tiers)

    def __str__(self) -> str:
        return self.to_spec() or "(no speculation)"


@dataclass(frozen=True)
class ConstantK:
    """K at every batch size, the draft in every plan: ConstantK(0) is a speculating policy's
    plain-decode step (K=0, the draft loaded), what `dynspec profile` times as its K=0 rows;
    ConstantK(3)(100) == 3. DraftSchedule.static(3, B) is K=3 up to b=B only, and a schedule
    of K=0 runs the target alone."""

    k: int

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 0 <= self.k <= MAX_DRAFT_LEN:
            raise ScheduleError(f"constant draft length K={self.k!r} is outside 0..{MAX_DRAFT_LEN}")

    def __call__(self, batch_size: int) -> int:
        return self.k

    def decide(self, x: StepInputs) -> StepDecision:
        return one_k(self.k, x)

    @property
    def max_draft_len(self) -> int:
        return self.k

    @property
    def drafts(self) -> bool:
        return True

    @property
    def chooses_keep_warm(self) -> bool:
        return False

    def choices(self, batch_size: int) -> tuple[int, ...]:
        return (self.k,)


def speculates(policy: Policy) -> bool:
    """Whether `policy`'s plans carry the draft (Policy.drafts); one that does not runs the target
    alone (StepPlan.draft False): speculates(DraftSchedule.parse("")) is False."""
    return policy.drafts


def schedule_from_args(spec: str | None, threshold: int | None, max_draft_len: int | None) -> DraftSchedule:
    """One place that turns the CLI's --schedule / --threshold / --max-draft-len into a schedule."""
    if spec is not None and threshold is not None:
        raise ScheduleError("give either --schedule or --threshold, not both")
    if max_draft_len is not None and not 1 <= max_draft_len <= MAX_DRAFT_LEN:
        raise ScheduleError(f"--max-draft-len {max_draft_len} is outside 1..{MAX_DRAFT_LEN}")
    if spec is not None:
        return DraftSchedule.parse(spec, max_draft_len)
    if threshold is not None:
        if max_draft_len is None:
            raise ScheduleError("--threshold needs --max-draft-len")
        return DraftSchedule.threshold(max_draft_len, threshold)
    raise ScheduleError("give --schedule SPEC or --threshold N --max-draft-len K")


@dataclass(frozen=True)
class PolicyKind:
    """A named policy: its class ('module:Class'), whether it reads a cost model, whether it reads
    each request's true rate (benchmarks only, never served)."""
    name: str
    path: str
    cost_model: bool = False
    benchmark_only: bool = False

    def make(self, cost, max_draft_len: int | None = None, cap: DraftSchedule | None = None,
             prices=None, ttft_weight: float | None = None):
        """The policy on a CostModel: K <= max_draft_len (None: every K profiled); a per-row policy caps
        K_i by cap's K at b. prices: the device's StepPrices (runtime/policy/step_prices.py; None: none
        fitted): per-row vectors at policy_ragged (None: their split price), prompt chunks at their
        fitted prices where the profile has no chunk axis (chunk_cost.with_fitted_chunks);
        ttft_weight: a finishing prompt's weight (runtime/policy/prefill_price.py; None: the default)."""
        from dynspec.runtime.policy.chunk_cost import with_fitted_chunks
        from dynspec.runtime.policy.step_prices import policy_ragged

        if not self.cost_model:
            raise DynspecError(f"policy {self.name!r} reads no cost model")
        module, _, cls = self.path.partition(":")
        policy = getattr(importlib.import_module(module), cls).from_cost(with_fitted_chunks(cost, prices),
                                                                         max_draft_len, cap, policy_ragged(prices))
        if ttft_weight is not None:
            policy.settings = replace(policy.settings, ttft_weight=float(ttft_weight))
        return policy


POLICIES = {p.name: p for p in (PolicyKind("schedule", "dynspec.runtime.policy:DraftSchedule"),
                                 PolicyKind("adaptive", "dynspec.runtime.policy.adaptive:AdaptivePolicy", True),
                                 PolicyKind("per-request", "dynspec.runtime.policy.per_request:PerRequestPolicy", True),
                                 PolicyKind("per-request-oracle", "dynspec.runtime.policy.per_request_oracle:PerRequestOracle",
                                            cost_model=True, benchmark_only=True))}
SERVED_POLICIES = tuple(n for n, p in POLICIES.items() if not p.benchmark_only)   # engine.json's `policy`


def registered_name(policy) -> str:
    """The name POLICIES gives a policy's class, or its `registered_as`: DraftSchedule, PrefillCap -> 'schedule'."""
    if getattr(type(policy), "registered_as", None) in POLICIES:
        return type(policy).registered_as
    path = f"{type(policy).__module__}:{type(policy).__qualname__}"
    for p in POLICIES.values():
        if p.path == path:
            return p.name
    raise DynspecError(f"{type(policy).__name__} is not a registered policy ({', '.join(POLICIES)})")
