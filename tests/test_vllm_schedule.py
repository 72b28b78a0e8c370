"""DraftSchedule <-> vLLM's `speculative_token_schedule`, checked against vLLM's own rule.

The oracle below is a transcription, in this file's own words, of what vLLM does with the list:
vllm/v1/spec_decode/dynamic/utils.py (validate_and_normalize_dynamic_sd_schedule,
build_dynamic_sd_schedule_lookup), vllm-project/vllm @ 14b450ca590cbff96e7004bdb147a5d3acf5a4f6.
It fills a dense table the way vLLM does (walk the ranges in order; a gap takes the previous
range's K; past the last range the last K carries on; every K capped), and does not share the
"largest bs_lo <= b" shortcut that dynspec's from_vllm uses.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynspec.runtime.policy import MAX_BATCH_SIZE, DraftSchedule, ScheduleError

OPEN = 2**31 - 1          # vLLM's open end for the last context range


class VllmRejects(Exception):
    pass


def vllm_grid(schedule):
    """vLLM's validation; {ctx bucket (lo, hi): [(bs_lo, bs_hi, K), ...]}."""
    if not isinstance(schedule, list) or not schedule:
        raise VllmRejects("empty or not a list")
    if {len(e) for e in schedule} not in ({3}, {5}):
        raise VllmRejects("mixed or wrong arity")
    rows = []
    for e in schedule:
        bs_lo, bs_hi, k = e[0], e[1], e[-1]
        ctx_lo, ctx_hi = (e[2], e[3]) if len(e) == 5 else (1, OPEN)
        if bs_lo <= 0 or bs_hi <= 0 or bs_lo > bs_hi or ctx_lo <= 0 or ctx_hi <= 0 or ctx_lo > ctx_hi or k < 0:
            raise VllmRejects(f"bad entry {e}")
        rows.append((bs_lo, bs_hi, ctx_lo, ctx_hi, k))
    bs = sorted({(r[0], r[1]) for r in rows})
    end = 0
    for lo, hi in bs:
        if lo <= end:
            raise VllmRejects("overlap")
        end = hi
    if bs[0][0] != 1:
        raise VllmRejects("first range does not start at 1")
    ctx = sorted({(r[2], r[3]) for r in rows})
    if len(rows) != len(bs) * len(ctx) or ctx[0][0] != 1:
        raise VllmRejects("not a grid")
    if any(ctx[i][0] != ctx[i - 1][1] + 1 for i in range(1, len(ctx))):
        raise VllmRejects("context gap")
    if len({(r[0], r[1], r[2]) for r in rows}) != len(rows):
        raise VllmRejects("duplicate cell")
    grid = {c: [] for c in ctx}
    for r in rows:
        grid[(r[2], r[3])].append((r[0], r[1], r[4]))
    return grid


def vllm_dense_lookup(schedule, max_batch_size, num_speculative_tokens, ctx_bucket=0):
    """table[b] = the K vLLM uses at batch size b (index 0 unused), for one context bucket."""
    grid = vllm_grid(schedule)
    entries = sorted(list(grid.values())[ctx_bucket])
    table = [0] * (max_batch_size + 1)
    cap = num_speculative_tokens
    nxt, last = 1, None
    for lo, hi, k in entries:
        if lo > nxt and last is not None:
            for b in range(nxt, min(lo, max_batch_size + 1)):
                table[b] = min(cap, last)
        for b in range(max(lo, nxt), min(hi, max_batch_size) + 1):
            table[b] = min(cap, k)
        nxt, last = max(nxt, hi + 1), k
        if nxt > max_batch_size:
            break
    for b in range(nxt, max_batch_size + 1):
        table[b] = min(cap, last)
    return table


