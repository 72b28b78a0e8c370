"""Inflight batching on the paged KV cache: prompt chunks ride in the decode iterations under
the token budget max_num_tokens, and every output still equals transformers greedy (float64)."""
import random

import pytest
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.serving.driver import run_closed_loop
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.engines.reference.kv_cache import BlockAllocator
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.plan import batch_buckets, bucket_for, cap_k, chunk_sizes
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.generate.session import capture
from tests.helpers_lockstep import serve_arrivals, serve_in_lockstep
from tests.test_executor import DT, greedy_many, hf_target, pair, prompts  # noqa: F401  (fixtures)


def engine(pair, *, budget, max_batch=8, max_seq=128, kmax=6, **cache):
    return load_reference_engine(*pair, dtype=DT, max_batch_size=max_batch, max_seq_len=max_seq,
                                 max_draft_len=kmax, max_num_tokens=budget, **cache)


def check_budget(ex, budget):
    for s in ex.stats:
        assert s.decode_rows == s.batch_size
        assert s.decode_rows * (s.k + 1) + s.prefill_tokens + s.catch_up_tokens <= budget, s   # lazy sync's too


# ---- the pure rules ------------------------------------------------------------------------

def test_cap_k_and_chunk_sizes():
    assert [cap_k(4, b, 16) for b in (1, 3, 4, 5, 8, 9, 16, 17)] == [4, 4, 3, 2, 1, 0, 0, 0]
    assert cap_k(7, 0, 16) == 7
    assert chunk_sizes(10, [4, 9, 3]) == (4, 6, 0)
    assert chunk_sizes(0, [5]) == (0,)


def test_block_allocator_reserves_releases_and_refuses():
    a = BlockAllocator(num_blocks=6, block_size=4, max_blocks_per_seq=4, num_slots=3)
    s0 = a.reserve(9)
    assert a.tables[s0] == (1, 2, 3) and a.free_blocks == 2
    s1 = a.reserve(4)
    assert a.tables[s1] == (4,)
    assert a.reserve(9) is None                      # 1 block left, 3 needed
    assert a.release(s0) == (1, 2, 3) and a.free_blocks == 4
    assert a.reserve(9) is not None
    with pytest.raises(DynspecError, match="at most 4"):
        a.reserve(17)


# ---- lossless under the budget -------------------------------------------------------------

def test_prompts_three_times_the_budget_are_split_over_iterations(pair, hf_target):
    budget = 16
    eng = engine(pair, budget=budget)
    ps = prompts(4, seed=31, lo=3 * budget, hi=3 * budget)
    ex = Executor(eng, DraftSchedule.static(3, 8))
    res = run_closed_loop(ex, ps, 12, concurrency=4)
    assert [r.output_ids for r in res] == greedy_many(hf_target, ps, 12)
    check_budget(ex, budget)
    assert sum(s.prefill_tokens for s in ex.stats) == 4 * 3 * budget
    assert eng.free_blocks == eng.blocks.num_blocks - 1           # every block went back


def test_a_budget_so_small_that_one_prompt_takes_ten_iterations(pair, hf_target):
    budget = 5                                                     # one verify window at K=4
    eng = engine(pair, budget=budget, kmax=4)
    p = prompts(1, seed=32, lo=50, hi=50)[0]
    ex = Executor(eng, DraftSchedule.static(4, 8))
    res = run_closed_loop(ex, [p], 10, concurrency=1)
    assert res[0].output_ids == greedy_many(hf_target, [p], 10)[0]
    prefill = [s for s in ex.stats if s.prefill_tokens]
    assert len(prefill) == 10 and all(s.prefill_tokens == 5 for s in prefill)
    assert ex.stats[len(prefill)].decode_rows == 1                 # joins the decode rows next iteration
    check_budget(ex, budget)


@pytest.fixture
def packings(monkeypatch):
    """(B x T decode tokens ahead of the chunks, b x T real ones) of every eager mixed iteration."""
    from dynspec.runtime.engines.reference import eager_mixed

    seen = []
    real = eager_mixed.mixed_inputs

    def spy(parts, plan):
        m = real(parts, plan)
        seen.append((m.nd, plan.decode_tokens))
        return m

    monkeypatch.setattr(eager_mixed, "mixed_inputs", spy)
    return seen


def pad_rows_to_buckets(eng):
    """The CUDA row buckets on CPU (where every b is its own shape): decode rows b..B-1 pad to the
    bucket B in pure-decode and mixed iterations alike, as on the GPU."""
    eng.buckets = batch_buckets(eng.max_batch_size)


