"""How one replica sums a tensor over its TP ranks (the model's two all-reduces per layer, the
embedding's one). docs/tensor_parallel.md, "All-reduce", has the measurements behind the choice.

    nccl      torch.distributed.all_reduce on the replica's compute group (NCCL on CUDA, gloo on CPU)
    one-shot  CUDA, N ranks of one host over NVLink: torch's symmetric-memory one-shot kernel. Each
              rank copies its partial sum into its own slot of a buffer every rank can address
              (`torch.distributed._symmetric_memory`), the ranks meet at a barrier of signal
              flags, and each rank reads all N slots and adds them, in rank order. One kernel, no
              NCCL proxy, graph-capturable. bf16 and fp32 messages up to `max_bytes` (a decode row
              of 4096 bf16 is 8 KiB); larger ones (prompt chunks) and other dtypes (the kernel has
              none for fp16) go to NCCL. The same shapes and dtypes reach every rank, so every rank
              takes the same route. The buffer is set up with TORCH_SYMM_MEM_DISABLE_MULTICAST=1
              unless the environment says otherwise: the kernel needs no NVLink multicast, and on
              shared machines multicast objects must not be created.
              With the buffer, `add_rms_norm` fuses the sum into the residual add and RMSNorm that
              follow it (runtime/engines/reference/fused_allreduce_norm.py: copy-in, barrier, sum,
              add, norm, barrier in one launch, on flags of the signal pad that torch's kernel
              leaves alone). It is off until a run on two GPUs proves it (its barrier, its graph capture):
              `use("one-shot", fuse_norm=True)` turns it on, as tp_decode's one-shot-fused mode does.
    auto      one-shot where it can be set up (CUDA, tp > 1), else nccl
    skip      no communication at all: every rank keeps its partial sum. The outputs are wrong;
              it exists to time a step without its collectives (benchmarks/tp_decode.py's
              communication share) and is refused by the CLIs.

Sums in rank order are the same bits on every rank; at N=2, a + b in either order is one IEEE
result, so one-shot and NCCL give identical bf16 outputs (tests/test_gpu_tp.py checks it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dynspec.errors import DynspecError

MODES = ("auto", "nccl", "one-shot", "skip")
ONE_SHOT_MAX_BYTES = 1 << 20       # 1 MiB: 128 rows of 4096 bf16; beyond it NCCL's ring wins on bandwidth
ONE_SHOT_DTYPES = (torch.bfloat16, torch.float32)      # what torch's one-shot kernel dispatches on


class Reducer:
    """Sums x over the group's ranks and returns the sum (x itself for nccl and skip, a new tensor
    for one-shot). mode is one of MODES after setup: 'nccl', 'one-shot' or 'skip'."""

    def __init__(self, mode: str, group: Any, device: torch.device, max_bytes: int = ONE_SHOT_MAX_BYTES):
        if mode not in MODES:
            raise DynspecError(f"--allreduce {mode!r} is not one of {', '.join(MODES)}")
        self.group, self.buffer, self.group_name = group, None, None
        self.fallback = ""            # why 'auto' chose nccl
        self.peers: FusedPeers | None = None       # the fused norm's addresses (one-shot on CUDA with Triton)
        self.fuse_norm = False     # the fused kernel is unproven on GPUs: tp_decode's one-shot-fused times it
        if mode in ("auto", "one-shot"):
            try:
                self.buffer, self.group_name, handle = _symmetric_buffer(group, device, max_bytes)
                self.peers = _fused_peers(handle, self.buffer)
                mode = "one-shot"
            except (RuntimeError, ImportError, AttributeError, DynspecError) as e:
                if mode == "one-shot":
                    raise DynspecError(f"--allreduce one-shot cannot be set up on {device}: {e}") from e
                mode, self.fallback = "nccl", f"{type(e).__name__}: {e}".splitlines()[0]
        self.mode = mode

    def use(self, mode: str, fuse_norm: bool = False) -> None:
        """Switch between the modes this reducer was set up for (tp_decode times each in one run):
        'one-shot' only where its buffer exists; fuse_norm=True: add_rms_norm in the fused kernel."""
        if mode not in ("nccl", "skip") and not (mode == "one-shot" and self.buffer is not None):
            raise DynspecError(f"all-reduce mode {mode!r} is not available here (set up as {self.mode!r})")
        self.mode, self.fuse_norm = mode, fuse_norm

    def fuses_norm(self, part: torch.Tensor, r: torch.Tensor, weight: torch.Tensor) -> bool:
        """add_rms_norm takes the fused kernel: one-shot with its peers' addresses, part fits the
        buffer, and the kernel takes the shapes (fused_allreduce_norm.check_args). Decided from
        shapes, dtypes and strides only, the same on every rank."""
        if self.mode != "one-shot" or not self.fuse_norm or self.peers is None or not self.one_shot_fits(part):
            return False
        from dynspec.runtime.engines.reference.fused_allreduce_norm import check_args

        return not check_args(part, r, weight)

    def add_rms_norm(self, part: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float,
                     norm) -> tuple[torch.Tensor, torch.Tensor]:
        """(r + the sum of part over the ranks, its RMSNorm): the fused kernel where fuses_norm,
        else this reducer's sum, then `norm` (layer_ops.add_rms_norm's signature: Kernels.add_rms_norm,
        the Triton one on CUDA). skip: r + part."""
        if not self.fuses_norm(part, r, weight):
            return norm(r, self(part), weight, eps)
        from dynspec.runtime.engines.reference.fused_allreduce_norm import SIGNAL_BASE, allreduce_add_rms_norm

        p = self.peers
        slot = self.buffer.view(part.dtype)
        return allreduce_add_rms_norm(part, r, weight, eps, slot, p.offsets[part.dtype], p.signal[SIGNAL_BASE:],
                                      p.signal_offsets, p.rank, p.ranks)

    def one_shot_fits(self, x: torch.Tensor) -> bool:
        """x goes through the one-shot kernel: bf16/fp32, within the buffer, 16-byte aligned (the
        kernel wants the input's alignment to match the slot's, which starts at offset 0)."""
        return (self.buffer is not None and x.dtype in ONE_SHOT_DTYPES
                and x.numel() * x.element_size() <= self.buffer.numel()
                and x.storage_offset() * x.element_size() % 16 == 0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "skip":
            return x
        if self.mode == "one-shot" and self.one_shot_fits(x):
            # [numel] bytes of this rank's slot, viewed as x: the kernel copies x in, then reads every rank's
            slot = self.buffer[: x.numel() * x.element_size()].view(x.dtype).view(x.shape)
            return torch.ops.symm_mem.one_shot_all_reduce_copy(slot, x.contiguous(), "sum", self.group_name)
        torch.distributed.all_reduce(x, group=self.group)
        return x


@dataclass(frozen=True)
class FusedPeers:
    """Where the fused norm kernel finds every rank's slot and signal flags, as offsets from this
    rank's own (peer buffers are mapped at addresses of their own): offsets {dtype: [N] int64
    elements}, signal the int32 view of this rank's signal pad, signal_offsets [N] int64."""
    rank: int
    ranks: int
    offsets: dict
    signal: torch.Tensor
    signal_offsets: torch.Tensor


