"""The reference engine: batched EAGLE-3 chain drafting + greedy verification, in PyTorch.

Token/hidden bookkeeping for one row (x_j = token at position j, h_j = target capture at j):
    target cache   positions 0..L-1 hold x_0..x_{L-1};  x_L (pending) is not in it yet
    draft entry j  = (x_j, h_{j-1}) -> predicts x_{j+1}; stored at draft cache position j-1
    carried state  next_draft[r]   = draft's guess for x_{L+1} (from entry L)
                   draft_hidden[r] = that entry's output hidden (fed to the next chain step)
                   last_capture[r] = h_{L-1} (to rebuild entry L when the draft went stale)

Speculative step, K drafts, worked for K=2, accepted n=1:
    chain      entry L   -> d1 = next_draft     entry L+1 = (d1, draft_hidden) -> d2   [B, 1] each
    verify     target([x_L, d1, d2] @ L..L+2)  -> g0 g1 g2, H_L..H_{L+2}        [B, K+1]
    accept     d1 == g0, d2 != g1  -> n = 1;  emitted = [d1, g1]  (E[:, :n+1])
    catch-up   draft entries L+1..L+3 = (E_i, H_{L+i}) @ draft positions L..L+2   [B, K+1]
               entries up to L+n+1 are right; the one at index n is the next step's entry L'
               -> new next_draft, draft_hidden, last_capture = H_{L+n}.  Later entries are
               overwritten before they are read.
Plain decode (K=0): target([x_L]) -> g0. Keep-warm writes the draft K/V of entry L+1 only;
the first speculative step after a K=0 stretch rebuilds the draft head from (x_L, last_capture) first.

Prompt chunk [s, e) of a prompt of P tokens rides in the same target forward as the decode
rows. Its draft entries are the prompt's own: draft positions s..e-1 take (x_{p+1}, h_p),
with x_e the next prompt token, or for the last chunk (e = P) the target's first generated
token g0; the last chunk also sets the carried state from position P-1.

Cache: paged (kv_cache.py); target and draft share one block table per slot. reserve / release
change the host's bookkeeping only; the device's copy of the slot state (block_tables,
block_owner, block_logical, slot_key, slot_p) is brought up to date by the next launch, in one
copy however many requests came and went (_flush_slots).

One path per kind of step (docs/design.md, "CUDA graphs", "Host work of a step"):
    pure decode   the (bucket, K) graph chain once capture_graphs ran (CUDA), else eager
    mixed         the whole-forward graph of (Np, B, T, draft) (mixed_graphs.py: draft chain,
                  forward, acceptance and the draft's pass, all in it), else eager; eager is
                  also what runs above the top token bucket or past WholeMixed.CHUNKS chunks
    attention     CUDA: every packed row, decode rows and prompt chunks alike, through one launch
                  of ragged.RaggedAttention's kernel; CPU: SDPA
The caller picks the attention (`attention`): "auto" (the Triton kernel on CUDA, SDPA elsewhere),
"triton" (on CPU under Triton's interpreter, TRITON_INTERPRET=1: tests) or "sdpa".
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Iterable

import numpy as np
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.acceptance import (AcceptanceModel, Greedy, TraceReplay, accepted_prefix, draft_uniforms, rate_of,
                                        trace_table)
from dynspec.runtime.engines.reference.attention import (RaggedBatch, ragged_batch, sdpa_attention, to_device,
                                                         uniform_batch)
from dynspec.runtime.engines.reference.carry import (ResultReader, StepHandle, gather_carried, last_chunk_rows,
                                                     save_carried, with_device_rows)
from dynspec.runtime.engines.reference.graphs import CaptureCost, GraphChain, capture_chain, chain_cuts, timed_capture
from dynspec.runtime.engines.reference.kv_cache import (SCRATCH_BLOCK, BlockAllocator, available_bytes,
                                                         check_pool_fits, kv_pool_bytes)
from dynspec.runtime.engines.reference.mixed_graphs import WholeMixed, least_tokens, whole_keys
from dynspec.runtime.engines.reference.ragged import RaggedAttention
from dynspec.runtime.plan import PromptChunk, StepPlan, StepResult, batch_buckets, bucket_for, cap_k, make_plan
from dynspec.runtime.policy import speculates


ATTENTIONS = ("auto", "triton", "sdpa")
TRACE_LEN = 512           # recorded offsets a replayed request may hold (acceptance.TraceReplay)


@dataclass(frozen=True)
class GraphKey:
    kind: str                # "spec" | "decode" | "refresh"
    bucket: int              # padded row count
    k: int = 0               # drafted tokens per row; > 0 only for "spec"
    keep_warm: bool = False  # "decode" only: the draft extends its KV over the new token
    draft: bool = True       # "decode" only, False: a policy that never drafts (its mixed iterations
                             # run the target alone; its decode steps share the keep_warm=False graph)


def reachable_graphs(policies: Iterable, max_batch_size: int, keep_warm: bool,
                     max_num_tokens: int | None = None) -> tuple[GraphKey, ...]:
    """Every graph some batch size 1..max_batch_size can reach under any of the policies,
    with K capped to the token budget as the executor caps it (plan.cap_k).

    Example: threshold K=4 up to b=5, max batch 8, buckets (1, 2, 4, 8):
        spec (1,4) (2,4) (4,4) (8,4)   [b=5 pads to 8]   decode (8, keep_warm)   refresh (1) (2) (4) (8)
    An AdaptivePolicy may pick any of its candidates at any batch size: every bucket gets each,
    and its K=0 steps run with or without keep-warm (runtime/adaptive.py, step 4): both decode graphs.
    A policy that never drafts (policy.speculates) gets decode keys without keep-warm or draft.
    """
    buckets = batch_buckets(max_batch_size)
    keys: set[GraphKey] = set()
    for policy in policies:
        if not speculates(policy):
            keys.update(GraphKey("decode", bucket, draft=False) for bucket in buckets)
            continue
        for b in range(1, max_batch_size + 1):
            bucket = bucket_for(b, buckets)
            ks = policy.choices(b)                          # AdaptivePolicy: every candidate at every b
            for k in {k if max_num_tokens is None else cap_k(k, b, max_num_tokens) for k in ks}:
                if k > 0:
                    keys.add(GraphKey("spec", bucket, k))
                    keys.add(GraphKey("refresh", bucket))      # first spec step after a K=0 stretch
                else:
                    keys.add(GraphKey("decode", bucket, keep_warm=keep_warm))
                    if keep_warm and policy.chooses_keep_warm:
                        keys.add(GraphKey("decode", bucket, keep_warm=False))
    return capture_order(keys)


def capture_order(keys: Iterable[GraphKey]) -> tuple[GraphKey, ...]:
    """The keys once each, in one total order (kind, bucket, k, keep_warm). Under TP every rank
    warms up and captures in this order, so their collectives pair up: a set ordered by (kind,
    bucket, k) alone leaves decode (4, keep_warm) and decode (4) in hash order, which differs per
    process, and the ranks would run different collectives until NCCL's watchdog fires."""
    return tuple(sorted(set(keys), key=lambda g: (g.kind, g.bucket, g.k, g.keep_warm, g.draft)))


