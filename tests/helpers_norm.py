"""The check shared by the Triton RMSNorm tests (test_norm_kernel.py on CPU under Triton's
interpreter, test_gpu.py on CUDA): layer_ops.add_rms_norm / layer_ops.rms_norm, eager, are the oracle."""
from __future__ import annotations

import torch

from dynspec.runtime.engines.reference.layer_ops import add_rms_norm, rms_norm


def assert_norm_matches(add_fn, norm_fn, device: str, dtype: torch.dtype, rows: int, n: int) -> None:
    """add_fn (add_rms_norm's signature) and norm_fn (rms_norm's) on random rows [rows, n], x a
    strided view (every other row of a bigger tensor, as packed streams are sliced): the residual
    sum exact, the normed rows == the eager functions' at the same dtype (float32 / float64: to
    the sum's rounding; bfloat16 on CUDA: within one ulp; under Triton's interpreter, which truncates
    where CUDA rounds, within three)."""
    g = torch.Generator().manual_seed(rows * 1000 + n)
    big = (4 * torch.randn(2 * rows, n, generator=g)).to(device, dtype)
    x = big[::2]                                                            # [rows, n], row stride 2n
    r = torch.randn(rows, n, generator=g).to(device, dtype)
    w = (1 + torch.randn(n, generator=g) / 4).to(device, dtype)
    eps = 1e-5
    before = big.clone()
    y_ref, h_ref = add_rms_norm(x, r, w, eps)
    y, h = add_fn(x, r, w, eps)
    assert y.shape == h.shape == (rows, n) and y.dtype == h.dtype == dtype
    tol = dict(rtol=2 ** -7, atol=1e-5) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    if dtype == torch.bfloat16 and device == "cpu":                         # the interpreter truncates each of
        tol = dict(rtol=2 ** -5, atol=2 ** -6)                              # 3 casts: up to 3 ulp apart
        torch.testing.assert_close(y, y_ref, **tol)
    else:
        assert torch.equal(y, y_ref)                                        # one rounding, as torch's add
    torch.testing.assert_close(h, h_ref, **tol)
    torch.testing.assert_close(norm_fn(x, w, eps), rms_norm(x, w, eps), **tol)
    assert torch.equal(big, before)                                         # x and the rows between untouched


CASES = [(1, 4096), (5, 64), (3, 80)]      # rows, n: the 8B's b=1 row, a tiny model's, a width not a power of two


def run_interpreted() -> None:
    """Every case in bfloat16, float32 and float64. Run with TRITON_INTERPRET=1 set before Triton is
    imported (tests/test_norm_kernel.py)."""
    from dynspec.runtime.engines.reference import norm_kernel

    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        for rows, n in CASES:
            assert_norm_matches(norm_kernel.add_rms_norm_triton, norm_kernel.rms_norm_triton, "cpu", dtype, rows, n)
            print("ok", dtype, rows, n)