def peer_offsets(base: int, ptrs: list[int], size: int) -> list[int]:
    """Element offsets of ptrs from base at `size` bytes an element; every one 16-byte aligned
    (the kernel's loads are 16 bytes wide). (1000, [1000, 1064], 2) -> [0, 32]."""
    d = [p - base for p in ptrs]
    if any(b % 16 for b in d):
        raise DynspecError(f"symmetric buffers are not 16-byte aligned to each other: offsets {d}")
    return [b // size for b in d]


def _fused_peers(handle: Any, buffer: torch.Tensor) -> FusedPeers | None:
    """FusedPeers of a rendezvoused buffer, or None where the fused kernel cannot run (no
    Triton, a signal pad too small for its flags)."""
    try:
        from dynspec.runtime.engines.reference.fused_allreduce_norm import signal_flags
    except ImportError:
        return None
    n, dev = handle.world_size, buffer.device
    pad = handle.get_signal_pad(handle.rank, (handle.signal_pad_size // 4,), torch.int32)
    if pad.numel() < signal_flags(n):
        return None
    bufs = [handle.get_buffer(r, (buffer.numel(),), torch.uint8).data_ptr() for r in range(n)]
    pads = [handle.get_signal_pad(r, (pad.numel(),), torch.int32).data_ptr() for r in range(n)]
    as_tensor = lambda v: torch.tensor(v, dtype=torch.int64, device=dev)     # noqa: E731
    offsets = {dt: as_tensor(peer_offsets(buffer.data_ptr(), bufs, dt.itemsize)) for dt in ONE_SHOT_DTYPES}
    return FusedPeers(handle.rank, n, offsets, pad, as_tensor(peer_offsets(pad.data_ptr(), pads, 4)))


def _symmetric_buffer(group: Any, device: torch.device, max_bytes: int) -> tuple[torch.Tensor, str, Any]:
    """max_bytes of symmetric memory on `device`, rendezvoused over `group`: (uint8 buffer, group
    name, torch's handle of it)."""
    if device.type != "cuda":
        raise DynspecError(f"the one-shot all-reduce needs CUDA devices, not {device.type}")
    import os

    import torch.distributed._symmetric_memory as symm_mem

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)     # needed before torch 2.8, a no-op after
    if enable is not None:
        enable(group.group_name)
    buf = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
    handle = symm_mem.rendezvous(buf, group.group_name)
    return buf, group.group_name, handle
