"""The checks of ragged.ragged_attention (uniform rows, ragged rows, and the fused-RoPE form)
against attention.sdpa_attention (the oracle, after layer_ops.rope_write for the fused form), shared
by the CPU interpreter test and the GPU test."""
import random

import torch

from dynspec.runtime.engines.reference.attention import ragged_batch, sdpa_attention, uniform_batch


def paged_case(device, dtype, R, T, nh, kvh, hd, bs, max_blocks, seed=0, starts=None):
    """A pool that is layer 1 of a 3-layer cache, rows with shuffled block tables and random
    lengths (or row r's window at starts[r]), plus one padding row on the scratch block 0.
    -> (q [R'*T, nh, hd], k_pool, v_pool, batch)"""
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    n_blocks = 1 + R * max_blocks
    cache = torch.randn(3, 2, kvh, n_blocks * bs, hd, generator=g).to(device, dtype)
    k_pool, v_pool = cache[1, 0], cache[1, 1]
    tables = (torch.randperm(n_blocks - 1, generator=g) + 1)[: R * max_blocks].view(R, max_blocks)
    block_tables = torch.cat([tables, torch.zeros(1, max_blocks, dtype=torch.long)]).to(device)   # row R: padding
    starts = list(starts or [rng.randint(0, max_blocks * bs - T) for _ in range(R)]) + [0]
    q_pos = torch.tensor([[p + t for t in range(T)] for p in starts], device=device)
    batch = uniform_batch(block_tables, torch.arange(R + 1, device=device), q_pos, max_blocks, bs)
    q = torch.randn((R + 1) * T, nh, hd, generator=g).to(device, dtype)
    return q, k_pool, v_pool, batch


def assert_attention_close(out, ref, dtype) -> None:
    """A kernel's attention output against the float64 oracle: shape, dtype, and max abs error."""
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    err = (out.double() - ref).abs().max().item()
    assert out.shape == ref.shape and out.dtype == dtype and err < tol, f"max abs error {err}"


def assert_paged_matches(fn, device, dtype, R, T, nh, kvh, hd, bs, max_blocks, **kw):
    q, k_pool, v_pool, batch = paged_case(device, dtype, R, T, nh, kvh, hd, bs, max_blocks)
    ref = sdpa_attention(q.double(), k_pool.double(), v_pool.double(), batch)
    out = fn(q, k_pool, v_pool, batch, bs, **kw)
    assert_attention_close(out, ref, dtype)
    return q, k_pool, v_pool, batch, out


def assert_rope_paged_matches(device, dtype, R, T, nh, kvh, hd, bs, max_blocks, starts=None, **kw):
    """RaggedAttention.rope_attend on unrotated qkv [N, (nh + 2 kvh) * hd] == layer_ops.rope_write (in
    float64) on a copy of the pool, then sdpa_attention: the output (as assert_paged_matches), and the
    pool: every row's new K/V written, nothing else touched (K to about one bf16 ulp, V exact).
    starts: row r's window at starts[r] (a window across two programs' keys: the one program that
    holds each key must write it). -> (qkv, cos, sin, k_pool, v_pool, batch, out, (k, v) before)"""
    _, k_pool, v_pool, batch = paged_case(device, dtype, R, T, nh, kvh, hd, bs, max_blocks, starts=starts)
    before = k_pool.clone(), v_pool.clone()
    qkv, cos, sin, out = check_rope(device, dtype, k_pool, v_pool, batch, nh, kvh, hd, bs, max_blocks, R * 100 + T, **kw)
    return qkv, cos, sin, k_pool, v_pool, batch, out, before


def rope_attention(qkv, cos, sin, k_pool, v_pool, batch, bs, nh, **launch):
    """The fused-RoPE launch with test launch parameters (sms, per, ...)."""
    from dynspec.runtime.engines.reference import ragged

    return ragged._launch(None, k_pool, v_pool, batch, bs, rope=(qkv, cos, sin, nh), **launch)


