"""The elementwise / per-layer glue of the reference decoder: RMSNorm, RoPE (tables, rotation,
the rotated K/V write into the paged pool), the residual add joined to the next norm, SwiGLU's
silu(gate) * up and the greedy head's argmax, bundled per model in `Kernels` (eager, or
torch.compile'd with Triton kernels swapped in on CUDA). Shared with the EAGLE-3 draft in draft.py.

Eager, each function is the CPU path and the oracle the compiled and Triton forms are tested
against (norm_kernel.py, rope_kernel.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm computed in float32, as transformers' LlamaRMSNorm does."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> Tensor:
    """Inverse frequencies [head_dim // 2] in float32, with linear / llama3 scaling."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv / factor
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between
    # the two wavelength bounds is interpolated smoothly.
    old = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(head_dim: int, theta: float, scaling: dict | None, max_seq_len: int,
                device, dtype) -> tuple[Tensor, Tensor]:
    """cos, sin tables [max_seq_len, head_dim // 2], computed in float32, stored in `dtype`."""
    inv = rope_inv_freq(head_dim, theta, scaling).to(device)
    freqs = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE (HF/NeoX layout). x [..., hd]; cos, sin broadcast to [..., hd/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_write(qkv: Tensor, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor, write_index: Tensor,
               n_heads: int, n_kv_heads: int) -> Tensor:
    """qkv [N, (nh + 2 kvh) * hd] -> q [N, nh, hd] with RoPE; k (with RoPE) and v are written into
    the pools [kvh, P, hd] at write_index [N]. Compiled, it stores straight into the pool
    (inductor re-inplaces the index_put on the mutated input: no pool copy) in 3 kernels on the
    H200, where eager runs two RoPE kernels, two index copies and their transposes."""
    N, hd = qkv.shape[0], k_pool.shape[-1]
    q, k, v = qkv.view(N, n_heads + 2 * n_kv_heads, hd).split((n_heads, n_kv_heads, n_kv_heads), dim=1)
    k_pool[:, write_index] = apply_rope(k, cos, sin).transpose(0, 1)
    v_pool[:, write_index] = v.transpose(0, 1)
    return apply_rope(q, cos, sin)


def add_rms_norm(x: Tensor, r: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(x + r, rms_norm(x + r)): the residual add and the next norm in one pass."""
    y = x + r
    return y, rms_norm(y, weight, eps)


ARGMAX_CHUNKS = 128


def first_max(x: Tensor, chunks: int = ARGMAX_CHUNKS) -> tuple[Tensor, Tensor]:
    """(values, indices) of x [..., V] over its last axis, the index of the first maximum: what
    torch.max(x, -1) returns, in a form that fills the GPU when rows are few. torch reduces one
    row on one thread block (1 x 128256 bf16 logits: about a sixth of the lm_head GEMM before it
    on the H200), so with fewer rows than `chunks`
    each row is cut into `chunks` pieces of w = V // chunks, reduced side by side, then the
    pieces' maxima. Worked example, V = 10, chunks = 3, w = 3: pieces [0:3] [3:6] [6:9], tail [9];
    the first piece holding the overall max wins (ties go to the lower index, as in torch), and
    the tail only when strictly greater, its indices being the highest."""
    V = x.shape[-1]
    rows = x.numel() // V if V else 0
    w = V // chunks
    if rows >= chunks or w < 2:
        return x.max(dim=-1)
    lead = x.shape[:-1]
    x2 = x.reshape(rows, V)
    vals, idx = x2[:, :chunks * w].view(rows, chunks, w).max(dim=-1)        # [rows, chunks]
    best, c = vals.max(dim=-1)                                              # [rows]: first piece holding it
    index = c * w + idx.gather(-1, c[:, None]).squeeze(-1)
    if chunks * w < V:
        tv, ti = x2[:, chunks * w:].max(dim=-1)
        later = tv > best
        best, index = torch.where(later, tv, best), torch.where(later, ti + chunks * w, index)
    return best.view(lead), index.view(lead)


def silu_mul(gate_up: Tensor) -> Tensor:
    """[.., 2i] = [gate; up] -> silu(gate) * up [.., i]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Kernels:
    """The elementwise glue of a decoder layer, held per model (never process-wide).
    `Kernels()` is eager; `Kernels(compiled=True)` fuses each piece into one kernel with
    torch.compile: add_rms_norm (the previous layer's residual add joined to this norm),
    rope_write, add_rms_norm, silu_mul around a layer's 4 GEMMs and attention. At batch 1 the
    glue's launches and gaps, not its bytes, are what cost. On CUDA, compiled also swaps in
    hand-written Triton kernels where inductor's cost more: rope_kernel.rope_write_triton (one
    launch where inductor emits three), norm_kernel's single-pass rms_norm / add_rms_norm
    (inductor's loops over a 4096-wide row twice) and swiglu_kernel's silu_mul (inductor's moved
    about half the bandwidth)."""

    def __init__(self, compiled: bool = False):
        self.compiled = compiled
        c = (lambda fn: torch.compile(fn, dynamic=True, fullgraph=True)) if compiled else (lambda fn: fn)
        self.rms_norm, self.rope_write = c(rms_norm), c(rope_write)
        self.add_rms_norm, self.silu_mul = c(add_rms_norm), c(silu_mul)
        self.fused_glue = compiled and torch.cuda.is_available()      # the hand-written Triton glue
        if self.fused_glue:
            from dynspec.runtime.engines.reference.norm_kernel import add_rms_norm_triton, rms_norm_triton
            from dynspec.runtime.engines.reference.rope_kernel import rope_write_triton
            from dynspec.runtime.engines.reference.swiglu_kernel import silu_mul_triton
            self.rope_write, self.rms_norm, self.add_rms_norm = rope_write_triton, rms_norm_triton, add_rms_norm_triton
            self.silu_mul = silu_mul_triton
