"""The all-reduce of a row-parallel output (o_proj, down_proj), the residual add and the next
RMSNorm in one Triton launch, over the one-shot all-reduce's symmetric buffer
(runtime/tp/allreduce.py). Where the unfused TP step runs the one-shot kernel and then
norm_kernel's add_rms_norm (two launches, the sum written and read back once in between), this
kernel, for this rank, per program p of G, rows p, p + G, ...:

    1. copies its partial sum's rows into its own slot of the buffer        (COPY)
    2. meets every rank at a barrier of signal flags                      (SYNC, cell p, phase 0)
    3. reads the N slots' rows and sums them in rank order, rounding to the dtype after each add
       (s = x_0; s = s + x_1; ...: what torch's one-shot kernel and a sequential sum compute), then
       y = s + residual (stored), h = weight * rmsnorm(y) (stored), rounded as norm_kernel does
    4. meets every rank again                                               (SYNC, cell p, phase 1)
       so that no rank writes its slot for the next all-reduce while a peer still reads it.

Addresses. The buffer of rank r is mapped into this process at an address of its own; the kernel
gets this rank's slot SLOT and PEERS [N] int64, the element offset of rank r's slot from SLOT
(0 for this rank). The signal pads likewise: SIG (this rank's flags, already moved to
SIGNAL_BASE) and SIG_PEERS [N]. The tests (tests/helpers_allreduce_norm.py) run it in Triton's
interpreter with N plain CPU tensors as the slots, their offsets from the first.

Barrier, per program p and phase f, cell c = f * G + p: for each peer q, compare-and-swap 0 -> 1
(release, system scope) on flag [c * N + rank] of q's pad, spinning while it is still 1 (q has
not taken the previous signal yet); then for each peer q, compare-and-swap 1 -> 0 (acquire,
system scope) on flag [c * N + q] of its own pad, spinning until q's signal arrives. A CTA
barrier before it orders the program's slot writes ahead of the release, one after it the
acquire ahead of the peers' reads. This is the protocol of torch's one-shot kernel
(sync_remote_blocks) on flags of its own region (torch's kernel uses flags below
24 * N <= SIGNAL_BASE), so the two kernels can alternate on one buffer. Every rank launches the
same kernels with the same grids in the same order (same shapes on every rank), so each flag's
puts and takes pair up.

What a GPU must prove (tests/test_gpu_tp.py on two H200s; nothing here has run on CUDA): that the
flags' release/acquire at system scope make the peers' slot writes visible over NVLink (the
interpreter runs one rank, its peers' flags preset); that no program spins forever (every rank
launches the same grid); and that replaying the kernel from a CUDA graph gives the unfused
path's bits. The CPU tests prove the arithmetic and the flag protocol's indexing, and
tests/test_triton_compile.py lowers the kernel to Triton IR for sm_90.

Imported only where Triton runs."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

SIGNAL_BASE = 256          # first int32 flag of this kernel's region in a rank's signal pad
MAX_PROGRAMS = 64          # G <= this: 2 phases * 64 * 8 ranks + 256 flags = 4.1 KiB of torch's 9 KiB pad


def signal_flags(ranks: int) -> int:
    """int32 flags of a signal pad the kernel may touch: SIGNAL_BASE + 2 * MAX_PROGRAMS * ranks."""
    return SIGNAL_BASE + 2 * MAX_PROGRAMS * ranks


@triton.jit
def _barrier(SIG, SIG_PEERS, cell, RANK: tl.constexpr, RANKS: tl.constexpr):
    """Every rank's program of this index reaches `cell` (see the module docstring)."""
    tl.debug_barrier()
    for q in tl.static_range(RANKS):
        remote = SIG + tl.load(SIG_PEERS + q) + cell * RANKS + RANK
        while tl.atomic_cas(remote, 0, 1, sem="release", scope="sys") != 0:
            pass
    for q in tl.static_range(RANKS):
        mine = SIG + cell * RANKS + q
        while tl.atomic_cas(mine, 1, 0, sem="acquire", scope="sys") != 1:
            pass
    tl.debug_barrier()


