"""The draft-length policy: batch size -> K, and its renderings for TRT-LLM and vLLM.

Internal form (the one unambiguous form every dialect is rendered from):
    tiers = ((4, 4), (8, 2), (32, 1))
    batch 1..4 -> K=4, 5..8 -> K=2, 9..32 -> K=1, 33.. -> K=0
Bounds are inclusive upper bounds; above the last bound K is 0.

TensorRT-LLM dialects of `draft_len_schedule` (docs/design.md, section 2):
    1.2.x  lower bounds, largest key <= b wins:   {1: 4, 5: 2, 9: 1, 33: 0}
    1.3.x  upper bounds, smallest key >= b wins:  {4: 4, 8: 2, 32: 1}   (K=0 above 32)
vLLM `speculative_token_schedule`, inclusive [start, end, K] ranges with a closing K=0 range
(vLLM carries the last K past the last range):
    [[1, 4, 4], [5, 8, 2], [9, 32, 1], [33, 2147483647, 0]]
or, one schedule per context bucket (to_vllm_grid), [bs_lo, bs_hi, ctx_lo, ctx_hi, K] entries.

Bounds: K <= MAX_DRAFT_LEN and every batch-size bound <= MAX_BATCH_SIZE (see below).

Every policy the executor runs implements `Policy` (below): DraftSchedule, ConstantK and
runtime/adaptive.py's AdaptivePolicy.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, runtime_checkable

from dynspec.errors import DynspecError


class ScheduleError(DynspecError):
    """A draft schedule that cannot exist or cannot be rendered; the message names the value."""


@runtime_checkable
class Policy(Protocol):
    """What the executor, the engine's sizing and its graph capture read of a draft-length policy:

        policy                  max_draft_len  drafts  choices(6)     chooses_keep_warm
        DraftSchedule "4:4,8:2" 4              True    (2,)           False
        DraftSchedule ""        0              False   (0,)           False
        ConstantK(0)            0              True    (0,)           False
        AdaptivePolicy K 0..3   3              True    (0, 1, 2, 3)   True

    A policy with chooses_keep_warm False is also called with the batch size for its K
    (`policy(b)`); AdaptivePolicy decides from the executor's measurements (its `decide`)."""

    @property
    def max_draft_len(self) -> int: ...            # the largest K it may pick: the engine is sized for it

    @property
    def drafts(self) -> bool: ...                  # its plans carry the draft (False: the target alone)

    @property
    def chooses_keep_warm(self) -> bool: ...       # its K=0 steps run with or without keep-warm, its choice

    def choices(self, batch_size: int) -> tuple[int, ...]: ...   # every K it may pick at that batch size


# major.minor -> meaning of the keys of `draft_len_schedule`.
TRTLLM_DIALECTS = {(1, 2): "lower", (1, 3): "upper", (1, 4): "upper"}   # build/trtllm_release.py

# TRT-LLM keeps batch sizes in SizeType32 (int32), so no runtime batch exceeds 2**31 - 1; it is
# also the open end vLLM itself uses for unbounded ranges (_CTX_INFINITY in the file cited at
# from_vllm). Schedule bounds and `dynspec schedule --max-batch-size` stay within it.
MAX_BATCH_SIZE = 2**31 - 1
# TRT-LLM's llm_args validators only require max_draft_len > 0; dynspec sets its own ceiling.
# Each K costs a CUDA graph per batch bucket and b x (K+1) tokens of max_num_tokens, and EAGLE-3
# drafts are trained for a handful of steps, so a K above 32 is a typo, not a plan.
MAX_DRAFT_LEN = 32

