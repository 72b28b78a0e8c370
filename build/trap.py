"""The K = 0 stale-draft trap, and the --min-draft-len floor that avoids it.

While a TRT-LLM schedule resolves to K = 0, the drafter does not run, so the draft's own state
(its KV cache) is not extended over the tokens the target emits. When the batch shrinks and
speculation resumes, the draft attends to rows nobody wrote and acceptance silently collapses.
TRT-LLM PR 16888 ("Keep drafting alive when dynamic draft length hits its floor") fixes it by
flooring resolved draft lengths at 1; it was still open in the PR snapshot read for dynspec
(2026-07-27), so no released version is known to carry the fix.

Floor example, min_k=1, max_batch_size=64:
    tiers ((4, 4), (8, 2))  ->  ((4, 4), (8, 2), (64, 1))     K never reaches 0 up to 64
"""
from __future__ import annotations

from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule, trtllm_dialect

# major.minor -> has the trap (PR 16888 not in the release). Every dialect dynspec renders.
STALE_DRAFT_TRAP = {(1, 2): True, (1, 3): True}
TRAP_REFERENCE = "TRT-LLM PR 16888, unreleased"


def has_stale_draft_trap(version: str) -> bool:
    trtllm_dialect(version)  # rejects unknown versions with a clear message
    major, minor = (int(x) for x in version.split(".")[:2])
    return STALE_DRAFT_TRAP.get((major, minor), True)


def first_zero_batch(schedule: DraftSchedule, max_batch_size: int) -> int | None:
    """Smallest batch size in 1..max_batch_size with K = 0, or None."""
    last = schedule.bounds[-1] if schedule.tiers else 0
    return last + 1 if last < max_batch_size else None


def floor_schedule(schedule: DraftSchedule, min_k: int, max_batch_size: int) -> DraftSchedule:
    """Raise every K below min_k to min_k for batch sizes up to max_batch_size."""
    if min_k <= 0:
        return schedule
    if min_k > schedule.max_draft_len:
        raise DynspecError(f"--min-draft-len {min_k} exceeds the schedule's max_draft_len {schedule.max_draft_len}")
    tiers = [(b, max(k, min_k)) for b, k in schedule.tiers]
    if tiers[-1][0] < max_batch_size:
        tiers.append((max_batch_size, min_k))
    return DraftSchedule(tuple(tiers))


def trap_warning(version: str, schedule: DraftSchedule, max_batch_size: int) -> str | None:
    b0 = first_zero_batch(schedule, max_batch_size)
    if b0 is None or not has_stale_draft_trap(version):
        return None
    return (
        f"warning: the schedule turns speculation off (K=0) from batch size {b0} up; on TRT-LLM {version} the "
        f"draft is not kept up to date while K=0, so acceptance collapses when speculation resumes "
        f"({TRAP_REFERENCE}). Pass --min-draft-len 1 to keep the draft running at K>=1 instead."
    )
