"""`layer_ops.silu_mul` (SwiGLU's silu(gate) * up) as a Triton kernel, for `Kernels(compiled=True)`
on CUDA. Inductor's kernel for it (`triton_poi_fused_mul_silu_split_0`, shapes dynamic) moved
1.2-1.45 TB/s on the H100 at 192-576 rows of the 8B's [gate | up] (2 x 14336 wide): 0.39 ms of
a 64:0:128 mixed step and 1.10 ms of a 64:0:512 one (`mixed_step`, H100 at 1bfbb10). Here
program (r, j) reads BLOCK contiguous columns of row r's gate and the same of its up, and writes
BLOCK outputs: wide, aligned loads; 2.45 TB/s at 576 rows (20.2 us against inductor's 40.8, the
same H100; 0.17 and 0.45 ms of those steps at 7dfc4b1: docs/design.md, "Layer glue").
`layer_ops.silu_mul` stays the CPU path and the oracle (tests/test_swiglu_kernel.py runs this
kernel under Triton's interpreter, tests/test_gpu.py on the GPU). Imported only where Triton runs.

Worked example, the 8B at a 64:0:512 step: x [576, 28672] -> y [576, 14336]; BLOCK 1024 gives a
grid of (576, 14) programs, each reading 2 x 2 KiB and writing 2 KiB."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 1024                 # columns a program (8 bf16 a thread at 4 warps: 16-byte accesses)


@triton.jit
def _silu_mul_kernel(X, Y, n, stride_x, stride_y, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    """Program (r, j): y[r, c] = silu(x[r, c]) * x[r, n + c] for c in block j. Rounding as eager
    torch: silu at float32 (float64 when WIDE) cast to the tensors' dtype, then the product at
    float32 (float64) cast once, as F.silu(gate) * up computes it."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < n
    ct = tl.float64 if WIDE else tl.float32
    g = tl.load(X + row * stride_x + c, mask=m, other=0.0).to(ct)
    u = tl.load(X + row * stride_x + n + c, mask=m, other=0.0).to(ct)
    s = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty)
    tl.store(Y + row * stride_y + c, (s.to(ct) * u).to(Y.dtype.element_ty), mask=m)


def silu_mul_triton(gate_up: Tensor) -> Tensor:
    """`layer_ops.silu_mul` in one launch: [.., 2i] = [gate; up] -> silu(gate) * up [.., i]. No host
    sync; allocates only its output where the rows are one strided view (F.linear's output; a
    3-D input that is not is copied by reshape first), so CUDA graphs capture it."""
    w = gate_up.shape[-1]
    if w % 2 or gate_up.stride(-1) != 1:
        raise ValueError(f"silu_mul_triton needs [.., 2i] with a unit last stride (got shape {tuple(gate_up.shape)}, "
                         f"strides {gate_up.stride()})")
    n = w // 2
    if not gate_up.numel():
        return gate_up.new_empty(*gate_up.shape[:-1], n)
    x2 = gate_up.reshape(-1, w)
    rows = x2.shape[0]
    y = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(n, BLOCK))](
            x2, y, n, x2.stride(0), y.stride(0), WIDE=gate_up.dtype == torch.float64, BLOCK=BLOCK, num_warps=4)
    return y.view(*gate_up.shape[:-1], n)
