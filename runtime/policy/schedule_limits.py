"""What bounds every draft schedule, below the registry (__init__.py) and the dialect modules it renders through
(schedule_trtllm.py, schedule_vllm.py), so neither side imports the other's module back:
ScheduleError, MAX_BATCH_SIZE and MAX_DRAFT_LEN (all three also importable from dynspec.runtime.policy),
and the tier checks against them (validate_tiers) with the one canonical form (canonical_tiers).

    DraftSchedule.parse("4:40")  -> ScheduleError "tier 0: draft length K=40 exceeds the limit 32"
"""
from __future__ import annotations

from typing import Sequence

from dynspec.errors import DynspecError


class ScheduleError(DynspecError):
    """A draft schedule that cannot exist or cannot be rendered; the message names the value."""


# TRT-LLM keeps batch sizes in SizeType32 (int32), so no runtime batch exceeds 2**31 - 1; it is
# also the open end vLLM itself uses for unbounded ranges (_CTX_INFINITY in the vLLM file cited
# at runtime/policy/schedule_vllm.py's tiers_from_vllm). Schedule bounds and `dynspec schedule
# --max-batch-size` stay within it.
MAX_BATCH_SIZE = 2**31 - 1
# TRT-LLM's llm_args validators only require max_draft_len > 0; dynspec sets its own ceiling.
# Each K costs a CUDA graph per batch bucket and b x (K+1) tokens of max_num_tokens, and EAGLE-3
# drafts are trained for a handful of steps, so a K above 32 is a typo, not a plan.
MAX_DRAFT_LEN = 32


def validate_tiers(tiers: Sequence[tuple[int, int]], max_draft_len: int | None = None) -> None:
    """Each (max_batch_size, K) tier within the limits, bounds rising, K not: a ScheduleError naming
    the tier otherwise. ((4, 4), (8, 2)) passes; ((4, 2), (8, 4)) -> "tier 1: K=4 at bound 8 increases ..."."""
    prev_bound, prev_k = 0, None
    for i, tier in enumerate(tiers):
        if len(tier) != 2:
            raise ScheduleError(f"tier {i} {tier!r} is not a (max_batch_size, K) pair")
        bound, k = tier
        if not isinstance(bound, int) or isinstance(bound, bool) or not isinstance(k, int) or isinstance(k, bool):
            raise ScheduleError(f"tier {i} {tier!r}: bound and K must be integers")
        if bound < 1:
            raise ScheduleError(f"tier {i}: batch-size bound {bound} is below 1")
        if k < 0:
            raise ScheduleError(f"tier {i}: negative draft length K={k}")
        if bound > MAX_BATCH_SIZE:
            raise ScheduleError(f"tier {i}: batch-size bound {bound} exceeds the limit {MAX_BATCH_SIZE} (int32)")
        if k > MAX_DRAFT_LEN:
            raise ScheduleError(f"tier {i}: draft length K={k} exceeds the limit {MAX_DRAFT_LEN}")
        if bound == prev_bound:
            raise ScheduleError(f"tier {i}: duplicate batch-size bound {bound}")
        if bound < prev_bound:
            raise ScheduleError(f"tier {i}: bound {bound} is not above the previous bound {prev_bound}")
        if prev_k is not None and k > prev_k:
            raise ScheduleError(
                f"tier {i}: K={k} at bound {bound} increases over K={prev_k} at bound {prev_bound};"
                " K must not increase with batch size"
            )
        if max_draft_len is not None and k > max_draft_len:
            raise ScheduleError(f"tier {i}: K={k} exceeds max_draft_len={max_draft_len}")
        prev_bound, prev_k = bound, k


def canonical_tiers(tiers: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Merge neighbours with equal K (keeping the larger bound) and drop K=0 tiers.

    ((2, 4), (4, 4), (8, 0)) -> ((4, 4),): same lookup for every batch size.
    """
    out: list[tuple[int, int]] = []
    for bound, k in tiers:
        if k == 0:
            break  # K is non-increasing, so everything from here on is 0 anyway
        if out and out[-1][1] == k:
            out[-1] = (bound, k)
        else:
            out.append((bound, k))
    return tuple(out)