def ragged_case(device, dtype, lens, nh, kvh, hd, bs, max_blocks, seed=0):
    """Rows of `lens` new tokens each, every row on a slot of its own with a shuffled block table,
    at a random start that leaves room for its tokens, plus a padding-slot row; a row of length
    > 1 is a chunk (a start of 0 for some). -> (q [N, nh, hd], k_pool, v_pool, batch with items)"""
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    R = len(lens)
    n_blocks = 1 + R * max_blocks
    cache = torch.randn(2, kvh, n_blocks * bs, hd, generator=g).to(device, dtype)
    k_pool, v_pool = cache[0], cache[1]
    tables = (torch.randperm(n_blocks - 1, generator=g) + 1)[: R * max_blocks].view(R, max_blocks)
    block_tables = torch.cat([tables, torch.zeros(1, max_blocks, dtype=torch.long)]).to(device)
    starts = [0 if r % 3 == 1 else rng.randint(0, max_blocks * bs - n) for r, n in enumerate(lens)]
    batch = ragged_batch(block_tables, list(range(R)) + [R], starts + [0], list(lens) + [2], bs)
    q = torch.randn(sum(lens) + 2, nh, hd, generator=g).to(device, dtype)
    return q, k_pool, v_pool, batch


def assert_ragged_matches(device, dtype, lens, nh, kvh, hd, bs, max_blocks, **kw):
    from dynspec.runtime.engines.reference.ragged import ragged_attention

    q, k_pool, v_pool, batch = ragged_case(device, dtype, lens, nh, kvh, hd, bs, max_blocks)
    ref = sdpa_attention(q.double(), k_pool.double(), v_pool.double(), batch)
    out = ragged_attention(q, k_pool, v_pool, batch, bs, **kw)
    assert_attention_close(out, ref, dtype)
    return q, k_pool, v_pool, batch, out


def check_rope(device, dtype, k_pool, v_pool, batch, nh, kvh, hd, bs, max_blocks, seed, **kw):
    """rope_attend's launch on random unrotated qkv against layer_ops.rope_write (float64, on a copy of
    the pool) then sdpa_attention: the output, and the pool (K to about one bf16 ulp, V exact).
    -> (qkv, cos, sin, out)"""
    from dynspec.runtime.engines.reference.layer_ops import rope_tables, rope_write

    g = torch.Generator().manual_seed(seed)
    n = batch.positions.shape[0]
    qkv = torch.randn(n, (nh + 2 * kvh) * hd, generator=g).to(device, dtype)
    cos, sin = rope_tables(hd, 500000.0, None, max_blocks * bs, device, dtype)
    cos, sin = cos[batch.positions].unsqueeze(1), sin[batch.positions].unsqueeze(1)    # [N, 1, hd/2]
    k_ref, v_ref = k_pool.double(), v_pool.double()
    q_ref = rope_write(qkv.double(), cos.double(), sin.double(), k_ref, v_ref, batch.write_index, nh, kvh)
    ref = sdpa_attention(q_ref, k_ref, v_ref, batch)
    out = rope_attention(qkv, cos, sin, k_pool, v_pool, batch, bs, nh, **kw)
    assert_attention_close(out, ref, dtype)
    close = dict(rtol=2 ** -7, atol=1e-5) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_pool.double(), k_ref, **close)
    assert torch.equal(v_pool.double(), v_ref)
    return qkv, cos, sin, out


RAGGED_CASES = [          # lens, nh, kvh, hd, bs, blocks, sms
    ((1, 1, 1), 8, 2, 32, 16, 4, 4),               # length-1 rows, as items
    ((3, 17, 1, 16), 8, 2, 32, 16, 4, 2),          # decode rows and chunks over the item edge (16, 17)
    ((40, 2, 33), 4, 4, 16, 64, 2, 64),            # no GQA, chunks of several items, several splits
    ((5, 64, 3), 8, 1, 16, 16, 6, 1),              # one split: no merge; a chunk of whole blocks
    ((2, 30, 2, 2), 4, 2, 64, 32, 3, 8),           # block-edge starts, a table past the tiles
]

ROPE_CROSSING = (2, 4, 8, 2, 32, 16, 6, 6, [46, 14])   # with the padding row 3 x 2 (row, KV head)s: 2 splits
                                                       # of keys 0..47 | 48..95; row 0's window 46..49 crosses
                                                       # them, row 1's 14..17 a block

INTERPRETED_CASES = [     # R, T, nh, kvh, hd, bs, blocks, sms
    (1, 1, 8, 2, 32, 64, 3, 4),        # several splits, a tile per program
    (3, 3, 8, 2, 32, 16, 5, 2),        # verify windows across blocks, tiles of a whole block
    (2, 2, 4, 4, 16, 128, 2, 64),      # no GQA, more splits than tiles used
    (2, 1, 8, 1, 16, 64, 2, 1),        # one split: no merge across programs
    (2, 1, 4, 4, 16, 64, 3, 8),        # one query per KV head (MQ = 1)
    (2, 1, 8, 2, 32, 64, 5, 8),        # 5 tiles over 2 splits of 3: the last split's third tile is past the table
]


