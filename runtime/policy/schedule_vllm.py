"""A schedule's tiers <-> vLLM's `speculative_token_schedule`, read and rendered.

vLLM takes inclusive [start, end, K] batch ranges and carries the last range's K to every larger
batch, so a rendering closes with a K=0 range (run it with num_speculative_tokens=max_draft_len):
    vllm_from_tiers(DraftSchedule.parse("4:4,8:2,32:1").tiers)
        == [[1, 4, 4], [5, 8, 2], [9, 32, 1], [33, 2147483647, 0]]
One schedule per profiled context renders as vLLM's 5-item [bs_lo, bs_hi, ctx_lo, ctx_hi, K]
grid (to_vllm_grid, over vllm_context_buckets). tiers_from_vllm reads either form back as the
tiers of the schedule vLLM actually runs:
    tiers_from_vllm([[1, 4, 4], [5, 8, 2], [9, 9, 0]], 4) == ((4, 4), (8, 2))   # "4:4,8:2"
DraftSchedule.to_vllm and DraftSchedule.from_vllm (runtime/policy/__init__.py) call vllm_from_tiers and
tiers_from_vllm here; this module works on tiers (and on schedules it is handed) and imports no policy.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from dynspec.runtime.policy.schedule_limits import MAX_BATCH_SIZE, MAX_DRAFT_LEN, ScheduleError


class Schedule(Protocol):
    """What to_vllm_grid reads of each DraftSchedule it is handed."""
    tiers: tuple[tuple[int, int], ...]

    @property
    def bounds(self) -> tuple[int, ...]: ...

    def draft_len(self, batch_size: int) -> int: ...


def tiers_from_vllm(schedule: object, num_speculative_tokens: int,
                    max_batch_size: int | None = None) -> tuple[tuple[int, int], ...]:
    """vLLM's `speculative_token_schedule` -> the tiers of the schedule vLLM actually runs
    (DraftSchedule.from_vllm checks and keeps them).

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
    return tuple(tiers)


def vllm_from_tiers(tiers: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """vLLM `speculative_token_schedule` (run it with num_speculative_tokens=max_draft_len).

    "4:4,8:2" -> [[1, 4, 4], [5, 8, 2], [9, 2147483647, 0]]: the closing K=0 range is needed
    because vLLM carries the last range's K to every larger batch."""
    if not tiers:
        raise ScheduleError(
            "schedule never speculates (K=0 for every batch size); vLLM rejects an empty "
            "speculative_token_schedule: run without speculative decoding instead"
        )
    out, start = [], 1
    for bound, k in tiers:
        out.append([start, bound, k])
        start = bound + 1
    if start <= MAX_BATCH_SIZE:
        out.append([start, MAX_BATCH_SIZE, 0])
    return out


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


def to_vllm_grid(by_context: Sequence[tuple[int, Schedule]]) -> list[list[int]]:
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