# ASCII digits only: str.isdigit() and re's \d also accept '４' or '١'.
_VERSION = re.compile(r"([0-9]+)\.([0-9]+)(?:\.[0-9]+)?(?:[.\-+]?(?:rc|a|b|post|dev)[0-9]*)?", re.ASCII)
_TIER = re.compile(r"[ \t]*([0-9]{1,12})[ \t]*:[ \t]*(-?[0-9]{1,12})[ \t]*", re.ASCII)


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
        """The one K of that batch size: "4:4,8:2".choices(6) == (2,)."""
        return (self.draft_len(batch_size),)

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
        _validate(tiers, max_draft_len)
        return cls(tuple(tiers))

    @classmethod
    def from_vllm(cls, schedule: object, num_speculative_tokens: int,
                  max_batch_size: int | None = None) -> "DraftSchedule":
        """vLLM's `speculative_token_schedule` -> the schedule vLLM actually runs.

        vLLM's rules (vllm/v1/spec_decode/dynamic/utils.py, validate_and_normalize_dynamic_sd_schedule
        and build_dynamic_sd_schedule_lookup, vllm-project/vllm @ 14b450ca590cbff96e7004bdb147a5d3acf5a4f6):
          - a non-empty list of all 3-item [bs_lo, bs_hi, K] or all 5-item
            [bs_lo, bs_hi, ctx_lo, ctx_hi, K] entries; batch ranges start at 1 and do not overlap;
            5-item entries form a full (batch range x context range) grid, context ranges
            contiguous from 1, the last one open-ended;
          - a batch size in a gap, or past the last range, keeps the K of the range before it;
          - every K is capped at num_speculative_tokens; only 1..max_batch_size is ever looked up.
        So in each context bucket K(b) = min(cap, K of the entry with the largest bs_lo <= b):
            [[1, 4, 4], [9, 16, 1]], cap 4  ->  b 1..8: 4, b 9..: 1 (no K=0 anywhere).
        A DraftSchedule keys on the batch size alone and ends at K=0, so this refuses a grid whose
        K depends on the context bucket, and (without max_batch_size) a last K above 0.
        """
        if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
                or not 1 <= num_speculative_tokens <= MAX_DRAFT_LEN:
            raise ScheduleError(f"num_speculative_tokens={num_speculative_tokens!r} is outside 1..{MAX_DRAFT_LEN}")
        if max_batch_size is not None and not 1 <= max_batch_size <= MAX_BATCH_SIZE:
            raise ScheduleError(f"max_batch_size={max_batch_size!r} is outside 1..{MAX_BATCH_SIZE}")
        buckets = _vllm_buckets(schedule)
        steps = {ctx: _vllm_steps(entries, num_speculative_tokens, max_batch_size) for ctx, entries in buckets.items()}
        (ctx0, first), *rest = steps.items()
        for ctx, other in rest:
            if other != first:
                b = next(min(a[0], c[0]) for a, c in zip(first + ((MAX_BATCH_SIZE, -1),), other + ((MAX_BATCH_SIZE, -2),))
                         if a != c)
                raise ScheduleError(
                    f"vLLM schedule: K depends on the context length (context {list(ctx0)} and {list(ctx)} differ "
                    f"from batch size {b} on); a DraftSchedule keys on the batch size only"
                )
        tiers = [(first[i + 1][0] - 1, k) for i, (_, k) in enumerate(first[:-1])]
        last_lo, last_k = first[-1]
        if last_k:
            if max_batch_size is None:
                raise ScheduleError(
                    f"vLLM schedule: K={last_k} from batch size {last_lo} applies to every larger batch "
                    "(vLLM carries the last K forward); add a closing [b, b, 0] range or pass max_batch_size"
                )
            tiers.append((max_batch_size, last_k))
        return cls(tuple(tiers))

    @classmethod
    def from_trtllm(cls, schedule: Mapping[int | str, int], version: str) -> "DraftSchedule":
        """Inverse of to_trtllm for the named version's dialect."""
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
        """vLLM `speculative_token_schedule` (run it with num_speculative_tokens=max_draft_len).

        "4:4,8:2" -> [[1, 4, 4], [5, 8, 2], [9, 2147483647, 0]]: the closing K=0 range is needed
        because vLLM carries the last range's K to every larger batch."""
        if not self.tiers:
            raise ScheduleError(
                "schedule never speculates (K=0 for every batch size); vLLM rejects an empty "
                "speculative_token_schedule: run without speculative decoding instead"
            )
        out, start = [], 1
        for bound, k in self.tiers:
            out.append([start, bound, k])
            start = bound + 1
        if start <= MAX_BATCH_SIZE:
            out.append([start, MAX_BATCH_SIZE, 0])
        return out

    def to_spec(self) -> str:
        """CLI form; DraftSchedule.parse(s.to_spec()) == s."""
        return ",".join(f"{b}:{k}" for b, k in self.tiers)

    def __str__(self) -> str:
        return self.to_spec() or "(no speculation)"