def padded_mixed(ex, eng):
    return [s for s in ex.stats if s.prefill_tokens and s.decode_rows
            and bucket_for(s.decode_rows, eng.buckets) > s.decode_rows]


@pytest.mark.parametrize("padded", [False, True])
def test_arrivals_while_others_decode_ride_in_the_decode_iterations(pair, hf_target, padded, packings):
    """Decode rows and prompt chunks in the same eager forward (SDPA over every row, the CPU
    path): iterations with both are seen, and every output is transformers'. padded: decode rows
    padded to the CUDA row buckets, so the chunks sit at B*T + j behind padding rows (the whole
    graphs' packing)."""
    budget = 24
    eng = engine(pair, budget=budget)
    if padded:
        pad_rows_to_buckets(eng)
    ex = Executor(eng, DraftSchedule.static(3, 8))
    ps = prompts(10, seed=33, lo=10, hi=40)
    lens = [6 + 3 * (i % 5) for i in range(10)]
    rng = random.Random(33)
    handles, i = [], 0
    while i < len(ps) or ex.active or ex.waiting:
        if i < len(ps) and (not handles or rng.random() < 0.3):
            handles.append(ex.submit(ps[i], lens[i]))
            i += 1
        ex.step()
    refs = greedy_many(hf_target, ps, max(lens))
    assert [h.result().output_ids for h in handles] == [r[:n] for r, n in zip(refs, lens)]
    both = [s for s in ex.stats if s.decode_rows > 0 and s.prefill_tokens > 0]
    assert both and any(s.k > 0 for s in both)
    check_budget(ex, budget)
    assert len(packings) == len([s for s in ex.stats if s.prefill_tokens])
    assert any(nd > real for nd, real in packings) == padded
    assert bool(padded_mixed(ex, eng)) == padded


def test_mixed_buckets_end_at_the_budget_or_1024():
    from dynspec.runtime.engines.reference.mixed_layout import BUCKETS, mixed_buckets

    assert mixed_buckets(72) == (16, 32, 48, 64, 72)
    assert mixed_buckets(64) == (16, 32, 48, 64)
    assert mixed_buckets(8192) == BUCKETS and BUCKETS[-1] == 1024


def test_token_buckets_pad_a_tenth_or_less():
    """Padding of the whole graphs' token buckets: at most 1/5 of a step past 128 tokens, and
    under a tenth on average over every size 16..1024 (a workload spread over them)."""
    from dynspec.runtime.engines.reference.mixed_layout import BUCKETS

    bucket = [next(b for b in BUCKETS if b >= n) for n in range(1, 1025)]
    pad = [(b - n) / b for n, b in zip(range(1, 1025), bucket)]
    assert max(pad[128:]) <= 0.2 and max(pad[15:]) < 0.5
    assert sum(b - n for n, b in zip(range(16, 1025), bucket[15:])) / sum(bucket[15:]) < 0.1


def serve_arrivals_and_check(ex, hf_target, seed: int) -> None:
    """14 prompts of 4..30 tokens arriving 0..2 an iteration while others decode, outputs of
    2..14 tokens; every output equals transformers greedy."""
    rng = random.Random(seed)
    ps = prompts(14, seed=seed, lo=4, hi=30)
    lens = [rng.randint(2, 14) for _ in ps]
    handles = serve_arrivals(ex, ps, lens, rng)
    refs = greedy_many(hf_target, ps, 14)
    assert [h.result().output_ids for h in handles] == [r[:n] for r, n in zip(refs, lens)]


@pytest.mark.parametrize("padded", [False, True])
def test_k_flipping_between_iterations_with_chunks_in_flight(pair, hf_target, padded):
    """Tiers flip K with every change of b, including 0 (keep-warm) while chunks ride along."""
    budget = 20
    eng = engine(pair, budget=budget, max_batch=6)
    if padded:
        pad_rows_to_buckets(eng)
    policy = DraftSchedule.parse("1:5,2:3,3:2,4:1")
    ex = Executor(eng, policy)
    serve_arrivals_and_check(ex, hf_target, seed=34)
    ks = [s.k for s in ex.stats if s.decode_rows]
    assert {0, 1, 2, 3, 5} <= set(ks)
    assert sum(a != b for a, b in zip(ks, ks[1:])) >= 5
    assert any(s.k == 0 and s.prefill_tokens for s in ex.stats if s.decode_rows)
    check_budget(ex, budget)
    assert bool(padded_mixed(ex, eng)) == padded


