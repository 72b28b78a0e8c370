"""The K = 0 stale-draft trap, and the --min-draft-len floor that avoids it.

While a TRT-LLM schedule resolves to K = 0 the drafter does not run, so the draft's KV cache is
not extended over the tokens the target emits, and nothing fills those rows in when the batch
shrinks and speculation resumes. How it happens differs by drafter (docs/design.md, section 2,
"Stale draft at K=0"):
- 1.2.x, two-model drafter (eagle3_one_model: false): PyExecutor turns spec decode off for the
  iteration and skips the drafter, while the draft KV cache still allocates each new token's
  position; on resume ModelDrafter feeds the draft only the newest token, no catch-up prefill.
- 1.3.x and 1.4.x, one-engine drafter: the skip-drafting path, as TRT-LLM PR 16888 describes it;
  the PR (a floor of 1 on resolved draft lengths) is open, so no release carries it.

Floor example, min_k=1, max_batch_size=64:
    tiers ((4, 4), (8, 2))  ->  ((4, 4), (8, 2), (64, 1))     K never reaches 0 up to 64
"""
from __future__ import annotations

from dynspec.errors import DynspecError
from dynspec.runtime.engines.trtllm_release import release
from dynspec.runtime.policy import DraftSchedule

# major.minor -> what happens to the draft while K = 0 on that release, and the source. Every
# dialect dynspec renders has the trap.
STALE_DRAFT_TRAP = {
    (1, 2): (
        "the two-model EAGLE-3 drafter (eagle3_one_model: false) is skipped while K=0: the draft model runs no "
        "forward over the tokens the target emits, although its KV cache keeps allocating their positions, and "
        "when speculation resumes it processes only the newest token, with no catch-up prefill, so it attends to "
        "draft-KV rows that were never written and acceptance drops for the rest of each request that crossed K=0",
        "TRT-LLM 1.2 PyExecutor and ModelDrafter; PR 16888, still open, covers one-engine drafters only",
    ),
    (1, 3): (
        "the one-engine drafter takes its skip-drafting path while K=0: draft positions keep being allocated while "
        "nothing writes them, and when speculation resumes the drafter attends to those uninitialized rows and "
        "acceptance collapses",
        "TRT-LLM PR 16888, still open",
    ),
    (1, 4): (
        "every EAGLE-3 config runs one-engine (PRs 17366, 18721), and its drafter takes the skip-drafting path "
        "while K=0: draft positions keep being allocated while nothing writes them, and when speculation resumes "
        "the drafter attends to those uninitialized rows and acceptance collapses",
        "TRT-LLM PR 16888, still open",
    ),
}


def _release(version: str) -> tuple[int, int]:
    return release(version).series   # rejects unknown versions with a clear message


def has_stale_draft_trap(version: str) -> bool:
    return _release(version) in STALE_DRAFT_TRAP


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
    what, source = STALE_DRAFT_TRAP[_release(version)]
    return (
        f"warning: the schedule turns speculation off (K=0) from batch size {b0} up; on TRT-LLM {version} {what} "
        f"({source}). Pass --min-draft-len 1 to keep the draft running at K>=1 instead."
    )
