"""One check of paged_decode.paged_decode_attention against attention.sdpa_attention (the oracle),
shared by the CPU interpreter test and the GPU test."""
import random

import torch

from dynspec.runtime.engines.reference.attention import sdpa_attention, uniform_batch


def paged_case(device, dtype, R, T, nh, kvh, hd, bs, max_blocks, seed=0):
    """A pool that is layer 1 of a 3-layer cache, rows with shuffled block tables and random
    lengths (a verify window may cross a block), plus one padding row on the scratch block 0.
    -> (q [R'*T, nh, hd], k_pool, v_pool, batch)"""
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    n_blocks = 1 + R * max_blocks
    cache = torch.randn(3, 2, kvh, n_blocks * bs, hd, generator=g).to(device, dtype)
    k_pool, v_pool = cache[1, 0], cache[1, 1]
    tables = (torch.randperm(n_blocks - 1, generator=g) + 1)[: R * max_blocks].view(R, max_blocks)
    block_tables = torch.cat([tables, torch.zeros(1, max_blocks, dtype=torch.long)]).to(device)   # row R: padding
    starts = [rng.randint(0, max_blocks * bs - T) for _ in range(R)] + [0]
    q_pos = torch.tensor([[p + t for t in range(T)] for p in starts], device=device)
    batch = uniform_batch(block_tables, torch.arange(R + 1, device=device), q_pos, max_blocks, bs)
    q = torch.randn((R + 1) * T, nh, hd, generator=g).to(device, dtype)
    return q, k_pool, v_pool, batch


def assert_paged_matches(fn, device, dtype, R, T, nh, kvh, hd, bs, max_blocks, **kw):
    q, k_pool, v_pool, batch = paged_case(device, dtype, R, T, nh, kvh, hd, bs, max_blocks)
    ref = sdpa_attention(q.double(), k_pool.double(), v_pool.double(), batch)
    out = fn(q, k_pool, v_pool, batch, bs, **kw)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    err = (out.double() - ref).abs().max().item()
    assert out.shape == ref.shape and out.dtype == dtype and err < tol, f"max abs error {err}"
    return q, k_pool, v_pool, batch, out


INTERPRETED_CASES = [     # R, T, nh, kvh, hd, bs, blocks, sms
    (1, 1, 8, 2, 32, 64, 3, 4),        # several splits, a tile per program
    (3, 3, 8, 2, 32, 16, 5, 2),        # verify windows across blocks, tiles of a whole block
    (2, 2, 4, 4, 16, 128, 2, 64),      # no GQA, more splits than tiles used
    (2, 1, 8, 1, 16, 64, 2, 1),        # one split: no merge across programs
    (2, 1, 8, 2, 32, 64, 5, 8),        # 5 tiles over 2 splits of 3: the last split's third tile is past the table
]


def run_interpreted() -> None:
    """Every INTERPRETED_CASES case twice (the second launch finds the counters reset). Run in a
    process with TRITON_INTERPRET=1 set before Triton is imported (tests/test_paged_decode.py)."""
    from dynspec.runtime.engines.reference import paged_decode

    for R, T, nh, kvh, hd, bs, blocks, sms in INTERPRETED_CASES:
        q, k, v, batch, out = assert_paged_matches(paged_decode.paged_decode_attention, "cpu", torch.float32,
                                                   R, T, nh, kvh, hd, bs, blocks, sms=sms)
        assert int(paged_decode._counters[q.device][-1].abs().sum()) == 0, "counters not reset"
        assert torch.equal(paged_decode.paged_decode_attention(q, k, v, batch, bs, sms=sms), out)
        print("ok", R, T, nh, kvh, hd, bs, blocks, sms)
