"""The device's copy of the slot state (block tables, block owners, each slot's request key and
acceptance rate, replayed traces), brought up to date with the host's bookkeeping in one copy.

reserve / release change the host's bookkeeping only (the allocator's tables, the keys); `flush`
writes what they changed since the last flush, however many requests came and went. The
acceptance model's device state (the Bernoulli flag, seed, each slot's rate and trace) is set by
`set_acceptance` when the model changes.
"""
from __future__ import annotations

import numpy as np
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import AcceptanceModel, Greedy, TraceReplay, rate_of, trace_table
from dynspec.runtime.engines.reference.attention import to_device
from dynspec.runtime.engines.reference.kv_cache import SCRATCH_BLOCK, BlockAllocator

TRACE_LEN = 512           # recorded offsets a replayed request may hold (acceptance.TraceReplay)


class SlotState:
    """The slot state on the device, written by `flush` only (and slot_p by `set_acceptance`)."""

    def __init__(self, blocks: BlockAllocator, slots: int, n_blocks: int, per_seq: int, device: torch.device):
        self.blocks, self.device, self.per_seq = blocks, device, per_seq
        n, dev = slots, device
        # what reserve / release changed since the last flush (host): a changed slot's row, key and
        # rate, and the blocks it took or freed (owner, logical index)
        self.dirty_slots: set[int] = set()
        self.dirty_blocks: set[int] = set()
        self.block_tables = torch.full((n, per_seq), SCRATCH_BLOCK, dtype=torch.long, device=dev)  # [slots+1, blocks]
        self.scratch_row = (SCRATCH_BLOCK,) * per_seq        # a row of it without blocks, on the host (table)
        self.block_owner = torch.full((n_blocks,), -1, dtype=torch.long, device=dev)     # [blocks] slot or -1
        self.block_logical = torch.zeros(n_blocks, dtype=torch.long, device=dev)         # [blocks] index in its table
        self.slot_key = torch.zeros(n, dtype=torch.long, device=dev)           # [S] request key (reserve)
        self.slot_p = torch.zeros(n, dtype=torch.float32, device=dev)          # [S] Bernoulli p of the slot's request
        self.bernoulli = torch.zeros((), dtype=torch.bool, device=dev)         # use it? (benchmarks)
        self.replay = torch.zeros((), dtype=torch.bool, device=dev)            # a trace instead (benchmarks)
        self.slot_trace = torch.zeros(n, TRACE_LEN, dtype=torch.long, device=dev)   # [S, TRACE_LEN] recorded r
        self.slot_trace_len = torch.ones(n, dtype=torch.long, device=dev)           # [S] its length
        self.accept_seed = torch.zeros((), dtype=torch.long, device=dev)       # Bernoulli seed
        self.keys: dict[int, int] = {}           # host copy of slot_key for the reserved slots
        self.acceptance: AcceptanceModel | None = None    # what slot_p/bernoulli hold (host copy: no sync)

    def reserve(self, tokens: int, key: int) -> int | None:
        slot = self.blocks.reserve(tokens)
        if slot is not None:
            self.keys[slot] = key
            self.dirty_slots.add(slot)
            self.dirty_blocks.update(self.blocks.tables[slot])
        return slot

    def release(self, slot: int) -> None:
        self.dirty_blocks.update(self.blocks.release(slot))
        self.keys.pop(slot, None)
        self.dirty_slots.add(slot)

    def table(self, slot: int) -> tuple[int, ...]:
        """The slot's block table on the host; a slot without blocks (the padding slot) has its
        row of block_tables, the scratch block at every index, so any position of its chunk writes
        there (which it owns no more than any other slot: its tokens see nothing)."""
        return self.blocks.tables.get(slot) or self.scratch_row

    def flushed(self) -> "SlotState":
        """Self, flushed first: what a reader outside launch (a test, a warm-up) reads through."""
        if self.dirty_slots:
            self.flush()
        return self

    def flush(self) -> None:
        """The device's slot state brought up to date with the host's: the slots reserve / release
        touched since the last flush and the blocks they took or freed, in one host -> device copy
        (pinned on CUDA, to_device) and a fixed number of index kernels, however many changed.
        Read from the allocator's state now, not replayed, so a slot released and reserved again
        (or its blocks handed to another slot) ends as the immediate writes would have left it:
            slot   reserved: its table padded with the scratch block, its key, and its rate
                   rate_of(model, key) once an acceptance model is set; released: the scratch row
            block  owned: its slot and its index in that slot's table; freed: owner -1
        What nothing reads stays as the last flush left it: a free slot's key and rate, a free
        block's logical index. An owned dirty block is in a dirty slot's table: it was handed out
        since the last flush, by a reserve that marked its slot. No index repeats within a write
        (index_copy_ is then deterministic): dirty slots are a set and tables are disjoint.
        Example, block_size 16, 3 blocks a table: slot 0 holds blocks (1, 2, 3) on the device;
        release(0), then reserve(20, key=9) takes slot 0 again, with blocks (1, 2):
            dirty  slots {0}, blocks {1, 2, 3}
            flush  block_tables[0] = [1, 2, 0], slot_key[0] = 9, slot_p[0] = rate_of(model, 9)
                   block_owner[[1, 2]] = 0, block_logical[[1, 2]] = [0, 1], block_owner[[3]] = -1
        Called first thing in launch (docs/design.md, "The overlapped loop": queued in stream
        order behind the step in flight), before a graph capture, and by every read of these
        tensors through the engine's attributes."""
        if not self.dirty_slots:
            return
        W, tables = self.per_seq, self.blocks.tables
        slots = sorted(self.dirty_slots)
        rows = np.full((len(slots), W), SCRATCH_BLOCK, dtype=np.int64)            # [n_dirty_slots, max_blocks]
        live = []                                          # [n_live] the reserved ones of them
        owned, owner, logical = [], [], []                 # [n_owned] their blocks: slot, index in its table
        for i, s in enumerate(slots):
            table = tables.get(s)
            if table is None:                              # released: the scratch row
                continue
            rows[i, :len(table)] = table
            live.append(s)
            owned += table
            owner += [s] * len(table)
            logical += range(len(table))
        freed = sorted(self.dirty_blocks.difference(owned))                       # [n_freed]
        keys = [self.keys[s] for s in live]                                       # [n_live]
        rates = [rate_of(self.acceptance, k) or 0.0 for k in keys] if self.acceptance is not None else []
        # one int64 array: slots | their rows | live slots | keys | rates (float64 bits) | owned | owner | logical | freed
        parts = [np.asarray(x, dtype=np.int64) for x in (slots, rows.ravel(), live, keys)]
        parts += [np.asarray(rates, dtype=np.float64).view(np.int64)]
        parts += [np.asarray(x, dtype=np.int64) for x in (owned, owner, logical, freed)]
        flat = to_device(torch.from_numpy(np.concatenate(parts)), self.device)   # the one copy
        slots_d, rows_d, live_d, keys_d, rates_d, owned_d, owner_d, logical_d, freed_d = flat.split(
            [len(x) for x in parts])
        self.block_tables.index_copy_(0, slots_d, rows_d.view(len(slots), W))
        self.slot_key.index_copy_(0, live_d, keys_d)
        if self.acceptance is not None:
            self.slot_p.index_copy_(0, live_d, rates_d.view(torch.float64).to(torch.float32))
        if isinstance(self.acceptance, TraceReplay) and live:
            self.write_traces(live, keys)
        self.block_owner.index_copy_(0, owned_d, owner_d)
        self.block_logical.index_copy_(0, owned_d, logical_d)
        self.block_owner.index_fill_(0, freed_d, -1)
        self.dirty_slots.clear()
        self.dirty_blocks.clear()

    def set_acceptance(self, acceptance: AcceptanceModel) -> None:
        """Device flag, seed and every reserved slot's rate follow the host copy, set when the
        model changes (in place: graphs read these buffers); `flush` sets a new slot's rate, from
        the model as of the flush (a slot reserved before a model change is rewritten here with
        the rest, from the host's keys, whichever of the two runs first)."""
        if acceptance == self.acceptance:
            return
        self.flush()
        rates = torch.zeros(self.slot_p.shape[0], dtype=torch.float32)
        for slot, key in self.keys.items():
            rates[slot] = rate_of(acceptance, key) or 0.0
        bern = not isinstance(acceptance, Greedy)
        self.accept_seed.fill_(getattr(acceptance, "seed", 0))
        self.bernoulli.fill_(bern)
        self.replay.fill_(isinstance(acceptance, TraceReplay))
        if isinstance(acceptance, TraceReplay) and self.keys:
            self.acceptance = acceptance
            self.write_traces(list(self.keys), list(self.keys.values()))
        self.slot_p.copy_(to_device(rates, self.device))          # pinned: the host does not wait
        self.acceptance = acceptance

    def write_traces(self, slots: list[int], keys: list[int]) -> None:
        """Each slot's replayed sequence (acceptance.trace_table) into slot_trace, in one copy."""
        table, lengths = trace_table(self.acceptance, keys)                   # [n, L] int8, [n]
        if table.shape[1] > TRACE_LEN:
            raise DynspecError(f"acceptance {self.acceptance}: recorded sequences of {table.shape[1]} offsets; "
                               f"the reference engine replays up to {TRACE_LEN}")
        rows = np.zeros((len(slots), TRACE_LEN + 2), dtype=np.int64)
        rows[:, 0], rows[:, 1] = slots, lengths
        rows[:, 2:2 + table.shape[1]] = table
        d = to_device(torch.from_numpy(rows), self.device)
        self.slot_trace.index_copy_(0, d[:, 0], d[:, 2:])
        self.slot_trace_len.index_copy_(0, d[:, 0], d[:, 1])
