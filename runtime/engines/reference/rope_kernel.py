"""`layer_ops.rope_write` as one hand-written Triton kernel, for `Kernels(compiled=True)` on CUDA,
where inductor emits it as three. `layer_ops.rope_write` stays the CPU path and the oracle
(tests/test_rope_kernel.py, tests/test_gpu.py). Imported only where Triton runs: layer_ops.py
imports this module inside `Kernels`, so CPU installs without Triton never load it."""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _rope_write_kernel(qkv, cos, sin, q, k_pool, v_pool, write_index,
                       qkv_row, cs_row, k_head, k_pos, v_head, v_pos,
                       N_HEADS: tl.constexpr, N_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Program (n, h): token n's q head h (h < nh) -> q, or its kv head j = h - nh -> k with RoPE
    and v at pool position write_index[n]. fp32 math, stored in the tensors' dtype."""
    HALF: tl.constexpr = HEAD_DIM // 2
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    i = tl.arange(0, BLOCK)
    m = i < HALF
    c = tl.load(cos + n * cs_row + i, mask=m).to(tl.float32)                 # [hd/2]
    s = tl.load(sin + n * cs_row + i, mask=m).to(tl.float32)
    src = qkv + n * qkv_row + h * HEAD_DIM + i                              # q head h, or k head j
    x1 = tl.load(src, mask=m).to(tl.float32)
    x2 = tl.load(src + HALF, mask=m).to(tl.float32)
    if h < N_HEADS:
        dst = q + (n * N_HEADS + h) * HEAD_DIM + i
    else:
        j = (h - N_HEADS).to(tl.int64)
        pos = tl.load(write_index + n)
        dst = k_pool + j * k_head + pos * k_pos + i
        vsrc, vdst = src + N_KV_HEADS * HEAD_DIM, v_pool + j * v_head + pos * v_pos + i
        tl.store(vdst, tl.load(vsrc, mask=m), mask=m)
        tl.store(vdst + HALF, tl.load(vsrc + HALF, mask=m), mask=m)
    tl.store(dst, (x1 * c - x2 * s).to(dst.dtype.element_ty), mask=m)
    tl.store(dst + HALF, (x2 * c + x1 * s).to(dst.dtype.element_ty), mask=m)


def rope_write_triton(qkv: Tensor, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor, write_index: Tensor,
                      n_heads: int, n_kv_heads: int) -> Tensor:
    """`layer_ops.rope_write` in one launch: qkv [N, (nh + 2 kvh) * hd]; cos, sin [N, 1, hd/2]; pools
    [kvh, P, hd] (any head and position strides: a layer of [L, kvh, P, hd]); write_index [N]
    -> q [N, nh, hd] with RoPE. No host sync; allocates only q (CUDA-graph capturable)."""
    N, hd = qkv.shape[0], k_pool.shape[-1]
    if qkv.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride() != cos.stride() or \
            k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError("rope_write_triton needs unit last strides and cos, sin of one layout")
    q = qkv.new_empty(N, n_heads, hd)                                        # [N, nh, hd]
    if N:
        _rope_write_kernel[(N, n_heads + n_kv_heads)](
            qkv, cos, sin, q, k_pool, v_pool, write_index,
            qkv.stride(0), cos.stride(0), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
            N_HEADS=n_heads, N_KV_HEADS=n_kv_heads, HEAD_DIM=hd, BLOCK=triton.next_power_of_2(hd // 2),
            num_warps=1)
    return q
