"""What bounds every draft schedule, below the registry (__init__.py) and the dialect modules it renders through
(schedule_trtllm.py, schedule_vllm.py), so neither side imports the other's module back:
ScheduleError, MAX_BATCH_SIZE and MAX_DRAFT_LEN (all three also importable from dynspec.runtime.policy).

    DraftSchedule.parse("4:40")  -> ScheduleError "tier 0: draft length K=40 exceeds the limit 32"
"""
from __future__ import annotations

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