def test_the_fields_failure_case_under_a_budget(pair, hf_target):
    """Concurrency 10, threshold 5, K=15, a 72-token budget: 5 rows x 16 tokens do not fit,
    so K is capped for b=5 (72 // 5 - 1 = 13); above b=5 the policy gives 0. (With 64, four
    rows at K=15 would fill the budget and admissions would wait for a retirement.) Lazy draft
    sync: 5 x 14 tokens leave 2, so rows back from the K=0 stretch catch up at K=0 first
    (docs/design.md, "Draft sync")."""
    budget = 72
    eng = engine(pair, budget=budget, max_batch=10, max_seq=96, kmax=15)
    ex = Executor(eng, DraftSchedule.threshold(max_draft_len=15, disable_above=5))
    ps = prompts(14, seed=35, lo=3, hi=30)
    res = run_closed_loop(ex, ps, 24, concurrency=10)
    assert [r.output_ids for r in res] == greedy_many(hf_target, ps, 24)
    assert {s.k for s in ex.stats if s.decode_rows == 5 and not s.catch_up_tokens} == {13}
    assert {s.k for s in ex.stats if s.decode_rows == 5 and s.catch_up_tokens} <= {0, 13}
    assert any(s.decode_rows == 10 and s.k == 0 for s in ex.stats)
    assert any(s.k == 15 for s in ex.stats)
    check_budget(ex, budget)


def test_admission_waits_for_free_blocks_and_retiring_frees_them(pair, hf_target):
    """A pool of 9 blocks of 16 tokens (8 usable) holds two 60-token reservations at a time;
    the rest wait for a retirement, and every block comes back."""
    eng = engine(pair, budget=128, block_size=16, num_blocks=9)
    ex = Executor(eng, DraftSchedule.static(2, 8))
    ps = prompts(5, seed=36, lo=30, hi=40)
    hs = [ex.submit(p, 12) for p in ps]
    ex.step()
    assert ex.active == 2 and ex.waiting == 3
    ex.run_until_idle()
    assert [h.result().output_ids for h in hs] == greedy_many(hf_target, ps, 12)
    assert eng.free_blocks == 8


def test_budget_smaller_than_a_verify_window_is_refused(pair):
    with pytest.raises(DynspecError, match=r"max_num_tokens=4 is smaller than one verify window .*6 \+ 1 = 7"):
        engine(pair, budget=4)


def served(pair, *, max_batch: int, seed: int, lo: int, hi: int, lens) -> tuple:
    """An engine after 6 iterations of serving 3 prompts (static K=3, budget 32): a cache with
    rows of different lengths, stale entries past them and freed blocks -> (engine, the requests
    still holding a slot, at least 2)."""
    eng = engine(pair, budget=32, max_batch=max_batch, max_seq=64, kmax=3)
    ex = Executor(eng, DraftSchedule.static(3, max_batch))
    hs = [ex.submit(p, n) for p, n in zip(prompts(3, seed=seed, lo=lo, hi=hi), lens)]
    for _ in range(6):
        ex.step()
    live = [h._req for h in hs if h._req.slot is not None]
    assert len(live) >= 2
    return eng, live


def test_the_paged_ragged_forward_equals_transformers_logits(pair, hf_target):
    """One target forward over two prompt chunks of different rows and a decode row: every
    token's logits equal transformers' over that sequence alone."""
    from dynspec.runtime.engines.reference.attention import ragged_batch

    eng = engine(pair, budget=64, max_batch=3)
    seqs = prompts(3, seed=38, lo=20, hi=20)
    slots = [eng.reserve(40) for _ in seqs]
    # fill: row 0 gets 12 tokens first, then the ragged call carries 8 + 20 + 5 tokens
    t = eng.target
    first = ragged_batch(eng.block_tables, [slots[0]], [0], [12], eng.block_size)
    t.run(torch.tensor(seqs[0][:12]), first)
    starts, lens = [12, 0, 0], [8, 20, 5]
    batch = ragged_batch(eng.block_tables, slots, starts, lens, eng.block_size)
    toks = torch.tensor([x for s, p, n in zip(seqs, starts, lens) for x in s[p:p + n]])
    logits, _ = t.run(toks, batch)
    i = 0
    for s, p, n in zip(seqs, starts, lens):
        want = hf_target(torch.tensor([s[:p + n]])).logits[0, p:p + n]
        assert (logits[i:i + n] - want).abs().max() < 1e-5       # CPU logits come back in float32
        i += n