@triton.jit
def _allreduce_add_rms_norm_kernel(X, SLOT, PEERS, SIG, SIG_PEERS, R, W, Y, H,
                                   stride_x, stride_r, stride_y, stride_h, rows, n, eps,
                                   RANK: tl.constexpr, RANKS: tl.constexpr, COPY: tl.constexpr,
                                   SYNC: tl.constexpr, BLOCK: tl.constexpr):
    """Program p of G: rows p, p + G, ... of X [rows, n] (this rank's partial sum), the slots
    [rows, n] (row stride n), R (residual), Y (R + sum), H (its norm)."""
    p = tl.program_id(0)
    G = tl.num_programs(0)
    i = tl.arange(0, BLOCK)
    m = i < n
    if COPY:
        for row in range(p, rows, G):          # offsets stay below 2**31: a slot holds at most 1 MiB
            tl.store(SLOT + row * n + i, tl.load(X + row * stride_x + i, mask=m), mask=m)
    if SYNC:
        _barrier(SIG, SIG_PEERS, p, RANK, RANKS)
    for row in range(p, rows, G):
        s = tl.load(SLOT + tl.multiple_of(tl.load(PEERS), 8) + row * n + i, mask=m, other=0.0)
        for q in tl.static_range(1, RANKS):
            peer = tl.multiple_of(tl.load(PEERS + q), 8)      # slots 16-byte aligned: 16-byte loads
            s = (s.to(tl.float32) + tl.load(SLOT + peer + row * n + i, mask=m, other=0.0).to(tl.float32)
                 ).to(Y.dtype.element_ty)
        res = tl.load(R + row * stride_r + i, mask=m, other=0.0)
        y = (s.to(tl.float32) + res.to(tl.float32)).to(Y.dtype.element_ty)
        tl.store(Y + row * stride_y + i, y, mask=m)
        yf = y.to(tl.float32)
        normed = (yf * tl.rsqrt(tl.sum(yf * yf, axis=0) / n + eps)).to(H.dtype.element_ty)
        w = tl.load(W + i, mask=m, other=0.0)
        tl.store(H + row * stride_h + i, (w.to(tl.float32) * normed.to(tl.float32)).to(H.dtype.element_ty),
                 mask=m)
    if SYNC:
        _barrier(SIG, SIG_PEERS, G + p, RANK, RANKS)


DTYPES = (torch.bfloat16, torch.float32)        # the one-shot path's; sums and norm in float32


def check_args(part: Tensor, r: Tensor, weight: Tensor) -> str:
    """'' when the kernel takes part, r [.., n] and weight [n]; else why not (the caller then
    takes the unfused path). part must be contiguous (it is copied into the slot row by row)."""
    n = part.shape[-1]
    if part.dtype not in DTYPES or r.dtype != part.dtype or weight.dtype != part.dtype:
        return f"dtype {part.dtype}/{r.dtype}/{weight.dtype}"
    if r.shape != part.shape or weight.shape != (n,) or not part.is_contiguous() or r.stride(-1) != 1 \
            or not weight.is_contiguous():
        return "shapes or strides"
    return ""


def allreduce_add_rms_norm(part: Tensor, r: Tensor, weight: Tensor, eps: float, slot: Tensor, peers: Tensor,
                           sig: Tensor, sig_peers: Tensor, rank: int, ranks: int, *, copy: bool = True,
                           sync: bool = True) -> tuple[Tensor, Tensor]:
    """(r + sum over ranks of part, rms_norm of it) [.., n], one launch. slot: this rank's slot,
    at least part.numel() elements of part's dtype; peers [ranks] int64 element offsets of each
    rank's slot from slot; sig: this rank's int32 flags from SIGNAL_BASE on, sig_peers [ranks]
    their offsets. copy=False: the slots already hold the partial sums; sync=False: no barrier
    (one process standing in for every rank, as the interpreter tests do). No host sync,
    allocates only its two outputs: CUDA-graph capturable."""
    why = check_args(part, r, weight)
    if why:
        raise ValueError(f"allreduce_add_rms_norm: {why}")
    n = part.shape[-1]
    x2, r2 = part.reshape(-1, n), r.reshape(-1, n)
    rows = x2.shape[0]
    y, h = torch.empty_like(x2), torch.empty_like(x2)
    if rows:
        block = triton.next_power_of_2(n)
        _allreduce_add_rms_norm_kernel[(min(rows, MAX_PROGRAMS),)](
            x2, slot, peers, sig, sig_peers, r2, weight, y, h, x2.stride(0), r2.stride(0), y.stride(0),
            h.stride(0), rows, n, eps, RANK=rank, RANKS=ranks, COPY=copy, SYNC=sync, BLOCK=block,
            num_warps=max(1, min(8, block // 512)))
    return y.view(part.shape), h.view(part.shape)