def run_interpreted() -> None:
    """Every INTERPRETED_CASES case twice (the second launch finds the counters reset), then every
    RAGGED_CASES case twice. Run in a process with TRITON_INTERPRET=1 set before Triton is imported
    (tests/test_ragged_attention.py)."""
    from dynspec.runtime.engines.reference import ragged

    for R, T, nh, kvh, hd, bs, blocks, sms in INTERPRETED_CASES:
        q, k, v, batch, out = assert_paged_matches(ragged.ragged_attention, "cpu", torch.float32,
                                                   R, T, nh, kvh, hd, bs, blocks, sms=sms)
        assert int(ragged._counters[q.device][-1].abs().sum()) == 0, "counters not reset"
        assert torch.equal(ragged.ragged_attention(q, k, v, batch, bs, sms=sms), out)
        print("ok", R, T, nh, kvh, hd, bs, blocks, sms)
        qkv, cos, sin, k, v, batch, out, _ = assert_rope_paged_matches("cpu", torch.float32, R, T, nh, kvh, hd, bs,
                                                                        blocks, sms=sms)
        assert torch.equal(rope_attention(qkv, cos, sin, k, v, batch, bs, nh, sms=sms), out)
        print("ok rope", R, T, nh, kvh, hd, bs, blocks, sms)
    for lens, nh, kvh, hd, bs, blocks, sms in RAGGED_CASES:
        q, k, v, batch, out = assert_ragged_matches("cpu", torch.float32, lens, nh, kvh, hd, bs, blocks, sms=sms)
        assert int(ragged._counters[q.device][-1].abs().sum()) == 0, "counters not reset"
        assert torch.equal(ragged.ragged_attention(q, k, v, batch, bs, sms=sms), out)
        print("ok ragged", lens)
    R, T, nh, kvh, hd, bs, blocks, sms, starts = ROPE_CROSSING
    assert ragged.splits_for((R + 1) * kvh, blocks, sms) == 2        # tiles = blocks here (tile = bs)
    assert_rope_paged_matches("cpu", torch.float32, R, T, nh, kvh, hd, bs, blocks, starts=starts, sms=sms)
    print("ok crossing")


def run_whole_interpreted() -> None:
    """The CUDA path's attention under the interpreter (attention="triton" with TRITON_INTERPRET=1):
    whole-forward mixed iterations (mixed_graphs.py, uncaptured) and the eager decode and mixed
    steps, every row of every step through the ragged kernel (uniform decode rows, and decode rows
    with chunks as work items): arrivals while others decode, K flipping through 0, a budget that
    splits prompts; every output equals transformers greedy (float64). Run in a process with
    TRITON_INTERPRET=1 (tests/test_ragged_attention.py)."""
    import tempfile
    from pathlib import Path

    from transformers import LlamaForCausalLM

    from dynspec.runtime.engines.reference import ragged
    from dynspec.runtime.engines.reference.graph_keys import reachable_graphs
    from dynspec.runtime.engines.reference.load import load_reference_engine
    from dynspec.runtime.serving.executor import Executor
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.generate.session import capture
    from tests.helpers_models import make_tiny_draft, make_tiny_target
    from tests.test_executor import greedy_many
    from tests.test_per_request import FlipRows

    launches = []                  # (uniform rows T or None: items, items with decode rows and a chunk)
    real = ragged._launch

    def spy(q, k, v, batch, *a, **kw):
        items = batch.items
        launches.append(batch.q_pos.shape[1] if items is None else
                        ("items", bool((items[0][2] > 1).any()) and bool((items[0][2] == 1).any())))
        return real(q, k, v, batch, *a, **kw)

    ragged._launch = spy
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = make_tiny_target(root / "target", vocab=96, hidden=64, layers=3, heads=4, kv_heads=2, seed=1)
        draft = make_tiny_draft(root / "draft", target, draft_vocab=64, seed=2)
        hf = LlamaForCausalLM.from_pretrained(str(target), dtype=torch.float64).eval()
        for mode in ("whole", "eager", "per-row"):
            whole = mode != "eager"
            eng = load_reference_engine(str(target), str(draft), dtype=torch.float64, max_batch_size=4,
                                        max_seq_len=64, max_draft_len=3, max_num_tokens=16, attention="triton")
            assert eng.triton
            policy = FlipRows(3, seed=1) if mode == "per-row" else DraftSchedule.parse("1:3,2:2,3:0")
            if whole:
                capture(eng, reachable_graphs([policy], 4, True, 16))
            ex = Executor(eng, policy)
            rng = random.Random(5)
            ps = [tuple(rng.randrange(96) for _ in range(rng.randint(4, 20))) for _ in range(6)]
            lens = [rng.randint(3, 8) for _ in ps]
            handles = [ex.submit(p, n) for p, n in zip(ps[:3], lens[:3])]
            for p, n in zip(ps[3:], lens[3:]):
                ex.step()
                handles.append(ex.submit(p, n))
            ex.run_until_idle()
            refs = greedy_many(hf, ps, 8)
            assert [h.result().output_ids for h in handles] == [r[:n] for r, n in zip(refs, lens)]
            mixed = [s for s in ex.stats if s.decode_rows and s.prefill_tokens]
            assert mixed and any(s.k for s in mixed) and (mode == "per-row" or any(not s.k for s in mixed)), \
                [(s.k, s.decode_rows) for s in mixed]
            assert {1, 2, 3, 4} & set(launches) and 1 in launches               # uniform rows at T = K+1 and 1
            assert ("items", True) in launches                                  # decode rows and chunks in one launch
            if mode == "per-row":                                               # rows at their own K, unpadded
                assert sum(1 for s in ex.stats if s.drafted not in (0, s.decode_rows * s.k)) >= 3
            print("ok", mode, len(mixed), "mixed iterations,", len(launches), "kernel launches")
            launches.clear()