def test_reachable_graphs_follow_the_budget_cap():
    """Under a 12-token budget, K=4 at b=3 is capped to 3 (3 x 4 = 12): that graph is captured."""
    from dynspec.runtime.engines.reference.graph_keys import GraphKey, reachable_graphs

    keys = reachable_graphs([DraftSchedule.static(4, 8)], 4, True, max_num_tokens=12)
    assert {g.k for g in keys if g.kind == "spec"} == {4, 3, 2}       # b=1,2 -> 4; b=3 -> 3; b=4 -> 2
    assert GraphKey("spec", 4, 2) in keys and GraphKey("spec", 4, 4) not in keys


def test_item_cap_bounds_the_items_of_any_layout_of_a_key():
    """A key's launch holds every layout of its tokens: decode rows, up to max_chunks chunks of any
    lengths, and the pad's tail in rows of at most a block."""
    from dynspec.runtime.engines.reference.mixed_layout import item_cap
    from dynspec.runtime.engines.reference.ragged import item_count

    assert item_cap(16, 4, 2, 8) == 17
    # docs/design.md's worked example: b=3 rows at K=2 (row bucket 4) and a 5-token chunk: 14 tokens, bucket 16
    from dynspec.runtime.engines.reference.ragged import plan_items

    s0, s1, s2, pad, c = 5, 6, 7, 64, 9
    items = plan_items([s0, s1, s2, c, pad], [3, 3, 3, 5, 2], pad_to=item_cap(16, 4, 3, 16))
    assert items.shape == (3, 25) and (items[2, 6:] == 0).all()
    assert [tuple(x) for x in items[:, :6].T.tolist()] == [
        (s0, 0, 3), (s1, 3, 3), (s2, 6, 3), (c, 9, 4), (c, 13, 1), (pad, 14, 2)]
    rng = random.Random(3)
    for _ in range(300):
        B, T = rng.choice([(0, 1), (1, 1), (4, 2), (8, 4), (2, 20)])
        rows = [rng.randint(1, T) for _ in range(rng.randint(min(B, 1), B))]      # b <= B rows of K_r + 1 <= T
        Np = rng.choice([16, 32, 64, 128]) + sum(rows)
        left, chunks = Np - sum(rows), []
        while left and len(chunks) < 6 and rng.random() < 0.8:
            chunks.append(rng.randint(1, left))
            left -= chunks[-1]
        pad = [min(4, left - j) for j in range(0, left, 4)]
        assert item_count(rows + chunks + pad) <= item_cap(Np, B, T, 6), (B, T, Np, rows, chunks)


def test_whole_mixed_forward_equals_transformers(pair, hf_target):
    """Mixed iterations through mixed_graphs.py (the whole target forward with attention on
    static buffers; on CUDA one graph per (token bucket, row bucket, T), here the same functions
    eagerly): row buckets padded, K flipping through 0, arrivals while others decode, and
    transformers' tokens. Each run's staged work items cover every packed token once, in order,
    each decode row with an item of its own."""
    from dynspec.runtime.engines.reference.graph_keys import reachable_graphs
    from dynspec.runtime.engines.reference.mixed_layout import item_cap
    from dynspec.runtime.engines.reference.ragged import ITEM_FIELDS

    runs = []
    budget = 20
    eng = engine(pair, budget=budget, max_batch=6)
    pad_rows_to_buckets(eng)

    def spy(key) -> None:
        if not isinstance(key, tuple):                     # a decode step's GraphKey
            return
        Np, B, T, _ = key
        w = eng.whole
        ia = item_cap(Np, B, T, w.max_chunks)
        items = w.in_items[:ITEM_FIELDS * ia].view(ITEM_FIELDS, ia)
        n = int((items[2] > 0).sum())
        assert (items[2, n:] == 0).all()
        covered = torch.cat([torch.arange(int(q0), int(q0 + k)) for q0, k in zip(items[1, :n], items[2, :n])])
        assert covered.tolist() == list(range(Np))
        b = int((eng.slot[:B] != eng.pad_slot).sum())          # real decode rows (unpadded), the rest pad
        lens = items[2, :b].tolist()                            # T each; 1: a row still catching up (lazy) at K_r = 0
        assert set(lens) <= {T, 1} and items[1, :b].tolist() == [sum(lens[:r]) for r in range(b)]
        runs.append((key, b))

    eng.on_dispatch = spy
    policy = DraftSchedule.parse("1:5,2:3,3:2,4:1")
    assert capture(eng, reachable_graphs([policy], 6, True, budget)) == 0          # CPU: nothing captured
    ex = Executor(eng, policy)
    serve_arrivals_and_check(ex, hf_target, seed=35)
    top = eng.whole.buckets[-1]                            # past it: eager
    fits = [s for s in ex.stats if s.prefill_tokens and s.decode_rows * (s.k + 1) + s.prefill_tokens <= top]
    ups = [s for s in ex.stats if s.catch_up_tokens and not s.prefill_tokens]   # lazy sync's catch-up, rows beside
    assert len(fits) <= len(runs) <= len(fits) + len(ups) and fits  # every mixed iteration that fits went through it
    assert any(B > b > 0 for (_, B, _, _), b in runs)          # padded decode rows beside chunks
    assert any(T > 1 for (_, _, T, _), b in runs if b) and any(T == 1 for (_, _, T, _), b in runs if b)
    assert any(b == 0 for _, b in runs)                    # chunk-only iterations
    check_budget(ex, budget)


