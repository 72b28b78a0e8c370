"""The check shared by the Triton SwiGLU tests (test_swiglu_kernel.py on CPU under Triton's
interpreter, test_gpu.py on CUDA): layer_ops.silu_mul, eager, is the oracle."""
from __future__ import annotations

import torch

from dynspec.runtime.engines.reference.layer_ops import silu_mul


def assert_swiglu_matches(fn, device: str, dtype: torch.dtype, rows: int, n: int) -> None:
    """fn (silu_mul's signature) on random [gate | up] rows [rows, 2n], a strided view (every other
    row of a bigger tensor, as a GEMM's output is sliced): == the eager function's at float64;
    at float32 within torch's and Triton's exp (a few ulp); at bfloat16 on CUDA within one ulp of
    each of its two roundings, under Triton's interpreter (which truncates where CUDA rounds) three.
    Also: no rows, no width, and a 3-D input whose leading dims are kept."""
    g = torch.Generator().manual_seed(rows * 1000 + n)
    big = (4 * torch.randn(2 * rows, 2 * n, generator=g)).to(device, dtype)
    x = big[::2]                                                            # [rows, 2n], row stride 4n
    before = big.clone()
    y, ref = fn(x), silu_mul(x)
    assert y.shape == ref.shape == (rows, n) and y.dtype == dtype
    if dtype == torch.float64:
        torch.testing.assert_close(y, ref, rtol=1e-14, atol=1e-14)
    elif dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
    else:
        ulps = 3 if device == "cpu" else 1
        torch.testing.assert_close(y, ref, rtol=ulps * 2 ** -7, atol=ulps * 2 ** -9)
    assert torch.equal(big, before)                                         # the input untouched
    assert fn(x[:0]).shape == (0, n)                                        # no rows: nothing launched
    assert fn(torch.zeros(2, rows, 0, dtype=dtype, device=device)).shape == (2, rows, 0)   # no width
    three = big.reshape(2, rows, 2 * n)                                     # [2, rows, 2n]: leading dims kept
    assert fn(three).shape == (2, rows, n)
    assert torch.equal(fn(three)[1], fn(big[rows:]))


CASES = [(1, 64), (5, 80), (3, 1100)]      # rows, n: one row, a width not a power of two, two blocks and a tail


def run_interpreted() -> None:
    """Every case in bfloat16, float32 and float64. Run with TRITON_INTERPRET=1 set before Triton is
    imported (tests/test_swiglu_kernel.py)."""
    from dynspec.runtime.engines.reference import swiglu_kernel

    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        for rows, n in CASES:
            assert_swiglu_matches(swiglu_kernel.silu_mul_triton, "cpu", dtype, rows, n)
            print("ok", dtype, rows, n)