def run_target_interpreted() -> None:
    """Target.run's decode steps with RaggedAttention (its rope_attend: RoPE and the K/V write inside
    the kernel) == the same steps with rope_write and gathered SDPA, on a tiny target whose rows
    hold prompts of different lengths: logits, and both layers' caches, after each of 3 steps of
    1 and of 3 tokens a row. Run with TRITON_INTERPRET=1 (tests/test_ragged_attention.py)."""
    import tempfile

    from dynspec.runtime.engines.reference import ragged
    from dynspec.runtime.engines.reference.load import load_target
    from dynspec.runtime.engines.reference.model import row_batch
    from tests.helpers_models import make_tiny_target

    fused = []
    real = ragged._launch
    ragged._launch = lambda *a, **k: fused.append(k.get("rope") is not None) or real(*a, **k)
    with tempfile.TemporaryDirectory() as tmp:
        t = load_target(make_tiny_target(f"{tmp}/target", vocab=96, hidden=64, layers=2, heads=4, kv_heads=2, seed=3))
    t.setup_cache(3, 64)
    g = torch.Generator().manual_seed(0)
    lens = [5, 17, 30]                                        # row r's prompt fills positions < lens[r]
    for r, n in enumerate(lens):
        t.forward(torch.randint(0, 96, (1, n), generator=g), torch.arange(n)[None], row0=r)
    kernel = ragged.RaggedAttention(t.block_size)
    for T in (1, 3):
        for step in range(3):
            pos = torch.tensor([[n + t_ for t_ in range(T)] for n in lens])              # [3, T]
            tokens = torch.randint(0, 96, (3 * T,), generator=g)
            caches = t.k_cache.clone(), t.v_cache.clone()
            want, _ = t.run(tokens, row_batch(t, pos, 0, None), attention=sdpa_attention)
            want_caches = t.k_cache.clone(), t.v_cache.clone()
            t.k_cache.copy_(caches[0])
            t.v_cache.copy_(caches[1])
            n_fused = sum(fused)
            got, _ = t.run(tokens, row_batch(t, pos, 0, None), attention=kernel)
            assert sum(fused) == n_fused + 2, "rope_attend did not run in every layer"
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            for have, ref in zip((t.k_cache, t.v_cache), want_caches):    # layer 1's from layer 0's outputs
                torch.testing.assert_close(have, ref, rtol=1e-5, atol=1e-5)
            assert torch.equal(t.v_cache[0], want_caches[1][0])           # layer 0's V: the same inputs, copied
            lens = [n + T for n in lens]
    print("ok target", len(fused), "launches")
