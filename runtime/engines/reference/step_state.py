"""The state a step runs on, typed: the static step buffers (StepBuffers), the carried draft head
of every slot (CarriedHeads), the lazy draft sync's FeatureStore, and what a step's device
functions take (StepParts).

Every tensor here is allocated once and written in place only (`t[...] = ...`, copy_): the
captured CUDA graphs read these very tensors, so no field is ever rebound.

Step rows R = slots S = max_batch_size + 1 (the last: the padding slot). Example, max_batch_size
4, max_draft_len 3: step_in [7, 5], out_tokens [5, 4], out_n [5], next_draft [5].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dynspec.errors import DynspecError
from dynspec.runtime.engines.reference.slot_state import SlotState


@dataclass(frozen=True)
class StepBuffers:
    """A step's static inputs and outputs per row (also the CUDA graphs' I/O). The inputs are the
    rows of one [7, R] tensor, filled from a pinned host twin in one copy a step:
        x [R] pending tokens | pos [R] their positions | slot [R] their slots |
        from_dev [R] 1: take x, pos from the carried copy | last_slot, last_pos [R]: the last
        chunks' slots and prompt lengths (carry.py; the last three only for carried plans) |
        row_k [R] the most drafts each row may accept (plan.row_k; K for padding rows)
    The carried copy per slot (carry.py): slot_tok [S] next pending token, slot_pos [S] its position."""
    step_in: Tensor                  # [7, R]
    host_in: Tensor                  # [7, R] its host twin (pinned on CUDA)
    x: Tensor
    pos: Tensor
    slot: Tensor
    from_dev: Tensor
    last_slot: Tensor
    last_pos: Tensor
    row_k: Tensor
    slot_tok: Tensor                 # [S]
    slot_pos: Tensor                 # [S]
    out_tokens: Tensor               # [R, K+1]
    out_n: Tensor                    # [R]
    pad_slot: int
    max_draft_len: int

    @classmethod
    def allocate(cls, n: int, max_draft_len: int, device: torch.device) -> "StepBuffers":
        """Buffers of n rows (the last row's slot n - 1 is the padding slot), every row padding."""
        step_in = torch.zeros(7, n, dtype=torch.long, device=device)
        host_in = torch.zeros(7, n, dtype=torch.long, pin_memory=device.type == "cuda")
        long = dict(dtype=torch.long, device=device)
        b = cls(step_in, host_in, *step_in, torch.zeros(n, **long), torch.zeros(n, **long),
                torch.zeros(n, max_draft_len + 1, **long), torch.zeros(n, **long), n - 1, max_draft_len)
        b.pad_rows()
        return b

    def pad_rows(self) -> None:
        """Every step row a padding row (token 0 at position 1 of the padding slot): what graph
        warm-ups and captures run on, writing only into the scratch block."""
        self.x.zero_()
        self.pos.fill_(1)
        self.slot.fill_(self.pad_slot)
        self.row_k.fill_(self.max_draft_len)


@dataclass(frozen=True)
class CarriedHeads:
    """The carried draft head of each slot (draft_chain.py):
        next_draft [S]            the draft's guess for x_{L+1} (from entry L)
        draft_hidden [S, h_draft] that entry's output hidden (fed to the next chain step)
        last_capture [S, n_capture*h_target]  h_{L-1} (to rebuild entry L when the draft went stale)"""
    next_draft: Tensor
    draft_hidden: Tensor
    last_capture: Tensor

    @classmethod
    def allocate(cls, n: int, draft_width: int, capture_width: int, dtype, device) -> "CarriedHeads":
        return cls(torch.zeros(n, dtype=torch.long, device=device),
                   torch.zeros(n, draft_width, dtype=dtype, device=device),
                   torch.zeros(n, capture_width, dtype=dtype, device=device))

    def set_heads(self, slot: Tensor, draft: Tensor | None = None, hidden: Tensor | None = None,
                  capture: Tensor | None = None) -> None:
        """Rows `slot` [n] of the heads, in place: draft [n] -> next_draft, hidden [n, h_draft] ->
        draft_hidden, capture [n, w] -> last_capture; a field given None keeps its rows.
        Example: a refresh sets draft and hidden; a plain decode step sets capture alone."""
        if draft is not None:
            self.next_draft[slot] = draft
        if hidden is not None:
            self.draft_hidden[slot] = hidden
        if capture is not None:
            self.last_capture[slot] = capture


@dataclass(frozen=True)
class FeatureStore:
    """Lazy draft sync (docs/design.md, "Draft sync"): each slot's newest `cap` target captures
    h_p, by position p, in a ring ring[slot, p % cap] [S, cap, w] (w = n_capture * h_target), for
    the catch-up that writes the draft's K/V of the lazy K=0 steps when the row drafts again.
    Written with index tensors (a scatter: CUDA-graph capturable) by every decode row of every
    step. A token costs w x dtype size bytes a slot: e.g. 3 x 4096 x 2 = 24 KiB (bf16, an 8B
    target), cap 256 -> 6 MiB a slot. The draft's fc output (h_draft wide, here 8 KiB) would be a
    third of that but costs the fc GEMM at every K=0 step; the store keeps the features (a copy).
    cap 0 (no lazy sync): a ring of one entry that every write lands in and nothing reads."""
    ring: Tensor                     # [S, max(cap, 1), w]
    cap: int

    @classmethod
    def allocate(cls, n: int, cap: int, width: int, dtype, device) -> "FeatureStore":
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise DynspecError(f"ReferenceEngine draft_sync_cap={cap!r} must be an integer of at least 0 "
                               f"(tokens of target features kept a slot for lazy draft sync)")
        return cls(torch.zeros(n, max(cap, 1), width, dtype=dtype, device=device), cap)

    @property
    def bytes_per_token(self) -> int:
        return self.ring.shape[2] * self.ring.element_size()

    def write(self, slot: Tensor, pos: Tensor, h: Tensor) -> None:
        """h [n, w]: the captures of rows `slot` [n] at positions `pos` [n]."""
        self.ring[slot, pos % self.ring.shape[1]] = h

    def read(self, slot: Tensor, pos: Tensor) -> Tensor:
        """The captures at (slot [N], pos [N]) -> [N, w] (each within its slot's newest cap)."""
        return self.ring[slot, pos % self.ring.shape[1]]


@dataclass(frozen=True)
class StepParts:
    """What a step's device functions take (draft_chain, eager_mixed, mixed_graphs, carry).
    attention: the step's attention object (attention.SdpaAttention or ragged.RaggedAttention,
    chosen at construction); ragged: it is the ragged kernel, so decode batches read every row's
    whole table (draft_chain.decode_rows) and whole graphs take their batch as work items."""
    target: object
    draft: object
    buffers: StepBuffers
    heads: CarriedHeads
    slots: SlotState
    attention: object
    ragged: bool
    capture: tuple[int, ...]          # the target layers whose outputs the draft reads
    block_size: int
    max_blocks_per_seq: int
    features: FeatureStore            # lazy draft sync's store of target captures

    @property
    def device(self) -> torch.device:
        return self.buffers.x.device
