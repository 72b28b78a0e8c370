"""Values that cross the executor/engine boundary once per iteration.

K is decided once, before anything is shaped, and every shape below derives from (b, K).
Rows are cache rows: the executor keeps its b live requests in rows 0..b-1.

Worked example, b=3, K=2, bucket 4, lengths (5, 9, 7):
    verify tokens [4, 3]     row r: [pending_r, d1_r, d2_r] at positions P_r .. P_r+2
    positions     (5, 9, 7)  pending token of row r sits at position P_r (= its KV length)
    row 3 is padding: position 0, token 0, result ignored
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class StepPlan:
    k: int                          # drafted tokens per row (0 = plain decode)
    batch_size: int                 # b live rows: 0..b-1
    bucket: int                     # padded row count >= b (one CUDA graph per (bucket, K))
    positions: tuple[int, ...]      # [b] KV length of each row = position of its pending token
    pending: tuple[int, ...]        # [b] last emitted token of each row, not yet seen by the target
    stale: tuple[bool, ...]         # [b] rows whose draft head must be rebuilt (after any K=0 step)
    keep_warm: bool                 # K=0 only: the draft extends its KV over the new token

    @property
    def tokens_per_row(self) -> int:
        return self.k + 1

    @property
    def max_position(self) -> int:
        """Highest cache position this step writes (target side)."""
        return max(self.positions) + self.k


@dataclass(frozen=True)
class StepResult:
    accepted: tuple[int, ...]              # [b] accepted draft tokens per row, 0..K
    emitted: tuple[tuple[int, ...], ...]   # [b] new tokens per row: accepted drafts + 1 target token
    draft_warm: bool                       # each row's draft head (next first draft) is ready


def bucket_for(b: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= b. buckets=(1, 2, 4, 8): b=3 -> 4, b=8 -> 8."""
    i = bisect.bisect_left(buckets, b)
    if i == len(buckets):
        raise ValueError(f"batch size {b} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


def batch_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to max_batch_size, plus max_batch_size itself: 6 -> (1, 2, 4, 6)."""
    out, b = [], 1
    while b < max_batch_size:
        out.append(b)
        b *= 2
    out.append(max_batch_size)
    return tuple(out)


def make_plan(
    k: int,
    positions: Sequence[int],
    pending: Sequence[int],
    stale: Sequence[bool],
    keep_warm: bool,
    buckets: Sequence[int],
) -> StepPlan:
    """Pure: the whole iteration's shape from (b, K) and each row's length."""
    b = len(positions)
    if not (b == len(pending) == len(stale)):
        raise ValueError(f"row arrays disagree: {b} positions, {len(pending)} pending, {len(stale)} stale")
    if b < 1:
        raise ValueError("a plan needs at least one row")
    return StepPlan(
        k=k,
        batch_size=b,
        bucket=bucket_for(b, buckets),
        positions=tuple(positions),
        pending=tuple(pending),
        stale=tuple(bool(s) for s in stale),
        keep_warm=keep_warm,
    )