def vllm_context_buckets(contexts: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Inclusive context ranges, one per profiled context, split at the midpoints between them
    (a context on a midpoint goes to the lower one); the first starts at 1, the last is open-ended.

    (512, 2048, 4096) -> ((1, 1280), (1281, 3072), (3073, 2147483647))"""
    cs = list(contexts)
    if not cs or any(isinstance(c, bool) or not isinstance(c, int) or not 1 <= c < MAX_BATCH_SIZE for c in cs):
        raise ScheduleError(f"vLLM context buckets: contexts {cs!r} must be integers in 1..{MAX_BATCH_SIZE - 1}")
    if any(b <= a for a, b in zip(cs, cs[1:])):
        raise ScheduleError(f"vLLM context buckets: contexts {cs!r} must be strictly ascending")
    his = [(a + b) // 2 for a, b in zip(cs, cs[1:])] + [MAX_BATCH_SIZE]
    return tuple(zip([1] + [h + 1 for h in his[:-1]], his))


def to_vllm_grid(by_context: Sequence[tuple[int, "DraftSchedule"]]) -> list[list[int]]:
    """vLLM's 5-item `speculative_token_schedule` [bs_lo, bs_hi, ctx_lo, ctx_hi, K] from one schedule
    per profiled context (ascending): context buckets from vllm_context_buckets, and in every
    bucket the same batch ranges, split at every schedule's bounds, so the entries form the full
    (batch range x context range) grid vLLM requires. Run with num_speculative_tokens = the largest K.

    [(512, "4:3"), (2048, "2:3,8:1")] ->
        [[1, 2, 1, 1280, 3], [3, 4, 1, 1280, 3], [5, 8, 1, 1280, 0], [9, 2147483647, 1, 1280, 0],
         [1, 2, 1281, 2147483647, 3], [3, 4, 1281, 2147483647, 1], [5, 8, 1281, 2147483647, 1],
         [9, 2147483647, 1281, 2147483647, 0]]"""
    if not by_context:
        raise ScheduleError("vLLM grid: no schedules to render")
    contexts = [c for c, _ in by_context]
    buckets = vllm_context_buckets(contexts)
    if not any(s.tiers for _, s in by_context):
        raise ScheduleError("every context's schedule never speculates (K=0 everywhere); vLLM rejects such a "
                            "speculative_token_schedule: run without speculative decoding instead")
    starts = sorted({1} | {bound + 1 for _, s in by_context for bound in s.bounds if bound < MAX_BATCH_SIZE})
    ranges = list(zip(starts, [s - 1 for s in starts[1:]] + [MAX_BATCH_SIZE]))
    return [[lo, hi, c_lo, c_hi, sched.draft_len(lo)]
            for (c_lo, c_hi), (_, sched) in zip(buckets, by_context) for lo, hi in ranges]


def _plain_int(value: object) -> int | None:
    """4 or '4' -> 4 (JSON object keys are strings); '４', '4.0', True, 4.0 -> None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}", value, re.ASCII):
        return int(value)
    return None


def _vllm_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"vLLM schedule {where}: {value!r} is not an integer")
    return value


