"""The paged KV cache's bookkeeping: fixed-size blocks, a block table per sequence slot, a
free list. Host-side and pure Python; the engine mirrors the tables into a device tensor at
its next launch (slot_state.SlotState.flush).

Worked example, block_size 4, 6 blocks (block 0 is the scratch block padding rows write to):
    reserve(9)  -> slot 0, table [1, 2, 3]      (ceil(9/4) = 3 blocks)
    reserve(4)  -> slot 1, table [4]
    reserve(9)  -> None: 1 block left, 3 needed (admission waits; nothing is evicted)
    release(0)  -> blocks 1, 2, 3 are free again; no K/V is copied
Rollback is by length: a sequence's table covers every position it may write, and what lies
past its length is never read.
"""
from __future__ import annotations

from dynspec.errors import DynspecError

SCRATCH_BLOCK = 0


def kv_pool_bytes(target, draft, num_blocks: int, block_size: int, dtype_bytes: int) -> int:
    """Bytes of the K and V pools of target + draft (configs with num_kv_heads, head_dim; the
    target's num_layers, the draft's one layer), for num_blocks blocks of block_size tokens:
    blocks x block_size x layers x 2 x kv_heads x head_dim x dtype bytes.
    Tiny pair, fp32, 22 blocks of 16: 22*16 * (6*2*2*32 + 1*2*2*32) * 4 = 1,261,568."""
    per_token = (target.num_layers * target.num_kv_heads * target.head_dim
                 + draft.num_kv_heads * draft.head_dim) * 2
    return num_blocks * block_size * per_token * dtype_bytes


def available_bytes(device) -> int:
    """Memory a new allocation on `device` can take: free GPU memory (torch.cuda.mem_get_info),
    or on a CPU MemAvailable from /proc/meminfo (what can be had without swapping)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_pool_fits(need: int, available: int, *, device, max_batch_size: int, max_seq_len: int) -> None:
    """Refuse a KV pool larger than the memory there is, naming both, before allocating it."""
    if need > available:
        raise DynspecError(
            f"the KV cache for max_batch_size {max_batch_size} x max_seq_len {max_seq_len} needs {need:,} bytes"
            f" ({need / 2**30:.1f} GiB) but {device} has {available:,} bytes available; lower max_seq_len"
            f" (--max-seq-len, engine.json reference.max_seq_len) or the batch size")


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_seq: int, num_slots: int):
        if num_blocks < 2:
            raise DynspecError(f"a paged KV cache needs at least 2 blocks (one is scratch), got {num_blocks}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_blocks_per_seq, self.num_slots = max_blocks_per_seq, num_slots
        self._free_blocks = list(range(num_blocks - 1, SCRATCH_BLOCK, -1))   # pop() hands out low ids first
        self._free_slots = list(range(num_slots - 1, -1, -1))
        self.tables: dict[int, tuple[int, ...]] = {}

    @property
    def free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def max_tokens(self) -> int:
        """The largest reservation that can ever be granted: by the table width and the pool
        (less the scratch block). 9 blocks of 16, 4 per sequence -> 64; 3 blocks of 16 -> 32."""
        return min(self.max_blocks_per_seq, self.num_blocks - 1) * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def can_reserve(self, tokens: int) -> bool:
        return bool(self._free_slots) and self.blocks_for(tokens) <= len(self._free_blocks)

    def reserve(self, tokens: int) -> int | None:
        """A slot whose table covers positions 0..tokens-1, or None if blocks or slots are short."""
        need = self.blocks_for(tokens)
        if need > self.max_blocks_per_seq:
            raise DynspecError(f"{tokens} tokens need {need} blocks; a sequence holds at most "
                               f"{self.max_blocks_per_seq} ({self.max_blocks_per_seq * self.block_size} tokens)")
        if not self.can_reserve(tokens):
            return None
        slot = self._free_slots.pop()
        self.tables[slot] = tuple(self._free_blocks.pop() for _ in range(need))
        return slot

    def release(self, slot: int) -> tuple[int, ...]:
        """Free the slot and its blocks; returns the blocks freed."""
        blocks = self.tables.pop(slot)
        self._free_blocks.extend(reversed(blocks))
        self._free_slots.append(slot)
        return blocks
