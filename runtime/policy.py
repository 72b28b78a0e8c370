"""The draft-length policy: batch size -> K, and its renderings for TRT-LLM and vLLM.

Internal form (the one unambiguous form every dialect is rendered from):
    tiers = ((4, 4), (8, 2), (32, 1))
    batch 1..4 -> K=4, 5..8 -> K=2, 9..32 -> K=1, 33.. -> K=0
Bounds are inclusive upper bounds; above the last bound K is 0.

TensorRT-LLM dialects of `draft_len_schedule` (see DESIGN.md):
    1.2.x  lower bounds, largest key <= b wins:   {1: 4, 5: 2, 9: 1, 33: 0}
    1.3.x  upper bounds, smallest key >= b wins:  {4: 4, 8: 2, 32: 1}   (K=0 above 32)
vLLM: inclusive [start, end, K] ranges:            [[1, 4, 4], [5, 8, 2], [9, 32, 1]]
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from dynspec.errors import DynspecError


class ScheduleError(DynspecError):
    """A draft schedule that cannot exist or cannot be rendered; the message names the value."""


# major.minor -> meaning of the keys of `draft_len_schedule`.
TRTLLM_DIALECTS = {(1, 2): "lower", (1, 3): "upper"}


def trtllm_dialect(version: str) -> str:
    """'lower' or 'upper' for a TRT-LLM version string such as '1.2.1' or '1.3.0rc2'."""
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.\d+)?(?:[.\-+]?(?:rc|a|b|post|dev)\d*)?\s*$", str(version))
    if not m:
        raise ScheduleError(f"unparseable TensorRT-LLM version {version!r}; expected e.g. '1.2.1'")
    key = (int(m.group(1)), int(m.group(2)))
    if key not in TRTLLM_DIALECTS:
        known = ", ".join(f"{a}.{b}.x ({d} bounds)" for (a, b), d in sorted(TRTLLM_DIALECTS.items()))
        raise ScheduleError(
            f"TensorRT-LLM version {version!r} has no known draft_len_schedule dialect; known: {known}"
        )
    return TRTLLM_DIALECTS[key]


def _validate(tiers: Sequence[tuple[int, int]], max_draft_len: int | None = None) -> None:
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


def _canonical(tiers: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
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


@dataclass(frozen=True)
class DraftSchedule:
    """Ordered (max_batch_size, K) tiers; K non-increasing; K=0 above the last bound."""

    tiers: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        tiers = tuple(tuple(t) for t in self.tiers)
        _validate(tiers)
        object.__setattr__(self, "tiers", _canonical(tiers))

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

    def reachable(self, max_batch_size: int) -> tuple[int, ...]:
        """Every K that some batch size in 1..max_batch_size gets, largest first."""
        ks = {self.draft_len(b) for b in range(1, max_batch_size + 1)}
        return tuple(sorted(ks, reverse=True))

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
                m = re.fullmatch(r"\s*(\d+)\s*:\s*(-?\d+)\s*", part)
                if not m:
                    raise ScheduleError(
                        f"cannot parse schedule tier {part.strip()!r} in {spec!r}; expected 'max_batch:K' like '4:4,8:2'"
                    )
                tiers.append((int(m.group(1)), int(m.group(2))))
        _validate(tiers, max_draft_len)
        return cls(tuple(tiers))

    @classmethod
    def from_vllm(cls, ranges: Iterable[Sequence[int]]) -> "DraftSchedule":
        """[[1, 4, 4], [5, 8, 2], [9, 32, 1]] (inclusive ranges, contiguous from 1)."""
        tiers: list[tuple[int, int]] = []
        expect = 1
        for i, r in enumerate(ranges):
            if len(r) != 3:
                raise ScheduleError(f"vLLM range {i} {list(r)!r} is not [start, end, K]")
            start, end, k = (int(x) for x in r)
            if start != expect:
                raise ScheduleError(f"vLLM range {i} starts at {start}; expected {expect} (ranges must be contiguous from 1)")
            if end < start:
                raise ScheduleError(f"vLLM range {i} ends at {end}, before its start {start}")
            tiers.append((end, k))
            expect = end + 1
        _validate(tiers)
        return cls(tuple(tiers))

    @classmethod
    def from_trtllm(cls, schedule: Mapping[int | str, int], version: str) -> "DraftSchedule":
        """Inverse of to_trtllm for the named version's dialect."""
        dialect = trtllm_dialect(version)
        try:
            items = sorted((int(k), int(v)) for k, v in schedule.items())
        except (TypeError, ValueError) as e:
            raise ScheduleError(f"draft_len_schedule {dict(schedule)!r} has a non-integer key or value") from e
        if not items:
            raise ScheduleError("draft_len_schedule is empty")
        for key, k in items:
            if key < 1:
                raise ScheduleError(f"draft_len_schedule key {key} is below 1")
            if k < 0:
                raise ScheduleError(f"draft_len_schedule value {k} at key {key} is negative")
        if dialect == "upper":
            return cls(tuple(items))
        if items[0][0] != 1:
            raise ScheduleError(f"TRT-LLM {version} draft_len_schedule needs key 1; smallest key is {items[0][0]}")
        # lower bounds: key_i applies to [key_i, key_{i+1} - 1]; the last key applies upward.
        if items[-1][1] != 0:
            raise ScheduleError(
                f"TRT-LLM {version} draft_len_schedule ends with K={items[-1][1]} at key {items[-1][0]}, which "
                "applies to every larger batch; dynspec schedules need an explicit 0 entry at the top"
            )
        tiers = [(items[i + 1][0] - 1, items[i][1]) for i in range(len(items) - 1)]
        return cls(tuple(tiers))

    # ---- renderers ----------------------------------------------------------------------
    def to_trtllm(self, version: str) -> dict[int, int]:
        """The exact `draft_len_schedule` dict that TRT-LLM `version` must receive."""
        dialect = trtllm_dialect(version)
        if not self.tiers:
            raise ScheduleError(
                "schedule never speculates (K=0 for every batch size); run without speculative_config instead"
            )
        if dialect == "upper":
            # smallest key's value == max_draft_len; K=0 above the largest key.
            return {bound: k for bound, k in self.tiers}
        # lower: key 1 == max_draft_len; each tier starts one above the previous bound;
        # the explicit 0 entry switches speculation off above the last bound.
        out: dict[int, int] = {}
        start = 1
        for bound, k in self.tiers:
            out[start] = k
            start = bound + 1
        out[start] = 0
        return out

    def to_vllm(self) -> list[list[int]]:
        out, start = [], 1
        for bound, k in self.tiers:
            out.append([start, bound, k])
            start = bound + 1
        return out

    def to_spec(self) -> str:
        """CLI form; DraftSchedule.parse(s.to_spec()) == s."""
        return ",".join(f"{b}:{k}" for b, k in self.tiers)

    def __str__(self) -> str:
        return self.to_spec() or "(no speculation)"


def schedule_from_args(spec: str | None, threshold: int | None, max_draft_len: int | None) -> DraftSchedule:
    """One place that turns the CLI's --schedule / --threshold / --max-draft-len into a schedule."""
    if spec is not None and threshold is not None:
        raise ScheduleError("give either --schedule or --threshold, not both")
    if spec is not None:
        return DraftSchedule.parse(spec, max_draft_len)
    if threshold is not None:
        if max_draft_len is None:
            raise ScheduleError("--threshold needs --max-draft-len")
        return DraftSchedule.threshold(max_draft_len, threshold)
    raise ScheduleError("give --schedule SPEC or --threshold N --max-draft-len K")