def _vllm_buckets(schedule: object) -> dict[tuple[int, int], list[tuple[int, int, int]]]:
    """vLLM's validation, and its entries grouped by context range: {(ctx_lo, ctx_hi): [(bs_lo, bs_hi, K)]}."""
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ScheduleError(f"vLLM schedule {schedule!r} must be a non-empty list of [bs_lo, bs_hi, K] ranges")
    arity = {len(e) if isinstance(e, (list, tuple)) else None for e in schedule}
    if not arity <= {3, 5} or len(arity) != 1:
        raise ScheduleError(
            f"vLLM schedule entries must all be [bs_lo, bs_hi, K] or all [bs_lo, bs_hi, ctx_lo, ctx_hi, K]; got {schedule!r}"
        )
    cells: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    for i, e in enumerate(schedule):
        vals = [_vllm_int(v, f"entry {i} {list(e)!r}") for v in e]
        bs_lo, bs_hi, k = vals[0], vals[1], vals[-1]
        ctx_lo, ctx_hi = (vals[2], vals[3]) if len(vals) == 5 else (1, MAX_BATCH_SIZE)
        if not 1 <= bs_lo <= bs_hi:
            raise ScheduleError(f"vLLM schedule entry {i} {list(e)!r}: batch range must satisfy 1 <= start <= end")
        if not 1 <= ctx_lo <= ctx_hi:
            raise ScheduleError(f"vLLM schedule entry {i} {list(e)!r}: context range must satisfy 1 <= start <= end")
        if k < 0:
            raise ScheduleError(f"vLLM schedule entry {i} {list(e)!r}: negative K")
        if (bs_lo, bs_hi, ctx_lo) in cells:
            raise ScheduleError(f"vLLM schedule entry {i} {list(e)!r}: duplicate cell")
        cells[(bs_lo, bs_hi, ctx_lo)] = (ctx_lo, ctx_hi, k)
    bs_ranges = sorted({(lo, hi) for lo, hi, _ in cells})
    for (lo0, hi0), (lo1, hi1) in zip(bs_ranges, bs_ranges[1:]):
        if lo1 <= hi0:
            raise ScheduleError(f"vLLM schedule: batch ranges [{lo0}, {hi0}] and [{lo1}, {hi1}] overlap")
    if bs_ranges[0][0] != 1:
        raise ScheduleError(f"vLLM schedule: the first batch range starts at {bs_ranges[0][0]}; it must start at 1")
    ctx_ranges = sorted({(c_lo, c_hi) for c_lo, c_hi, _ in cells.values()})
    if len(cells) != len(bs_ranges) * len(ctx_ranges):
        raise ScheduleError(
            f"vLLM schedule: {len(cells)} entries do not form a {len(bs_ranges)} x {len(ctx_ranges)} "
            "(batch range x context range) grid"
        )
    if ctx_ranges[0][0] != 1:
        raise ScheduleError(f"vLLM schedule: the first context range starts at {ctx_ranges[0][0]}; it must start at 1")
    for (lo0, hi0), (lo1, hi1) in zip(ctx_ranges, ctx_ranges[1:]):
        if lo1 != hi0 + 1:
            raise ScheduleError(f"vLLM schedule: context ranges [{lo0}, {hi0}] and [{lo1}, {hi1}] are not contiguous")
    buckets: dict[tuple[int, int], list[tuple[int, int, int]]] = {r: [] for r in ctx_ranges}
    for (bs_lo, bs_hi, _), (ctx_lo, ctx_hi, k) in cells.items():
        buckets[(ctx_lo, ctx_hi)].append((bs_lo, bs_hi, k))
    return buckets


def _vllm_steps(entries: list[tuple[int, int, int]], cap: int, max_batch_size: int | None) -> tuple[tuple[int, int], ...]:
    """One context bucket -> ((first batch size, K), ...): K holds from each first batch size up to
    the next one (vLLM's carry-forward), capped; neighbours with equal K merged.

    [(1, 4, 6), (9, 16, 1), (20, 30, 1)], cap 4 -> ((1, 4), (9, 1))"""
    out: list[tuple[int, int]] = []
    for lo, _, k in sorted(entries):
        if max_batch_size is not None and lo > max_batch_size:
            break
        k = min(k, cap)
        if not out or out[-1][1] != k:
            out.append((lo, k))
    return tuple(out)


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
    """Whether `policy`'s plans carry the draft (Policy.drafts): a schedule with a tier, an
    adaptive policy, a ConstantK. One that does not runs the target alone (StepPlan.draft False):
    speculates(DraftSchedule.parse("")) is False."""
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
