"""The check shared by the Triton rope_write tests (test_rope_kernel.py on CPU under Triton's
interpreter, test_gpu.py on CUDA): layer_ops.rope_write in float32, eager, is the oracle."""
from __future__ import annotations

import torch

from dynspec.runtime.engines.reference.layer_ops import rope_tables, rope_write


def assert_rope_write_matches(fn, device: str, dtype: torch.dtype, n: int, nh: int = 32, kvh: int = 8,
                              hd: int = 128, layers: int = 3, pool: int = 512) -> None:
    """fn (rope_write's signature) on random qkv [n, (nh + 2 kvh) * hd] and pools that are layer 1 of
    random [layers, kvh, pool, hd] caches, written at n distinct nonzero positions: q, and the
    caches, == rope_write's in float32 within one ulp of dtype (Triton's interpreter truncates
    to bfloat16, CUDA rounds to nearest); v and every other entry exact."""
    g = torch.Generator().manual_seed(n)
    qkv = torch.randn(n, (nh + 2 * kvh) * hd, generator=g).to(device, dtype)
    cos, sin = rope_tables(hd, 500000.0, None, 4096, device, dtype)
    pos = torch.randint(0, 4096, (n,), generator=g).to(device)
    cos, sin = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)                   # [n, 1, hd/2], as Target.embed
    k_cache, v_cache = (torch.randn(layers, kvh, pool, hd, generator=g).to(device, dtype) for _ in range(2))
    widx = (1 + torch.randperm(pool - 1, generator=g)[:n]).to(device)
    k_ref, v_ref = k_cache.float(), v_cache.float()
    q_ref = rope_write(qkv.float(), cos.float(), sin.float(), k_ref[1], v_ref[1], widx, nh, kvh)
    q = fn(qkv, cos, sin, k_cache[1], v_cache[1], widx, nh, kvh)
    assert q.shape == (n, nh, hd) and q.dtype == dtype and q.is_contiguous()
    tol = dict(rtol=2 ** -7, atol=1e-5) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(q.float(), q_ref, **tol)
    torch.testing.assert_close(k_cache.float(), k_ref, **tol)
    assert torch.equal(v_cache.float(), v_ref)
    kept = torch.ones(pool, dtype=torch.bool, device=device)
    kept[widx] = False
    assert torch.equal(k_cache[:, :, kept].float(), k_ref[:, :, kept])
    assert torch.equal(k_cache[[0, 2]].float(), k_ref[[0, 2]])
