"""The reference engine: batched EAGLE-3 chain drafting + greedy verification, in PyTorch.

The token and hidden bookkeeping of a row (carried state, chain, verify, catch-up): draft_chain.py.

Prompt chunk [s, e) of a prompt of P tokens rides in the same target forward as the decode
rows. Its draft entries are the prompt's own: draft positions s..e-1 take (x_{p+1}, h_p),
with x_e the next prompt token, or for the last chunk (e = P) the target's first generated
token g0; the last chunk also sets the carried state from position P-1.

Cache: paged (kv_cache.py); target and draft share one block table per slot. reserve / release
change the host's bookkeeping only; the device's copy of the slot state (slot_state.py) is
brought up to date by the next launch, in one copy however many requests came and went.

One path per kind of step (docs/design.md, "CUDA graphs", "Host work of a step"):
    pure decode   the (bucket, K) graph chain once capture_graphs ran (CUDA), else eager
                  (draft_chain.py; keys: graph_keys.py; capture: capture.py)
    mixed         the whole-forward graph of (Np, B, T, draft) (mixed_graphs.py: draft chain,
                  forward, acceptance and the draft's pass, all in it), else eager (eager_mixed.py),
                  as above the top token bucket or past WholeMixed.CHUNKS chunks
    per-row K     (plan.row_k) the whole-forward graph with every row at its own K_i + 1 tokens
                  where whole graphs are set up, else the paths above with acceptance capped
    attention     CUDA: every packed row, decode rows and prompt chunks alike, through one launch
                  of ragged.RaggedAttention's kernel; CPU: SDPA
The caller picks the attention (`attention`): "auto" (the Triton kernel on CUDA, SDPA elsewhere),
"triton" (on CPU under Triton's interpreter, TRITON_INTERPRET=1: tests) or "sdpa".
"""
from __future__ import annotations

import os
from typing import Iterable

import torch

from dynspec.errors import DynspecError
from dynspec.runtime.acceptance import AcceptanceModel
from dynspec.runtime.engines.reference import capture, draft_chain, eager_mixed
from dynspec.runtime.engines.reference.attention import sdpa_attention
from dynspec.runtime.engines.reference.carry import ResultReader, StepHandle, gather_carried, last_chunk_rows, save_carried
from dynspec.runtime.engines.reference.graph_keys import GraphKey, capture_order, reachable_graphs
from dynspec.runtime.engines.reference.graphs import CaptureCost, GraphChain
from dynspec.runtime.engines.reference.kv_cache import BlockAllocator, available_bytes, check_pool_fits, kv_pool_bytes
from dynspec.runtime.engines.reference.mixed_graphs import WholeMixed
from dynspec.runtime.engines.reference.ragged import RaggedAttention
from dynspec.runtime.engines.reference.slot_state import SlotState
from dynspec.runtime.plan import StepPlan, StepResult, batch_buckets, bucket_for

__all__ = ["ATTENTIONS", "GraphKey", "ReferenceEngine", "capture_order", "reachable_graphs"]

ATTENTIONS = ("auto", "triton", "sdpa")


def _flushed(name: str) -> property:
    """Read access to one of the device tensors of the slot state, flushed first (SlotState.flush),
    so a reader outside launch (a test, a warm-up) sees what reserve / release left. Writes go
    into the tensor returned, in place."""
    return property(lambda self: getattr(self.slots.flushed(), name))