# ---- the reported bug -----------------------------------------------------------------------
def test_old_rendering_speculated_past_the_last_range():
    s = DraftSchedule.parse("4:4,8:2")
    old = [[1, 4, 4], [5, 8, 2]]
    assert vllm_dense_lookup(old, 64, 4)[9:] == [2] * 56          # what vLLM did with the old list
    rendered = s.to_vllm()
    assert rendered != old
    table = vllm_dense_lookup(rendered, 64, 4)
    assert table[1:] == [s.draft_len(b) for b in range(1, 65)]      # K=0 from 9 on, as dynspec means
    with pytest.raises(ScheduleError, match="K=2 from batch size 5 applies to every larger batch"):
        DraftSchedule.from_vllm(old, 4)
    assert DraftSchedule.from_vllm(old, 4, max_batch_size=64) == DraftSchedule.parse("4:4,64:2")


def test_empty_schedule_is_not_rendered_and_empty_list_is_refused():
    with pytest.raises(ScheduleError, match="never speculates"):
        DraftSchedule().to_vllm()
    with pytest.raises(VllmRejects):
        vllm_grid([])
    for bad in ([], (), None, {}, "1,4,4"):
        with pytest.raises(ScheduleError, match="non-empty list"):
            DraftSchedule.from_vllm(bad, 4)


def test_gaps_carry_forward_and_k_is_capped():
    src = [[1, 2, 6], [5, 8, 3], [12, 12, 0]]                        # gaps 3..4 and 9..11
    assert vllm_dense_lookup(src, 14, 4)[1:] == [4, 4, 4, 4, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0]
    assert DraftSchedule.from_vllm(src, 4) == DraftSchedule.parse("4:4,11:3")


@pytest.mark.parametrize("schedule,needle", [
    ([[2, 4, 4]], "must start at 1"),
    ([[1, 4, 4], [4, 8, 2]], "overlap"),
    ([[1, 4, 4], [5, 3, 2]], "start <= end"),
    ([[1, 4, -1]], "negative K"),
    ([[1, 4, 4], [5, 8, 1, 9, 2]], "must all be"),
    ([[1, 4]], "must all be"),
    ([[1, 4, 4.5]], "not an integer"),
    ([[1, 4, True]], "not an integer"),
    ([[1, 4, 1, 10, 4], [1, 4, 12, 20, 4]], "not contiguous"),
    ([[1, 4, 1, 10, 4], [5, 9, 1, 10, 0], [1, 4, 11, 20, 4]], "grid"),
    ([[1, 4, 2, 10, 4]], "first context range starts at 2"),
    ([[1, 4, 2], [5, 8, 3], [9, 9, 0]], "increases"),                           # vLLM runs it; a DraftSchedule cannot
])
def test_bad_schedules_are_refused_with_the_value(schedule, needle):
    with pytest.raises(ScheduleError, match=needle):
        DraftSchedule.from_vllm(schedule, 4)


def test_num_speculative_tokens_is_checked():
    for bad in (0, -1, True, 33, 4.0):
        with pytest.raises(ScheduleError, match="num_speculative_tokens"):
            DraftSchedule.from_vllm([[1, 4, 4], [5, 5, 0]], bad)


# ---- the 5-item grid --------------------------------------------------------------------------
def test_grid_that_does_not_depend_on_context_reduces():
    grid = [[1, 4, 1, 1024, 4], [1, 4, 1025, 4096, 4], [5, 16, 1, 1024, 1], [5, 16, 1025, 4096, 1],
            [17, 17, 1, 1024, 0], [17, 17, 1025, 4096, 0]]
    s = DraftSchedule.from_vllm(grid, 4)
    assert s == DraftSchedule.parse("4:4,16:1")
    for bucket in (0, 1):
        assert vllm_dense_lookup(grid, 40, 4, bucket)[1:] == [s.draft_len(b) for b in range(1, 41)]


