"""`layer_ops.rms_norm` and `layer_ops.add_rms_norm` as one single-pass Triton kernel, for
`Kernels(compiled=True)` on CUDA. Inductor's kernel for them (`triton_red_fused_..._rsqrt`) took
about 3 us a launch at b=1 on the H200, 64 launches a step: at a hidden
size of 4096 it loops over the row twice, loading x and r once for the sum of squares and again
for the output. Here one program holds its whole row in registers, so each byte is read once.
`layer_ops.add_rms_norm` stays the CPU path and the oracle (tests/test_norm_kernel.py runs this kernel
in Triton's interpreter, tests/test_gpu.py on the GPU). Imported only where Triton runs."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _add_rms_norm_kernel(X, R, W, Y, H, stride_x, stride_r, stride_y, stride_h, n, eps,
                         HAS_R: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    """Program i: row i. y = x + r (stored when HAS_R), h = w * (y * rsqrt(mean(y^2) + eps)).
    Rounding as layer_ops.rms_norm: the mean in float32, the normed row cast to the tensors' dtype,
    then the weight product and the add at float32 (float64 when WIDE) and cast once, as torch
    computes a bf16 x bf16 product."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    m = i < n
    ct = tl.float64 if WIDE else tl.float32
    y = tl.load(X + row * stride_x + i, mask=m, other=0.0)
    if HAS_R:
        y = (y.to(ct) + tl.load(R + row * stride_r + i, mask=m, other=0.0).to(ct)).to(Y.dtype.element_ty)
        tl.store(Y + row * stride_y + i, y, mask=m)
    yf = y.to(tl.float32)
    normed = (yf * tl.rsqrt(tl.sum(yf * yf, axis=0) / n + eps)).to(H.dtype.element_ty)
    w = tl.load(W + i, mask=m, other=0.0)
    tl.store(H + row * stride_h + i, (w.to(ct) * normed.to(ct)).to(H.dtype.element_ty), mask=m)


def _launch(x: Tensor, r: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    n = x.shape[-1]
    if x.stride(-1) != 1 or (r is not None and (r.stride(-1) != 1 or r.shape != x.shape)) or \
            weight.shape != (n,) or not weight.is_contiguous():
        raise ValueError("add_rms_norm_triton needs x, r [.., n] of one shape with unit last strides and weight [n]")
    x2 = x.reshape(-1, n)
    r2 = x2 if r is None else r.reshape(-1, n)
    rows = x2.shape[0]
    y = x2 if r is None else torch.empty_like(x2)
    h = torch.empty_like(x2)
    if rows:
        block = triton.next_power_of_2(n)
        _add_rms_norm_kernel[(rows,)](
            x2, r2, weight, y, h, x2.stride(0), r2.stride(0), y.stride(0), h.stride(0), n, eps,
            HAS_R=r is not None, WIDE=x.dtype == torch.float64, BLOCK=block,
            num_warps=max(1, min(8, block // 512)))
    return y.view(x.shape), h.view(x.shape)


def add_rms_norm_triton(x: Tensor, r: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """`layer_ops.add_rms_norm` in one launch: x, r [.., n] -> (x + r, rms_norm(x + r)). No host sync;
    allocates only its two outputs (CUDA-graph capturable)."""
    return _launch(x, r, weight, eps)


def rms_norm_triton(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`layer_ops.rms_norm` in one launch: x [.., n] -> the normed rows."""
    return _launch(x, None, weight, eps)[1]