@pytest.mark.parametrize("sync", ["warm", "off", "lazy"])
def test_whole_iterations_leave_the_state_the_eager_path_leaves(pair, sync):
    """A whole-graph mixed iteration ends the step in the graph (at K = 0 mixed_graphs.WholeMixed._finish:
    greedy head, the rows' captures, keep-warm K/V, the draft's pass over the chunks with its head
    at the last tokens only; at K > 0 _verify: the draft chain, acceptance, one draft pass over
    the rows' catch-up entries and the chunks). Two engines serve the same arrivals in lockstep,
    one through it, one eagerly; after every step their carried state (next draft, draft hidden,
    last capture), both caches at every position a later step reads (each live request's
    positions below its pending one: past it, a row at K_r = 0 beside drafting rows, still catching
    up, leaves the rejected drafts' K/V on the eager path and nothing on the packed one, and those
    are rewritten before they are read) and, under lazy draft sync, the feature store
    (runtime/engines/reference/lazy_sync.py) match. A wrong draft state would not change the tokens
    (drafts are verified), so tokens alone could not catch it."""

    ts = []
    policy = DraftSchedule.parse("2:3,3:2,4:0")          # K = 0 from 4 decode rows up
    engines = [engine(pair, budget=20, max_batch=6) for _ in range(2)]
    for e in engines:
        pad_rows_to_buckets(e)
    engines[0].capture_whole_graphs()
    engines[0].on_dispatch = lambda key: isinstance(key, tuple) and ts.append(key[2] if key[1] else 0)   # T of rows
    exs = [Executor(e, policy, draft_sync=sync) for e in engines]
    rng = random.Random(41)
    ps = prompts(10, seed=41, lo=4, hi=30)
    lens = [rng.randint(2, 12) for _ in ps]
    def read_later(e, ex) -> torch.Tensor:
        """Cache rows of each live request's positions below its pending one (prompts: prefilled)."""
        bs, pool = e.block_size, ex._pool
        spans = [(r.slot, r.length) for r in pool.rows] + [(r.slot, r.prefilled) for r in pool.prefilling]
        return torch.tensor([e.slots.table(s)[p // bs] * bs + p % bs for s, n in spans for p in range(n)], dtype=torch.long)

    def check(step: int) -> None:
        a, b = engines
        n = a.pad_slot
        live = read_later(a, exs[0])
        assert torch.equal(live, read_later(b, exs[1])), step
        assert torch.equal(a.next_draft[:n], b.next_draft[:n]), step
        torch.testing.assert_close(a.draft_hidden[:n], b.draft_hidden[:n], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(a.last_capture[:n], b.last_capture[:n], rtol=1e-9, atol=1e-9)
        for x, y in ((a.draft.k_cache, b.draft.k_cache), (a.draft.v_cache, b.draft.v_cache),
                     (a.target.k_cache, b.target.k_cache)):
            torch.testing.assert_close(x[..., live, :], y[..., live, :], rtol=1e-9, atol=1e-9)
        if sync == "lazy":
            torch.testing.assert_close(a.features.ring[:n], b.features.ring[:n], rtol=1e-9, atol=1e-9)

    serve_in_lockstep(exs, ps, lens, rng, check)
    assert ts.count(1) >= 3 and sum(t > 1 for t in ts) >= 2 and [s.batch_size for s in exs[0].stats] == [s.batch_size for s in exs[1].stats]
    assert any(s.k == 0 and s.decode_rows and s.prefill_tokens for s in exs[0].stats)


def test_whole_keys_cover_each_row_shape_and_chunk_only_iterations():
    from dynspec.runtime.engines.reference.mixed_layout import STORE, whole_keys

    t, f = True, False
    assert whole_keys([(1, 2, t)], (16, 32)) == ((16, 0, 1, t), (16, 1, 2, t), (32, 0, 1, t), (32, 1, 2, t))
    assert whole_keys([(8, 3, t)], (16, 32)) == ((16, 0, 1, t), (32, 0, 1, t), (32, 8, 3, t))   # 24 decode tokens fill 16
    assert whole_keys([(2, 1, f)], (16,)) == ((16, 0, 1, f), (16, 2, 1, f))                       # the target alone
    # lazy sync: K=0 rows store (STORE), and a step without rows may store too (Executor._drafts_next)
    assert whole_keys([(1, 2, t), (1, 1, STORE)], (16,)) == ((16, 0, 1, t), (16, 0, 1, STORE), (16, 1, 1, STORE),
                                                             (16, 1, 2, t))


def test_ragged_batch_matches_a_row_by_row_layout():
    """ragged_batch's numpy layout against the row-by-row one it replaced (the docstring's rule,
    written out per row): rows of 1..7 tokens at scattered positions, shuffled block tables."""
    from dynspec.runtime.engines.reference.attention import ragged_batch

    g = torch.Generator().manual_seed(7)
    bs, per = 4, 6
    tables = torch.randperm(40, generator=g)[:5 * per].view(5, per)
    slots, starts, lens = [3, 0, 4, 1], [9, 0, 17, 5], [1, 7, 3, 2]
    got = ragged_batch(tables, slots, starts, lens, bs)
    R, Tq, n = len(lens), max(lens), sum(lens)
    q_index, q_pos = torch.full((R, Tq), n), torch.zeros(R, Tq, dtype=torch.long)
    out_index, positions, write = [], [], []
    i = 0
    for r, (s, p0, t) in enumerate(zip(slots, starts, lens)):
        for j in range(t):
            q_index[r, j], q_pos[r, j] = i + j, p0 + j
            out_index.append(r * Tq + j)
            positions.append(p0 + j)
            write.append(int(tables[s, (p0 + j) // bs]) * bs + (p0 + j) % bs)
        i += t
    read = -(-max(p + t for p, t in zip(starts, lens)) // bs)
    assert torch.equal(got.q_index, q_index) and torch.equal(got.q_pos, q_pos)
    assert got.out_index.tolist() == out_index and got.positions.tolist() == positions
    assert got.write_index.tolist() == write and got.slots.tolist() == slots
    assert torch.equal(got.tables, tables[slots][:, :read]) and got.kv_index.shape == (R, read * bs)
    assert not got.uniform


def test_padding_share_counts_the_whole_graphs_padding(pair):
    """The sweep's padding share of mixed iterations from the engine's padded forward size:
    row bucket and token bucket (engine.forward_tokens), decode-only iterations left out."""
    from types import SimpleNamespace

    from dynspec.benchmarks.sweep_rows import padding_share

    eng = engine(pair, budget=64, max_batch=8)
    pad_rows_to_buckets(eng)
    assert eng.forward_tokens(3, 1, 9) == 17                      # no whole graphs: rows padded only
    eng.capture_whole_graphs()
    # whole graphs: the rows unpadded, 3 x 2 + 9 = 15 tokens in the 16-token bucket; decode-only at one K: row buckets
    assert eng.forward_tokens(3, 1, 9) == 16 and eng.forward_tokens(3, 2, 0) == 12
    assert eng.forward_tokens(3, 2, 0, verify_tokens=5) == 16     # per-row K: a whole graph
    steps = [SimpleNamespace(decode_rows=3, k=1, drafted=3, prefill_tokens=9),
             SimpleNamespace(decode_rows=5, k=0, drafted=0, prefill_tokens=0)]
    assert padding_share(steps, eng.forward_tokens) == (16 - 15) / 16
    assert padding_share(steps[1:], eng.forward_tokens) is None
    per_row = SimpleNamespace(decode_rows=3, k=2, drafted=2, prefill_tokens=0)      # K = (2, 0, 0): 5 tokens
    assert padding_share([per_row], eng.forward_tokens) == (16 - 5) / 16
