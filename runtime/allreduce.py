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
    auto      one-shot where it can be set up (CUDA, tp > 1), else nccl
    skip      no communication at all: every rank keeps its partial sum. The outputs are wrong;
              it exists to time a step without its collectives (benchmarks/tp_decode.py's
              communication share) and is refused by the CLIs.

Sums in rank order are the same bits on every rank; at N=2, a + b in either order is one IEEE
result, so one-shot and NCCL give identical bf16 outputs (tests/test_gpu_tp.py checks it).
"""
from __future__ import annotations

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
        if mode in ("auto", "one-shot"):
            try:
                self.buffer, self.group_name = _symmetric_buffer(group, device, max_bytes)
                mode = "one-shot"
            except (RuntimeError, ImportError, AttributeError, DynspecError) as e:
                if mode == "one-shot":
                    raise DynspecError(f"--allreduce one-shot cannot be set up on {device}: {e}") from e
                mode, self.fallback = "nccl", f"{type(e).__name__}: {e}".splitlines()[0]
        self.mode = mode

    def use(self, mode: str) -> None:
        """Switch between the modes this reducer was set up for (tp_decode times each in one run):
        'one-shot' only where its buffer exists."""
        if mode not in ("nccl", "skip") and not (mode == "one-shot" and self.buffer is not None):
            raise DynspecError(f"all-reduce mode {mode!r} is not available here (set up as {self.mode!r})")
        self.mode = mode

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


def _symmetric_buffer(group: Any, device: torch.device, max_bytes: int) -> tuple[torch.Tensor, str]:
    """max_bytes of symmetric memory on `device`, rendezvoused over `group`: (uint8 buffer, group name)."""
    if device.type != "cuda":
        raise DynspecError(f"the one-shot all-reduce needs CUDA devices, not {device.type}")
    import os

    import torch.distributed._symmetric_memory as symm_mem

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)     # needed before torch 2.8, a no-op after
    if enable is not None:
        enable(group.group_name)
    buf = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
    symm_mem.rendezvous(buf, group.group_name)
    return buf, group.group_name
