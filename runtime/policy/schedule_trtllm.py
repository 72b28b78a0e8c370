"""A schedule's tiers <-> TensorRT-LLM's `draft_len_schedule`, in the dialect of the release that reads it.

The release's major.minor names the dialect (TRTLLM_DIALECTS; docs/design.md, section 2). The
schedule "4:4,8:2,32:1" (batch 1..4 -> K=4, 5..8 -> K=2, 9..32 -> K=1, 33.. -> K=0) renders as
    1.2.x  lower bounds, largest key <= b wins:   {1: 4, 5: 2, 9: 1, 33: 0}
    1.3.x  upper bounds, smallest key >= b wins:  {4: 4, 8: 2, 32: 1}   (K=0 above 32)
and tiers_from_trtllm reads either back (JSON's string keys too):
    tiers_from_trtllm({"1": 4, "5": 2, "9": 0}, "1.2.1") == ((4, 4), (8, 2))
DraftSchedule.to_trtllm and DraftSchedule.from_trtllm (runtime/policy/__init__.py) call trtllm_from_tiers and
tiers_from_trtllm here; this module works on tiers alone and imports no policy.
"""
from __future__ import annotations

import re
from typing import Mapping

from dynspec.runtime.policy.schedule_limits import ScheduleError

# major.minor -> meaning of the keys of `draft_len_schedule`.
TRTLLM_DIALECTS = {(1, 2): "lower", (1, 3): "upper", (1, 4): "upper"}   # runtime/engines/trtllm_release.py

# ASCII digits only: str.isdigit() and re's \d also accept '４' or '١'.
_VERSION = re.compile(r"([0-9]+)\.([0-9]+)(?:\.[0-9]+)?(?:[.\-+]?(?:rc|a|b|post|dev)[0-9]*)?", re.ASCII)


def trtllm_dialect(version: str) -> str:
    """'lower' or 'upper' for a TRT-LLM version string such as '1.2.1' or '1.3.0rc2'.

    The whole string must match: '1.2.1\n', ' 1.2.1' and '１.2.1' are refused."""
    m = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if not m:
        raise ScheduleError(f"unparseable TensorRT-LLM version {version!r}; expected e.g. '1.2.1'")
    key = (int(m.group(1)), int(m.group(2)))
    if key not in TRTLLM_DIALECTS:
        known = ", ".join(f"{a}.{b}.x ({d} bounds)" for (a, b), d in sorted(TRTLLM_DIALECTS.items()))
        raise ScheduleError(
            f"TensorRT-LLM version {version!r} has no known draft_len_schedule dialect; known: {known}"
        )
    return TRTLLM_DIALECTS[key]


def _plain_int(value: object) -> int | None:
    """4 or '4' -> 4 (JSON object keys are strings); '４', '4.0', True, 4.0 -> None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}", value, re.ASCII):
        return int(value)
    return None


def tiers_from_trtllm(schedule: Mapping[int | str, int], version: str) -> tuple[tuple[int, int], ...]:
    """Inverse of trtllm_from_tiers for the named version's dialect: the (max_batch_size, K) tiers a
    DraftSchedule is made of (DraftSchedule.from_trtllm checks and keeps them)."""
    dialect = trtllm_dialect(version)
    pairs = [(_plain_int(k), _plain_int(v)) for k, v in schedule.items()]
    if any(k is None or v is None for k, v in pairs):
        raise ScheduleError(f"draft_len_schedule {dict(schedule)!r} has a key or value that is not an integer"
                            " (JSON keys: ASCII digits)")
    items = sorted(pairs)
    if not items:
        raise ScheduleError("draft_len_schedule is empty")
    for key, k in items:
        if key < 1:
            raise ScheduleError(f"draft_len_schedule key {key} is below 1")
        if k < 0:
            raise ScheduleError(f"draft_len_schedule value {k} at key {key} is negative")
    if dialect == "upper":
        return tuple(items)
    if items[0][0] != 1:
        raise ScheduleError(f"TRT-LLM {version} draft_len_schedule needs key 1; smallest key is {items[0][0]}")
    # lower bounds: key_i applies to [key_i, key_{i+1} - 1]; the last key applies upward.
    if items[-1][1] != 0:
        raise ScheduleError(
            f"TRT-LLM {version} draft_len_schedule ends with K={items[-1][1]} at key {items[-1][0]}, which "
            "applies to every larger batch; dynspec schedules need an explicit 0 entry at the top"
        )
    tiers = [(items[i + 1][0] - 1, items[i][1]) for i in range(len(items) - 1)]
    return tuple(tiers)


def trtllm_from_tiers(tiers: tuple[tuple[int, int], ...], version: str) -> dict[int, int]:
    """The exact `draft_len_schedule` dict that TRT-LLM `version` must receive for a DraftSchedule's tiers."""
    dialect = trtllm_dialect(version)
    if not tiers:
        raise ScheduleError(
            "schedule never speculates (K=0 for every batch size); run without speculative_config instead"
        )
    if dialect == "upper":
        # smallest key's value == max_draft_len; K=0 above the largest key.
        return {bound: k for bound, k in tiers}
    # lower: key 1 == max_draft_len; each tier starts one above the previous bound;
    # the explicit 0 entry switches speculation off above the last bound.
    out: dict[int, int] = {}
    start = 1
    for bound, k in tiers:
        out[start] = k
        start = bound + 1
    out[start] = 0
    return out