def test_grid_that_depends_on_context_is_refused():
    grid = [[1, 4, 1, 1024, 4], [1, 4, 1025, 4096, 2], [5, 8, 1, 1024, 0], [5, 8, 1025, 4096, 0]]
    with pytest.raises(ScheduleError, match=r"context \[1, 1024\] and \[1025, 4096\] differ from batch size 1 on"):
        DraftSchedule.from_vllm(grid, 4)
    # differing only where the cap or max_batch_size makes them equal is no difference
    capped = [[1, 4, 1, 9, 6], [1, 4, 10, 20, 5], [5, 8, 1, 9, 0], [5, 8, 10, 20, 1]]
    with pytest.raises(ScheduleError, match="differ from batch size 5 on"):
        DraftSchedule.from_vllm(capped, 4)
    assert DraftSchedule.from_vllm(capped, 4, max_batch_size=4) == DraftSchedule.parse("4:4")


# ---- properties -------------------------------------------------------------------------------
@st.composite
def schedules(draw):
    n = draw(st.integers(1, 6))
    bounds = sorted(draw(st.sets(st.integers(1, 300), min_size=n, max_size=n)))
    ks = sorted(draw(st.lists(st.integers(1, 16), min_size=n, max_size=n)), reverse=True)
    return DraftSchedule(tuple(zip(bounds, ks)))


@settings(max_examples=150, deadline=None)
@given(schedules(), st.integers(1, 400))
def test_rendering_read_by_vllm_equals_draft_len(s, max_bs):
    table = vllm_dense_lookup(s.to_vllm(), max_bs, s.max_draft_len)
    assert table[1:] == [s.draft_len(b) for b in range(1, max_bs + 1)]
    assert DraftSchedule.from_vllm(s.to_vllm(), s.max_draft_len) == s


@st.composite
def vllm_lists(draw):
    """Valid 3-item vLLM schedules: ranges from 1, with gaps, in any order, Ks above the cap."""
    starts = [1] + sorted(draw(st.sets(st.integers(2, 120), max_size=5)))
    ends = [draw(st.integers(lo, nxt - 1)) for lo, nxt in zip(starts, starts[1:])]
    ends.append(starts[-1] + draw(st.integers(0, 9)))
    out = [[lo, hi, draw(st.integers(0, 12))] for lo, hi in zip(starts, ends)]
    return draw(st.permutations(out))


@settings(max_examples=300, deadline=None)
@given(vllm_lists(), st.integers(1, 8), st.integers(1, 150))
def test_from_vllm_agrees_with_vllm_or_refuses(src, cap, max_bs):
    table = vllm_dense_lookup(src, max_bs, cap)[1:]
    ok = all(a >= b for a, b in zip(table, table[1:]))
    try:
        s = DraftSchedule.from_vllm(src, cap, max_batch_size=max_bs)
    except ScheduleError as e:
        assert not ok and "increases" in str(e), (src, table, e)
        return
    assert ok and [s.draft_len(b) for b in range(1, max_bs + 1)] == table
    # without max_batch_size: the same, if and only if the last K is 0
    full = vllm_dense_lookup(src, 130, cap)[1:]
    try:
        s_all = DraftSchedule.from_vllm(src, cap)
    except ScheduleError as e:
        assert full[-1] > 0 or any(a < b for a, b in zip(full, full[1:])), e
        return
    assert full[-1] == 0 and [s_all.draft_len(b) for b in range(1, 131)] == full


@settings(max_examples=100, deadline=None)
@given(schedules(), st.lists(st.integers(2, 5000), min_size=1, max_size=3, unique=True))
def test_context_grid_of_one_schedule_round_trips(s, cuts):
    ctx = [1] + sorted(cuts)
    buckets = [(ctx[i], ctx[i + 1] - 1) for i in range(len(ctx) - 1)] + [(ctx[-1], ctx[-1] + 10)]
    grid = [[lo, hi, c_lo, c_hi, k] for lo, hi, k in s.to_vllm() for c_lo, c_hi in buckets]
    assert DraftSchedule.from_vllm(grid, s.max_draft_len) == s
    assert MAX_BATCH_SIZE == OPEN