class ReferenceEngine:
    """Executor-facing engine: reserve(tokens) / release(slot) a sequence's cache, step(plan)."""

    # the slot state on the device (slot_state.py)
    block_tables = _flushed("block_tables")      # [slots+1, max_blocks] block ids, scratch past a table
    block_owner = _flushed("block_owner")        # [blocks] slot or -1
    block_logical = _flushed("block_logical")    # [blocks] index in its owner's table
    slot_key = _flushed("slot_key")              # [S] request key (reserve)
    slot_p = _flushed("slot_p")                  # [S] Bernoulli p of the slot's request

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
        draft.kernels = target.kernels                         # the draft's glue on the target's Kernels
        self.vocab_size = target.config.vocab_size
        self.triton = _use_triton(attention, on_cuda)          # RaggedAttention, else SDPA
        self.blocks = BlockAllocator(n_blocks, bs, per_seq, max_batch_size)
        self.block_size, self.max_blocks_per_seq = bs, per_seq
        target.setup_pool(n_blocks, bs, per_seq * bs)
        draft.setup_pool(n_blocks, bs, per_seq * bs)
        n, dev = max_batch_size + 1, p.device          # slot max_batch_size: padding rows (scratch block)
        self.pad_slot = max_batch_size
        self.slots = s = SlotState(self.blocks, n, n_blocks, per_seq, dev)
        self.bernoulli, self.replay, self.accept_seed = s.bernoulli, s.replay, s.accept_seed
        self.slot_trace, self.slot_trace_len = s.slot_trace, s.slot_trace_len
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
        self.pad_rows()
        self.out_tokens = torch.zeros(n, max_draft_len + 1, dtype=torch.long, device=dev)  # [R, K+1]
        self.out_n = torch.zeros(n, dtype=torch.long, device=dev)              # [R]
        self.graph_chains: dict[GraphKey, GraphChain] = {}   # captured decode chains by key (capture.py)
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
        Host bookkeeping only: the device sees the slot from the next launch on (SlotState.flush)."""
        return self.slots.reserve(tokens, key)

    def release(self, slot: int) -> None:
        """Free the slot's blocks (no K/V is copied or cleared). Host bookkeeping only, as reserve."""
        self.slots.release(slot)

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
        self.slots.flush()                  # what reserve / release changed, before anything reads it
        self.slots.set_acceptance(acceptance)
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
        return self.graph_chains.get(GraphKey("decode", bucket, keep_warm=keep_warm))

    def _run(self, key: GraphKey, read: int | None) -> None:
        """A pure-decode key: its graph chain where captured, else its device function eagerly."""
        if self.on_dispatch is not None:
            self.on_dispatch(key)
        graph = self.graph_chains.get(key)
        if graph is not None:
            graph.replay()
            return
        if self.graph_chains:
            self.eager_fallbacks += 1     # a shape the schedule was not expected to reach
        draft_chain.device_fn(self, key, read)

    def _mixed(self, plan: StepPlan, read: int) -> torch.Tensor:
        """A mixed iteration -> the first generated token of each last chunk [n_last]: through a
        whole-forward graph where one holds it (stale rows refreshed first, by the refresh graph),
        else eagerly (eager_mixed.py)."""
        key = self._whole_key(plan)
        if key is None:
            return eager_mixed.eager_mixed(self, plan, read)
        self.whole.stage(key, plan.chunks, plan.keep_warm, plan.slots, plan.row_k)
        if plan.batch_size and plan.k and any(plan.stale):
            self._run(GraphKey("refresh", plan.bucket), None)
        if self.on_dispatch is not None:
            self.on_dispatch(key)
        return self.whole.run(key)[:plan.last_chunks]

    def mixed_inputs(self, plan: StepPlan) -> eager_mixed.MixedInputs:
        """An eager mixed iteration's device inputs (eager_mixed.mixed_inputs)."""
        return eager_mixed.mixed_inputs(self, plan)

    def _whole_key(self, plan: StepPlan):
        """The whole-forward graph key of this mixed iteration, or None (eager): on CUDA a
        captured key only; on CPU any key once capture_whole_graphs ran (uncaptured, tests).
        A plan with chunks whose per-row tokens fall below its row shape's least captured bucket
        (mixed_layout.least_tokens) pads up to that bucket; one without chunks runs the decode graph."""
        if self.whole is None:
            return None
        key = self.whole.key(plan)
        if key is None or self.device.type != "cuda" or key in self.whole.graphs:
            return key
        return self.whole.captured_above(key) if plan.chunks else None

    # ---- the step's device functions (draft_chain.py) ----------------------------------------
    def decode_attention(self):
        """Every step's attention, graphed or eager: RaggedAttention (for decode rows with RoPE
        and the K/V write inside its launch) where Triton runs, else gathered SDPA."""
        return RaggedAttention(self.block_size) if self.triton else sdpa_attention

    def draft_chain(self, B: int, K: int, read: int | None = None) -> torch.Tensor:
        """K-1 chain steps from the carried head -> drafts [B, K] (draft_chain.draft_chain)."""
        return draft_chain.draft_chain(self, B, K, read)

    def accept(self, D, g):
        """(accepted n [B], tokens E [B, K+1]) of drafts D, target greedy g (draft_chain.accept)."""
        return draft_chain.accept(self, D, g)

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

    def pad_rows(self) -> None:
        """Every step row a padding row (token 0 at position 1 of the padding slot): what graph
        warm-ups and captures run on, writing only into the scratch block."""
        self.x.zero_()
        self.pos.fill_(1)
        self.slot.fill_(self.pad_slot)
        self.row_k.fill_(self.max_draft_len)

    # ---- CUDA graphs and warm-ups (capture.py) --------------------------------------------------
    def capture_graphs(self, keys: Iterable[GraphKey]) -> int:
        return capture.capture_graphs(self, keys)

    def capture_decode_graphs(self, keys: Iterable[GraphKey]) -> int:
        return capture.capture_decode_graphs(self, keys)

    def capture_whole_graphs(self, keys: Iterable[GraphKey] = (), exact: Iterable[tuple] = ()) -> int:
        return capture.capture_whole_graphs(self, keys, exact)

    def warm_chunks(self) -> int:
        return capture.warm_chunks(self)

    def warm_mixed(self, keys: Iterable[GraphKey]) -> int:
        return capture.warm_mixed(self, keys)

    @property
    def packs_rows(self) -> bool:
        """Per-row K verifies each row's K_i + 1 tokens (the whole-forward path is set up), else
        every row runs max K_i tokens with its acceptance capped (plan.Engine)."""
        return self.whole is not None

    def drop_whole(self) -> None:
        """Mixed iterations back to the eager path (e.g. after a failed whole-graph capture)."""
        self.whole = None

    def drop_graphs(self) -> None:
        """Forget every captured graph (a graph bakes in what it captured, e.g. the all-reduce mode)."""
        self.graph_chains.clear()
        if self.whole is not None:
            self.whole.drop()


def _use_triton(attention: str, on_cuda: bool) -> bool:
    """The attention a caller asked for: RaggedAttention's Triton kernel (True) or SDPA."""
    if attention not in ATTENTIONS:
        raise DynspecError(f"attention {attention!r}: one of {', '.join(ATTENTIONS)}")
    if attention == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise DynspecError("attention 'triton' on CPU runs under Triton's interpreter only: set TRITON_INTERPRET=1 "
                           "before triton is imported")
    return attention == "triton" or attention == "auto" and on_cuda