def _flushed(name: str) -> property:
    """Read access to one of the device tensors of the slot state, flushed first
    (ReferenceEngine._flush_slots), so a reader outside launch (a test, a warm-up) sees what
    reserve / release left. Writes go into the tensor returned, in place."""
    def get(self) -> torch.Tensor:
        if self._dirty_slots:
            self._flush_slots()
        return getattr(self, name)
    return property(get)


class ReferenceEngine:
    """Executor-facing engine: reserve(tokens) / release(slot) a sequence's cache, step(plan)."""

    # the slot state on the device, written by _flush_slots only (and slot_p by _set_acceptance)
    block_tables = _flushed("_block_tables")      # [slots+1, max_blocks] block ids, scratch past a table
    block_owner = _flushed("_block_owner")        # [blocks] slot or -1
    block_logical = _flushed("_block_logical")    # [blocks] index in its owner's table
    slot_key = _flushed("_slot_key")              # [S] request key (reserve)
    slot_p = _flushed("_slot_p")                  # [S] Bernoulli p of the slot's request

    def __init__(self, target, draft, *, max_batch_size: int, max_seq_len: int, max_draft_len: int,
                 max_num_tokens: int = 8192, block_size: int | None = None, num_blocks: int | None = None,
                 attention: str = "auto"):
        if max_num_tokens < max_draft_len + 1:
            raise DynspecError(f"max_num_tokens={max_num_tokens} is smaller than one verify window "
                               f"(max_draft_len {max_draft_len} + 1 = {max_draft_len + 1})")
        self.target, self.draft = target, draft
        self.max_batch_size, self.max_seq_len, self.max_draft_len = max_batch_size, max_seq_len, max_draft_len
        self.max_num_tokens = max_num_tokens
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        on_cuda = self.device.type == "cuda"
        bs = block_size or (128 if on_cuda else 16)
        per_seq = -(-max_seq_len // bs)
        n_blocks = num_blocks or 1 + max_batch_size * per_seq
        self.kv_bytes = kv_pool_bytes(target.config, draft.config, n_blocks, bs, p.element_size())
        check_pool_fits(self.kv_bytes, available_bytes(self.device), device=self.device,
                        max_batch_size=max_batch_size, max_seq_len=max_seq_len)   # before any table is built
        # CPU: every batch size is its own shape (no padding work); CUDA: padded graph buckets
        self.buckets = batch_buckets(max_batch_size) if on_cuda else tuple(range(1, max_batch_size + 1))
        self.async_launch = on_cuda        # launch returns before the device has run the step (executor.py)
        self.capture = tuple(draft.capture_layers)
        self.vocab_size = target.config.vocab_size
        if attention not in ATTENTIONS:
            raise DynspecError(f"attention {attention!r}: one of {', '.join(ATTENTIONS)}")
        if attention == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise DynspecError("attention 'triton' on CPU runs under Triton's interpreter only: set TRITON_INTERPRET=1 "
                               "before triton is imported")
        self.triton = attention == "triton" or attention == "auto" and on_cuda     # RaggedAttention, else SDPA
        self.blocks = BlockAllocator(n_blocks, bs, per_seq, max_batch_size)
        self.block_size, self.max_blocks_per_seq = bs, per_seq
        target.setup_pool(n_blocks, bs, per_seq * bs)
        draft.setup_pool(n_blocks, bs, per_seq * bs)
        n, dev = max_batch_size + 1, p.device          # slot max_batch_size: padding rows (scratch block)
        self.pad_slot = max_batch_size
        # what reserve / release changed since the last _flush_slots (host): a changed slot's row,
        # key and rate, and the blocks it took or freed (owner, logical index)
        self._dirty_slots: set[int] = set()
        self._dirty_blocks: set[int] = set()
        self._block_tables = torch.full((n, per_seq), SCRATCH_BLOCK, dtype=torch.long, device=dev)  # [slots+1, blocks]
        self._scratch_row = (SCRATCH_BLOCK,) * per_seq       # a row of it without blocks, on the host (_table)
        self._block_owner = torch.full((n_blocks,), -1, dtype=torch.long, device=dev)    # [blocks] slot or -1
        self._block_logical = torch.zeros(n_blocks, dtype=torch.long, device=dev)        # [blocks] index in its table
        fused = len(self.capture) * target.config.hidden_size
        # carried per-slot state (see module docstring)
        self.next_draft = torch.zeros(n, dtype=torch.long, device=dev)                             # [S]
        self.draft_hidden = torch.zeros(n, draft.config.hidden_size, dtype=p.dtype, device=dev)   # [S, h_draft]
        self.last_capture = torch.zeros(n, fused, dtype=p.dtype, device=dev)   # [S, n_capture*h_target]
        # static step inputs / outputs per decode row (also the CUDA-graph I/O). The inputs are the
        # rows of one [7, R] tensor, filled from a pinned host twin in one copy a step:
        #   x [R] pending tokens | pos [R] their positions | slot [R] their slots |
        #   from_dev [R] 1: take x, pos from the carried copy | last_slot, last_pos [R]: the last
        #   chunks' slots and prompt lengths (carry.py; the last three only for carried plans) |
        #   row_k [R] the most drafts each row may accept (plan.row_k; K for padding rows)
        self.step_in = torch.zeros(7, n, dtype=torch.long, device=dev)
        self.x, self.pos, self.slot, self.from_dev, self.last_slot, self.last_pos, self.row_k = self.step_in
        self._host_in = torch.zeros(7, n, dtype=torch.long, pin_memory=on_cuda)
        self._host_np = self._host_in.numpy()         # [7, R], shares its memory
        # the carried copy per slot (carry.py): next pending token and its position
        self.slot_tok = torch.zeros(n, dtype=torch.long, device=dev)               # [S]
        self.slot_pos = torch.zeros(n, dtype=torch.long, device=dev)               # [S]
        self.results = ResultReader(self.device, n * (max_draft_len + 3))
        self._host_in_free = None                 # CUDA event: the last copy out of _host_in is done
        self._pad_rows()
        self.out_tokens = torch.zeros(n, max_draft_len + 1, dtype=torch.long, device=dev)  # [R, K+1]
        self.out_n = torch.zeros(n, dtype=torch.long, device=dev)              # [R]
        self._slot_p = torch.zeros(n, dtype=torch.float32, device=dev)         # [S] Bernoulli p of the slot's request
        self.bernoulli = torch.zeros((), dtype=torch.bool, device=dev)         # use it? (benchmarks)
        self.replay = torch.zeros((), dtype=torch.bool, device=dev)            # a trace instead (benchmarks)
        self.slot_trace = torch.zeros(n, TRACE_LEN, dtype=torch.long, device=dev)   # [S, TRACE_LEN] recorded r
        self.slot_trace_len = torch.ones(n, dtype=torch.long, device=dev)           # [S] its length
        self.accept_seed = torch.zeros((), dtype=torch.long, device=dev)       # Bernoulli seed
        self._slot_key = torch.zeros(n, dtype=torch.long, device=dev)          # [S] request key (reserve)
        self._keys: dict[int, int] = {}          # host copy of slot_key for the reserved slots
        self._acceptance: AcceptanceModel | None = None   # what slot_p/bernoulli hold (host copy: no sync)
        self._graphs: dict[GraphKey, GraphChain] = {}
        self.eager_fallbacks = 0
        self.on_dispatch = None                   # hook(key) at every dispatch: a GraphKey, or a whole-forward
                                                  # key (Np, B, T, draft) (tp_stats.py)
        self.whole: WholeMixed | None = None      # mixed iterations' whole-forward graphs (capture_whole_graphs)
        self.warm_chunk_steps = 0                 # steps warm_chunks and warm_mixed ran
        self.capture_costs: dict[str, CaptureCost] = {}   # "decode", "whole": what their captures took (CUDA)

    # ---- the paged cache ------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.blocks.free_blocks

    @property
    def max_reservation(self) -> int:
        return self.blocks.max_tokens

    def can_reserve(self, tokens: int) -> bool:
        return self.blocks.can_reserve(tokens)

    def reserve(self, tokens: int, key: int = 0) -> int | None:
        """A slot whose blocks hold positions 0..tokens-1, or None while blocks or slots are short.
        key: the request's key, which with the position fixes its Bernoulli draws (acceptance.py).
        Host bookkeeping only: the device sees the slot from the next launch on (_flush_slots)."""
        slot = self.blocks.reserve(tokens)
        if slot is not None:
            self._keys[slot] = key
            self._dirty_slots.add(slot)
            self._dirty_blocks.update(self.blocks.tables[slot])
        return slot

    def release(self, slot: int) -> None:
        """Free the slot's blocks (no K/V is copied or cleared). Host bookkeeping only, as reserve."""
        self._dirty_blocks.update(self.blocks.release(slot))
        self._keys.pop(slot, None)
        self._dirty_slots.add(slot)

    def _flush_slots(self) -> None:
        """The device's slot state brought up to date with the host's: the slots reserve / release
        touched since the last flush and the blocks they took or freed, in one host -> device copy
        (pinned on CUDA, to_device) and a fixed number of index kernels, however many changed.
        Read from the allocator's state now, not replayed, so a slot released and reserved again
        (or its blocks handed to another slot) ends as the immediate writes would have left it:
            slot   reserved: its table padded with the scratch block, its key, and its rate
                   rate_of(model, key) once an acceptance model is set; released: the scratch row
            block  owned: its slot and its index in that slot's table; freed: owner -1
        What nothing reads stays as the last flush left it: a free slot's key and rate, a free
        block's logical index (the immediate writes left there whatever the history last wrote).
        An owned dirty block is in a dirty slot's table: it was handed out since the last flush,
        by a reserve that marked its slot. No index repeats within a write (index_copy_ is then
        deterministic): dirty slots are a set and tables are disjoint.
        Example, block_size 16, 3 blocks a table: slot 0 holds blocks (1, 2, 3) on the device;
        release(0), then reserve(20, key=9) takes slot 0 again, with blocks (1, 2):
            dirty  slots {0}, blocks {1, 2, 3}
            flush  block_tables[0] = [1, 2, 0], slot_key[0] = 9, slot_p[0] = rate_of(model, 9)
                   block_owner[[1, 2]] = 0, block_logical[[1, 2]] = [0, 1], block_owner[[3]] = -1
        Called first thing in launch (docs/design.md, "The overlapped loop": queued in stream
        order behind the step in flight, as the writes of reserve / release were), before a
        graph capture, and by every read of these tensors through the engine's attributes."""
        if not self._dirty_slots:
            return
        W, tables = self.max_blocks_per_seq, self.blocks.tables
        slots = sorted(self._dirty_slots)
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
        freed = sorted(self._dirty_blocks.difference(owned))                      # [n_freed]
        keys = [self._keys[s] for s in live]                                      # [n_live]
        rates = [rate_of(self._acceptance, k) or 0.0 for k in keys] if self._acceptance is not None else []
        # one int64 array: slots | their rows | live slots | keys | rates (float64 bits) | owned | owner | logical | freed
        parts = [np.asarray(x, dtype=np.int64) for x in (slots, rows.ravel(), live, keys)]
        parts += [np.asarray(rates, dtype=np.float64).view(np.int64)]
        parts += [np.asarray(x, dtype=np.int64) for x in (owned, owner, logical, freed)]
        flat = to_device(torch.from_numpy(np.concatenate(parts)), self.device)   # the one copy
        slots_d, rows_d, live_d, keys_d, rates_d, owned_d, owner_d, logical_d, freed_d = flat.split(
            [len(x) for x in parts])
        self._block_tables.index_copy_(0, slots_d, rows_d.view(len(slots), W))
        self._slot_key.index_copy_(0, live_d, keys_d)
        if self._acceptance is not None:
            self._slot_p.index_copy_(0, live_d, rates_d.view(torch.float64).to(torch.float32))
        if isinstance(self._acceptance, TraceReplay) and live:
            self._write_traces(live, keys)
        self._block_owner.index_copy_(0, owned_d, owner_d)
        self._block_logical.index_copy_(0, owned_d, logical_d)
        self._block_owner.index_fill_(0, freed_d, -1)
        self._dirty_slots.clear()
        self._dirty_blocks.clear()

    def _to_device(self, values) -> torch.Tensor:
        """A list of ints as a long tensor on the device, without holding the host (to_device)."""
        return to_device(torch.tensor(values, dtype=torch.long), self.device)

    # ---- one iteration ----------------------------------------------------------------------
    def step(self, plan: StepPlan, acceptance: AcceptanceModel) -> StepResult:
        """The serial loop's iteration: launch, then read its result."""
        return self.result(self.launch(plan, acceptance))

    @torch.inference_mode()
    def launch(self, plan: StepPlan, acceptance: AcceptanceModel) -> StepHandle:
        """Queue the whole step and the copy of its result to the host; no device -> host read.
        Rows with plan.from_device take their pending token and position from the carried copy
        of the step launched before (carry.py); plan.carry writes that copy for the next one."""
        b, B, K = plan.batch_size, plan.bucket, plan.k
        start = self.results.mark()
        self._flush_slots()                 # what reserve / release changed, before anything reads it
        self._set_acceptance(acceptance)
        if b or plan.carry:
            self._load_rows(plan)
        if plan.carried_rows:
            gather_carried(self.x, self.pos, self.slot, self.from_dev, self.slot_tok, self.slot_pos, b)
        read = -(-(plan.max_position + 1) // self.block_size)     # blocks this step reads (eager)
        if plan.chunks or plan.per_row and self._whole_key(plan) is not None:
            firsts = self._mixed(plan, read)
        else:
            firsts = self.out_n[:0]
            if K == 0:
                self._run(GraphKey("decode", B, keep_warm=plan.keep_warm), read)
            else:
                if any(plan.stale):
                    self._run(GraphKey("refresh", B), read)
                self._run(GraphKey("spec", B, K), read)
        if plan.carry:
            save_carried(plan, self, firsts)
        # the result: [b accepted | b x (K+1) tokens | first tokens of last chunks]
        out = torch.cat([self.out_n[:b], self.out_tokens[:b, : K + 1].reshape(-1), firsts])
        return self.results.stage(plan, out, start)

    def result(self, handle: StepHandle) -> StepResult:
        """The launched step's result: waits for its copy only (the step's one host sync)."""
        return self.results.read(handle)

    def _load_rows(self, plan: StepPlan) -> None:
        """x / pos / slot / from_dev of the plan's b rows, every later row padding (token 0 at
        position 1 of the padding slot: the scratch block, harmless writes), and for a carried
        plan its last chunks' (slot, P), in one host -> device copy. On CUDA the copy is from
        pinned memory: it runs in stream order without blocking the host, and the host buffer is
        rewritten only once the previous copy out of it is done."""
        b = plan.batch_size
        if self._host_in_free is not None:
            self._host_in_free.synchronize()
        h = self._host_np
        h[0, :b], h[1, :b], h[2, :b], h[3, :b] = plan.pending, plan.positions, plan.slots, plan.from_device
        h[0, b:], h[1, b:], h[2, b:], h[3, b:] = 0, 1, self.pad_slot, 0
        h[6, :b], h[6, b:] = plan.row_k, plan.k
        if plan.carry:
            slots, lens = last_chunk_rows(plan)
            h[4, :len(slots)], h[5, :len(slots)] = slots, lens
        self.step_in.copy_(self._host_in, non_blocking=True)
        if self.device.type == "cuda":
            if self._host_in_free is None:
                self._host_in_free = torch.cuda.Event()
            self._host_in_free.record()

    def decode_graph(self, bucket: int, keep_warm: bool):
        """The captured plain-decode graphs of (bucket, keep_warm), or None (eager, not captured)."""
        return self._graphs.get(GraphKey("decode", bucket, keep_warm=keep_warm))

    def _set_acceptance(self, acceptance: AcceptanceModel) -> None:
        """Device flag, seed and every reserved slot's rate follow the host copy, set when the
        model changes (in place: graphs read these buffers); _flush_slots sets a new slot's rate,
        from the model as of the flush (a slot reserved before a model change is rewritten here
        with the rest, from the host's keys, whichever of the two runs first)."""
        if acceptance == self._acceptance:
            return
        rates = torch.zeros(self.slot_p.shape[0], dtype=torch.float32)
        for slot, key in self._keys.items():
            rates[slot] = rate_of(acceptance, key) or 0.0
        bern = not isinstance(acceptance, Greedy)
        self.accept_seed.fill_(getattr(acceptance, "seed", 0))
        self.bernoulli.fill_(bern)
        self.replay.fill_(isinstance(acceptance, TraceReplay))
        if isinstance(acceptance, TraceReplay) and self._keys:
            self._acceptance = acceptance
            self._write_traces(list(self._keys), list(self._keys.values()))
        self.slot_p.copy_(to_device(rates, self.device))          # pinned: the host does not wait
        self._acceptance = acceptance

    def _write_traces(self, slots: list[int], keys: list[int]) -> None:
        """Each slot's replayed sequence (acceptance.trace_table) into slot_trace, in one copy."""
        table, lengths = trace_table(self._acceptance, keys)                  # [n, L] int8, [n]
        if table.shape[1] > TRACE_LEN:
            raise DynspecError(f"acceptance {self._acceptance}: recorded sequences of {table.shape[1]} offsets; "
                               f"the reference engine replays up to {TRACE_LEN}")
        rows = np.zeros((len(slots), TRACE_LEN + 2), dtype=np.int64)
        rows[:, 0], rows[:, 1] = slots, lengths
        rows[:, 2:2 + table.shape[1]] = table
        d = to_device(torch.from_numpy(rows), self.device)
        self.slot_trace.index_copy_(0, d[:, 0], d[:, 2:])
        self.slot_trace_len.index_copy_(0, d[:, 0], d[:, 1])

    def _run(self, key: GraphKey, read: int) -> None:
        if self.on_dispatch is not None:
            self.on_dispatch(key)
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        if self._graphs:
            self.eager_fallbacks += 1     # a shape the schedule was not expected to reach
        self._device_fn(key, read)

    def _device_fn(self, key: GraphKey, read: int | None) -> None:
        B = key.bucket
        if key.kind == "spec":
            self._speculate(B, key.k, read)
        elif key.kind == "decode":
            self._decode(B, key.keep_warm, read)
        else:
            self._refresh(B, read)

    # ---- device functions: static buffers in, static buffers out; graph-capturable ----------
    def _rows(self, B: int, q_pos: torch.Tensor, read: int | None) -> RaggedBatch:
        """Decode rows 0..B-1, row r's tokens at q_pos[r] ([B, T]), over `read` blocks of their
        tables (None: all). Where Triton runs always all, as in the decode graphs: the paged
        kernel's launch constants (PER, SPLITS) follow the table width, so an eager step at its
        own `read` (a K > 0 mixed iteration's draft chain and decode rows) compiled a kernel of its
        own on first use, 1-2 s inside a served step on the H200; at the graphs' width it runs
        theirs. Tiles past a row's last position load nothing. SDPA (CPU) gathers `read` blocks."""
        width = self.max_blocks_per_seq if self.triton or not read else read
        return uniform_batch(self.block_tables, self.slot[:B], q_pos, width, self.block_size)

    def decode_attention(self):
        """Every step's attention, graphed or eager: RaggedAttention (for decode rows with RoPE
        and the K/V write inside its launch) where Triton runs, else gathered SDPA."""
        return RaggedAttention(self.block_size) if self.triton else sdpa_attention


    def _draft_next(self, tokens, hidden, batch, attention=None):
        """Draft forward over packed tokens -> (target-vocab argmax [N], output hidden [N, h])."""
        ids, dh = self.draft.run(tokens, hidden, batch, attention, greedy=True)
        return self.draft.to_target_ids(ids), dh

    def _refresh(self, B: int, read) -> None:
        """Rebuild entry L of stale rows: (x_L, h_{L-1}) at draft position L-1."""
        slot = self.slot[:B]
        batch = self._rows(B, (self.pos[:B] - 1)[:, None], read)
        d, h = self._draft_next(self.x[:B], self.last_capture[slot], batch, self.decode_attention())
        self.next_draft[slot], self.draft_hidden[slot] = d, h

    def draft_chain(self, B: int, K: int, read: int | None = None) -> torch.Tensor:
        """K-1 chain steps from the carried head -> drafts [B, K]."""
        slot, pos = self.slot[:B], self.pos[:B]
        drafts, h = [self.next_draft[slot]], self.draft_hidden[slot]
        for i in range(1, K):                                                # entries L+1..L+K-1
            d, h = self._draft_next(drafts[-1], h, self._rows(B, (pos + i - 1)[:, None], read), self.decode_attention())
            drafts.append(d)
        return torch.stack(drafts, dim=1)                                    # [B, K]

    def accept(self, D, g):
        """drafts D [B, K] of rows 0..B-1, target greedy g [B, K+1] -> (accepted n [B], tokens
        E [B, K+1]): E[:, i] = d_{i+1} for i < n, else the target's token; emitted = E[:, :n+1].
        n <= row_k[r]: a row at K_r < K takes the target's token at index K_r at the latest, which
        followed only accepted drafts (lossless; the drafts past K_r are verified and dropped).
        Bernoulli models: d_i (at position pos + i) is accepted iff draft_uniforms(...) < p of the
        row's request (slot_p[slot], set from rate_of(model, key)). TraceReplay: d_i is accepted iff
        i <= r, r the request's recorded run length at its pending position (wrapping at its length)."""
        B, K = D.shape
        steps = torch.arange(K + 1, device=D.device)
        slot = self.slot[:B]
        u = draft_uniforms(self.accept_seed, self.slot_key[slot], self.pos[:B, None] + steps[None, 1:])
        rand = u < self.slot_p[slot][:, None]                                            # [B, K]
        r = self.slot_trace[slot, self.pos[:B] % self.slot_trace_len[slot]]                # [B] recorded run
        rand = torch.where(self.replay, steps[None, 1:] <= r[:, None], rand)
        n = accepted_prefix(torch.where(self.bernoulli, rand, D == g[:, :K]))           # [B]
        n = torch.minimum(n, self.row_k[:B])          # row r accepts at most its own K_r (plan.row_k)
        return n, torch.where(steps[None] < n[:, None], torch.cat([D, g[:, -1:]], 1), g)

    def _speculate(self, B: int, K: int, read) -> None:
        D = self.draft_chain(B, K, read)                                     # [B, K]
        vpos = self.pos[:B, None] + torch.arange(K + 1, device=D.device)     # [B, K+1]
        batch = self._rows(B, vpos, read)
        tokens = torch.cat([self.x[:B, None], D], 1)                         # [B, K+1]
        attention = self.decode_attention()          # the verify's and the draft's catch-up
        g, H = self.target.run(tokens.reshape(-1), batch, capture=self.capture, attention=attention, greedy=True)
        n, E = self.accept(D, g.view(B, K + 1))
        self._catch_up(E, H.view(B, K + 1, -1), batch, n, attention)
        self.out_tokens[:B, : K + 1] = E
        self.out_n[:B] = n

    def _decode(self, B: int, keep_warm: bool, read) -> None:
        """Plain decode. Keep-warm writes only the draft's K/V for the new entry (no draft
        attention, MLP or lm_head); the draft head (next_draft, draft_hidden) is rebuilt by
        `_refresh` when speculation resumes, so every later draft step sees a complete cache."""
        batch = self._rows(B, self.pos[:B, None], read)
        g, H = self.target.run(self.x[:B], batch, capture=self.capture, attention=self.decode_attention(),
                               greedy=True)                                  # [B]
        if keep_warm:
            self.draft.extend_kv(g, H, batch)                                # entry L+1 @ draft pos L
        self.last_capture[self.slot[:B]] = H
        self.out_tokens[:B, 0] = g
        self.out_n[:B] = 0

    def _catch_up(self, E, H, batch, n, attention) -> None:
        """Draft entries L+1..L+T from (E_i, H_i) at draft positions L..L+T-1; keep index n.
        E [B, T], H [B, T, w]."""
        B, T = E.shape
        d, h = self._draft_next(E.reshape(-1), H.reshape(B * T, -1), batch, attention)
        rows = torch.arange(B, device=E.device)
        slot = self.slot[:B]
        self.next_draft[slot] = d.view(B, T)[rows, n]
        self.draft_hidden[slot] = h.view(B, T, -1)[rows, n]
        self.last_capture[slot] = H[rows, n]

    # ---- mixed iterations: decode rows + prompt chunks in one target forward ---------------
    def _mixed(self, plan: StepPlan, read: int) -> torch.Tensor:
        """Returns the first generated token of each last chunk [n_last]. Packing (as mixed_graphs.py):
        the B = plan.bucket decode rows' T tokens (rows b..B-1 padding), then the chunks' tokens.
        Through a whole-forward graph where one holds the iteration (stale rows refreshed first,
        by the refresh graph), else eagerly."""
        b, B, K = plan.batch_size, plan.bucket, plan.k
        key = self._whole_key(plan)
        if key is not None:
            self.whole.stage(key, plan.chunks, plan.keep_warm, plan.slots, plan.row_k)
            if b and K and any(plan.stale):
                self._run(GraphKey("refresh", B), None)
            if self.on_dispatch is not None:
                self.on_dispatch(key)
            return self.whole.run(key)[:plan.last_chunks]
        m = self._mixed_inputs(plan)
        nd = m.nd
        if b and K and any(plan.stale):
            self._refresh(B, read)
        D = self.draft_chain(B, K, read) if b and K else None                 # [B, K]
        tokens = torch.cat([self.x[:B, None], D], 1).reshape(-1) if D is not None else self.x[:B]
        attention = self.decode_attention()                                  # one launch over every row
        if b and plan.carried_rows:          # the host laid the decode rows out at upper bounds
            m = replace(m, batch=with_device_rows(m.batch, self.pos, self.slot, self.block_tables, B, K + 1))
        logit_index = torch.cat([torch.arange(nd, device=self.device), m.last_idx])
        greedy, H = self.target.run(torch.cat([tokens, m.prompt]) if b else m.prompt, m.batch,
                                    capture=self.capture if plan.draft else (), logit_index=logit_index,
                                    attention=attention, greedy=True)        # [nd + n_last]
        firsts = greedy[nd:]
        m.nxt[m.last_idx - nd] = firsts          # draft entries (x_{p+1}, h_p): a last chunk's x_e is g0
        if b and K:
            self._mixed_catch_up(plan, D, greedy[:nd], H, m, attention)
        else:
            self._mixed_decode_end(plan, greedy[:nd], H, m, read)
        return firsts

    def _mixed_inputs(self, plan: StepPlan) -> "MixedInputs":
        """The chunks' side of an eager mixed iteration, every host -> device copy issued before
        the first kernel (the draft's included): a copy from pageable memory waits for the stream,
        so one issued later would stall the host until the work queued before it ends; these are
        pinned (_to_device, ragged_batch).
        One tensor, split: [prompt tokens Nc | their draft inputs Nc | last chunks' packed index |
        their slot]. Packed index of chunk token j: B*T + j."""
        b, B, T, chunks = plan.batch_size, plan.bucket, plan.k + 1, plan.chunks
        nd = i = plan.padded_decode_tokens
        ends = []
        for c in chunks:
            i += len(c.tokens)
            ends.append(i - 1)                                               # packed index of its last token
        last_rows = [j for j, c in enumerate(chunks) if c.last]
        host = [[t for c in chunks for t in c.tokens],
                [t for c in chunks for t in c.tokens[1:] + (c.next_token or 0,)],
                [ends[j] for j in last_rows], [chunks[j].slot for j in last_rows]]
        prompt, nxt, last_idx, last_slot = self._to_device(
            [x for part in host for x in part]).split([len(x) for x in host])
        pad = B - b                                                          # padding rows: slot pad_slot at 1
        slots = list(plan.slots) + [self.pad_slot] * pad + [c.slot for c in chunks]
        starts = list(plan.positions) + [1] * pad + [c.start for c in chunks]
        lens = [T] * B + [len(c.tokens) for c in chunks]
        c_batch = ragged_batch(self.block_tables, slots[B:], starts[B:], lens[B:], self.block_size)
        batch = ragged_batch(self.block_tables, slots, starts, lens, self.block_size) if B else c_batch
        return MixedInputs(prompt, nxt.clone(), last_idx, last_slot, batch, c_batch, nd)

    def _mixed_catch_up(self, plan: StepPlan, D, g, H, m: "MixedInputs", attention) -> None:
        """K > 0: accept over the B rows (g [B*T]), then one draft pass over the rows' catch-up
        entries and the chunks' entries; the b real rows and the last chunks keep their heads."""
        b, B, T, dev = plan.batch_size, plan.bucket, plan.k + 1, self.device
        n, E = self.accept(D, g.view(B, T))
        self.out_tokens[:b, :T] = E[:b]
        self.out_n[:b] = n[:b]
        d, h = self._draft_next(torch.cat([E.reshape(-1), m.nxt]), H, m.batch, attention)
        rows, slot = torch.arange(b, device=dev), self.slot[:b]
        self.next_draft[slot] = d[: m.nd].view(B, T)[rows, n[:b]]
        self.draft_hidden[slot] = h[: m.nd].view(B, T, -1)[rows, n[:b]]
        self.last_capture[slot] = H[: m.nd].view(B, T, -1)[rows, n[:b]]
        self._last_heads(m, d, h, H, 0)

    def _mixed_decode_end(self, plan: StepPlan, g, H, m: "MixedInputs", read: int) -> None:
        """K = 0: the b rows' outputs and keep-warm K/V, then the draft's pass over the chunks;
        without the draft (plan.draft False) the rows' outputs alone (H is None: nothing captured)."""
        b = plan.batch_size
        if b:
            if plan.keep_warm:
                self.draft.extend_kv(g[:b], H[:b], self._rows(b, self.pos[:b, None], read))
            if plan.draft:
                self.last_capture[self.slot[:b]] = H[:b]
            self.out_tokens[:b, 0] = g[:b]
            self.out_n[:b] = 0
        if plan.draft:
            d, h = self._draft_next(m.nxt, H[m.nd:], m.c_batch, self.decode_attention())
            self._last_heads(m, d, h, H, m.nd)

    def _last_heads(self, m: "MixedInputs", d, h, H, offset: int) -> None:
        """The carried state of each last chunk's slot, from its last token (d, h indexed from offset)."""
        if m.last_idx.numel():
            self.next_draft[m.last_slot] = d[m.last_idx - offset]
            self.draft_hidden[m.last_slot] = h[m.last_idx - offset]
            self.last_capture[m.last_slot] = H[m.last_idx]

    def forward_tokens(self, decode_rows: int, k: int, prefill_tokens: int, verify_tokens: int | None = None) -> int:
        """Tokens the target forward of an iteration runs, padding included. A pure-decode step at
        one K: decode rows padded to their row bucket at K+1 tokens each. An iteration through a
        whole-forward graph (mixed iterations, and per-row K when whole graphs are set up): the
        rows' own tokens (verify_tokens, default rows x (K+1)) plus prompt tokens, padded to the
        token bucket; eager mixed iterations: the rows padded to their bucket, plus the prompt.
        Buckets (1, 2, 4, 8), token buckets (16, 32, 64): 3 rows at K=2 -> 12; 3 rows at K=1 and
        9 prompt tokens -> 3 x 2 + 9 = 15 -> 16."""
        verify = decode_rows * (k + 1) if verify_tokens is None else verify_tokens
        if (prefill_tokens or verify != decode_rows * (k + 1)) and self.whole is not None:
            n = self.whole.bucket(verify + prefill_tokens)
            if n is not None:
                return n
        return (bucket_for(decode_rows, self.buckets) * (k + 1) if decode_rows else 0) + prefill_tokens

    def _whole_key(self, plan: StepPlan):
        """The whole-forward graph key of this mixed iteration, or None (eager): on CUDA a
        captured key only; on CPU any key once capture_whole_graphs ran (uncaptured, tests)."""
        if self.whole is None:
            return None
        key = self.whole.key(plan)
        return key if key is not None and (key in self.whole.graphs or self.device.type != "cuda") else None

    def _pad_rows(self) -> None:
        """Every step row a padding row (token 0 at position 1 of the padding slot): what graph
        warm-ups and captures run on, writing only into the scratch block."""
        self.x.zero_()
        self.pos.fill_(1)
        self.slot.fill_(self.pad_slot)
        self.row_k.fill_(self.max_draft_len)

    def _table(self, slot: int) -> tuple[int, ...]:
        """The slot's block table on the host; a slot without blocks (the padding slot) has its
        row of block_tables, the scratch block at every index, so any position of its chunk writes
        there (which it owns no more than any other slot: its tokens see nothing)."""
        return self.blocks.tables.get(slot) or self._scratch_row

    def warm_chunks(self) -> int:
        """Run the eager chunk path before serving: chunk-only steps of 1 and min(300,
        max_num_tokens) packed tokens on the padding slot (its K/V go to the scratch block; rows of
        at most max_seq_len - 1 tokens), which compile the ragged kernel's item form (one version a
        pool layout: target, draft) and the glue at one token and at several. Without it the first
        mixed iterations of a run would compile inside the measurement. Returns the steps run."""
        per_row = max(1, self.max_seq_len - 1)
        sizes = sorted({1, min(300, self.max_num_tokens)})
        for n in sizes:
            rows = [min(per_row, n - i) for i in range(0, n, per_row)]
            plan = StepPlan(k=0, batch_size=0, bucket=0, positions=(), pending=(), stale=(), keep_warm=False,
                            slots=(), chunks=tuple(PromptChunk(self.pad_slot, 0, (0,) * r, None) for r in rows))
            self.step(plan, Greedy())
        self.warm_chunk_steps += len(sizes)
        return len(sizes)

    def warm_mixed(self, keys: Iterable[GraphKey]) -> int:
        """Mixed iterations at every speculative row shape (bucket B, K) of `keys`, every row on
        the padding slot (K/V into the scratch block): B decode rows and one last chunk of 5
        tokens, one that makes the packed total a multiple of 16 (Triton specialises integer
        arguments on that), one of 300 tokens (many work items) and two chunks, one not last.
        Mixed iterations past the whole graphs (above the top token bucket, more than
        WholeMixed.CHUNKS chunks) run eagerly, and what that compiles on first use at a (B, K)
        would otherwise stall a served step for seconds. Chunks are capped to the token budget.
        Returns the steps run.
        Key spec (4, K=2) (3 tokens a row, budget 64): chunks [5], [4], [52], [7, 3]."""
        pad, steps = self.pad_slot, 0
        for bucket, k in sorted({(g.bucket, g.k) for g in keys if g.kind == "spec"}):
            rows = bucket * (k + 1)
            room = min(self.max_num_tokens - rows, self.max_seq_len - 1)
            shapes = [(5,), (16 - rows % 16,), (300,), (7, 3)]
            for sizes in shapes:
                if room < sum(sizes) and len(sizes) > 1 or room < 1:
                    continue
                lens = [min(n, room) for n in sizes]
                chunks = tuple(PromptChunk(pad, 0, (0,) * n, None if j == len(lens) - 1 else 0)
                               for j, n in enumerate(lens))
                self.step(make_plan(k, positions=(1,) * bucket, pending=(0,) * bucket, stale=(False,) * bucket,
                                    keep_warm=False, buckets=self.buckets, slots=(pad,) * bucket, chunks=chunks),
                          Greedy())
                steps += 1
        self.warm_chunk_steps += steps
        return steps

    # ---- CUDA graphs ------------------------------------------------------------------------
    def capture_graphs(self, keys: Iterable[GraphKey], per_row: bool = False) -> int:
        """Every graph of GraphMode.FULL for the pure-decode `keys` (reachable_graphs): their
        decode graphs, then (CUDA) the eager path's chunk attention compiled (warm_chunks: its
        chunk-only steps run before a whole graph could take them), then the whole-forward graphs
        of their row shapes (capture_whole_graphs), then mixed iterations at every speculative row
        shape (warm_mixed). per_row: a policy that sets each row's K (capture_whole_graphs).
        Returns how many graphs."""
        keys = tuple(keys)
        n = self.capture_decode_graphs(keys)
        if self.device.type == "cuda":
            self.warm_chunks()
        n += self.capture_whole_graphs(keys, per_row=per_row)
        if self.device.type == "cuda":
            self.warm_mixed(keys)
        return n

    def capture_decode_graphs(self, keys: Iterable[GraphKey]) -> int:
        """One graph chain per pure-decode key (CUDA; 0 on CPU), warmed up and captured in
        capture_order. Decode graphs read every row's whole block table (max_seq_len)."""
        if self.device.type != "cuda":
            return 0
        n, cost = timed_capture(lambda: self._capture_decode(keys))
        self.capture_costs["decode"] = self.capture_costs.get("decode", CaptureCost()) + cost
        return n

    def _capture_decode(self, keys: Iterable[GraphKey]) -> int:
        keys = capture_order(replace(k, draft=True) for k in keys)      # draft is the mixed graphs' concern
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        self._flush_slots()              # not inside a capture: its copy and writes would be baked in
        self._pad_rows()
        with torch.inference_mode():
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for key in keys:                       # warm up every shape once (allocator, kernels)
                    self._device_fn(key, None)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for key in keys:
                self._graphs[key] = self._capture_chain(key, pool, stream)
        torch.cuda.synchronize()
        return len(keys)

    def capture_whole_graphs(self, keys: Iterable[GraphKey] = (), exact: Iterable[tuple] = (),
                             per_row: bool = False) -> int:
        """Mixed iterations' whole target forward, attention included, as one graph chain per
        (token bucket, row bucket, T, draft) (mixed_graphs.py): for the row shapes of `keys` with every
        token bucket they can reach (mixed_graphs.least_tokens; per_row: a policy that sets each
        row's K, whose iterations without chunks run there too), plus chunk-only iterations, plus
        the `exact` keys. Returns how many.
        CPU: WholeMixed is set up and its functions run uncaptured (tests check them there)."""
        if self.whole is None:
            self.whole = WholeMixed(self)
        if self.device.type != "cuda":
            return 0
        rows = {(g.bucket, g.k + 1 if g.kind == "spec" else 1, g.draft) for g in keys if g.kind != "refresh"}
        self._flush_slots()              # not inside a capture (capture_decode_graphs)
        self._pad_rows()
        below = dict(zip(self.buckets, (0,) + self.buckets[:-1]))          # row bucket -> the one below it
        least = lambda B, T: least_tokens(B, T, below[B], per_row)          # noqa: E731
        wanted = set(whole_keys(rows, self.whole.buckets, least) if rows else ()) | set(exact)
        n, cost = timed_capture(lambda: self.whole.capture(wanted))
        self.capture_costs["whole"] = self.capture_costs.get("whole", CaptureCost()) + cost
        return n

    def drop_whole(self) -> None:
        """Mixed iterations back to the eager path (e.g. after a failed whole-graph capture)."""
        self.whole = None

    def drop_graphs(self) -> None:
        """Forget every captured graph (a graph bakes in what it captured, e.g. the all-reduce mode)."""
        self._graphs.clear()
        if self.whole is not None:
            self.whole.drop()

    def _capture_chain(self, key: GraphKey, pool, stream) -> GraphChain:
        """The key's device function captured as a graph chain (graphs.capture_chain)."""
        def fn(cut) -> None:
            self.target.layer_hook = cut
            try:
                self._device_fn(key, None)
            finally:
                self.target.layer_hook = None

        return capture_chain(fn, chain_cuts(len(self.target.layers)), pool, stream)


@dataclass(frozen=True)
class MixedInputs:
    """An eager mixed iteration's device inputs (ReferenceEngine._mixed_inputs)."""
    prompt: torch.Tensor          # [Nc] the chunks' tokens
    nxt: torch.Tensor             # [Nc] their draft inputs x_{p+1} (a last chunk's last: set to g0)
    last_idx: torch.Tensor        # [n_last] packed index of each last chunk's last token
    last_slot: torch.Tensor       # [n_last] its slot
    batch: RaggedBatch            # every row: B decode rows then the chunks
    c_batch: RaggedBatch          # the chunks alone (their own packing from 0)
    nd: int                       # B x T decode tokens ahead of the chunks


def load_reference_engine(
    target_dir: str,
    draft_dir: str,
    *,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    max_batch_size: int = 64,
    max_seq_len: int = 1024,
    max_draft_len: int = 8,
    max_num_tokens: int = 8192,
    fused_kernels: bool | None = None,
    prepare=None,
    target_part=None,
    draft_part=None,
    **cache,
) -> ReferenceEngine:
    """fused_kernels: the per-layer elementwise glue compiled, with Triton's rope_write and norms
    on CUDA (model.Kernels; default: on CUDA only).
    target_part / draft_part: read only this rank's part of each tensor (load.py's `part`;
    tp.load_tp_engine passes tp.shard_part). prepare(target, draft): runs on the loaded models
    before the caches are sized (tp.apply_tp sets the local heads and collectives there).
    cache: block_size, num_blocks, attention ("auto", "triton", "sdpa"), passed to ReferenceEngine."""
    from dynspec.runtime.engines.reference.load import load_draft, load_target
    from dynspec.runtime.engines.reference.model import Kernels

    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    target = load_target(target_dir, device=device, dtype=dt, part=target_part)
    if fused_kernels if fused_kernels is not None else str(device).startswith("cuda"):
        target.kernels = Kernels(compiled=True)
    draft = load_draft(draft_dir, target, device=device, dtype=dt, part=draft_part)
    if prepare is not None:
        prepare(target, draft)
    return ReferenceEngine(target, draft, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                           max_draft_len=max_draft_len, max_num_tokens=max_num_tokens, **cache)
