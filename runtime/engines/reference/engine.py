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
    pure decode   the (bucket, K) graph chain once session.capture ran (CUDA), else eager
                  (draft_chain.py; keys: graph_keys.py; capture: capture.py)
    mixed         the whole-forward graph of (Np, B, T, draft) (mixed_graphs.py: draft chain,
                  forward, acceptance and the draft's pass, all in it), else eager (eager_mixed.py),
                  as above the top token bucket or past WholeMixed.CHUNKS chunks
    per-row K     (plan.row_k) the whole-forward graph with every row at its own K_i + 1 tokens
                  where whole graphs are set up, else the paths above with acceptance capped
    attention     CUDA: every packed row, decode rows and prompt chunks alike, through one launch
                  of ragged.RaggedAttention's kernel; CPU: SDPA
`route(plan)` picks the path of a step, once (graph_keys.Route). The caller picks the attention
(`attention`), once, at construction: "auto" (the Triton kernel on CUDA, SDPA elsewhere),
"triton" (on CPU under Triton's interpreter, TRITON_INTERPRET=1: tests) or "sdpa".
The step's state is typed (step_state.py): StepBuffers, CarriedHeads, and the StepParts every
device function takes; no other module reads the engine.
"""
from __future__ import annotations

from typing import Iterable

import torch

from dynspec.config import GraphMode
from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import AcceptanceModel
from dynspec.runtime.engines.reference import capture, draft_chain, eager_mixed, lazy_sync
from dynspec.runtime.engines.reference.carry import ResultReader, StepHandle, gather_carried, last_chunk_rows, save_carried
from dynspec.runtime.engines.reference.graph_keys import GraphKey, Route, capture_order, reachable_graphs
from dynspec.runtime.engines.reference.graphs import CaptureCost, GraphChain
from dynspec.runtime.engines.reference.kv_cache import BlockAllocator, available_bytes, check_pool_fits, kv_pool_bytes
from dynspec.runtime.engines.reference.mixed_graphs import WholeMixed
from dynspec.runtime.engines.reference.mixed_layout import forward_tokens
from dynspec.runtime.engines.reference.ragged import ATTENTIONS, RaggedAttention, choose_attention
from dynspec.runtime.engines.reference.slot_state import SlotState
from dynspec.runtime.engines.reference.step_state import CarriedHeads, FeatureStore, StepBuffers, StepParts
from dynspec.runtime.serving.plan import StepPlan, StepResult, batch_buckets

__all__ = ["ATTENTIONS", "DRAFT_SYNC_CAP", "GraphKey", "ReferenceEngine", "capture_order", "reachable_graphs"]

DRAFT_SYNC_CAP = 256      # tokens of target captures kept per slot for lazy draft sync (FeatureStore)


def _flushed(name: str) -> property:
    """Read access to one of the device tensors of the slot state, flushed first (SlotState.flush),
    so a reader outside launch (a test, a warm-up) sees what reserve / release left. Writes go
    into the tensor returned, in place."""
    return property(lambda self: getattr(self.slots.flushed(), name))


def _of(part: str, name: str) -> property:
    """Read access to a tensor of the step's buffers or heads (written in place, never rebound)."""
    return property(lambda self: getattr(getattr(self, part), name))


class ReferenceEngine:
    """Executor-facing engine: reserve(tokens) / release(slot) a sequence's cache, step(plan)."""

    # the slot state on the device (slot_state.py)
    block_tables = _flushed("block_tables")      # [slots+1, max_blocks] block ids, scratch past a table
    block_owner = _flushed("block_owner")        # [blocks] slot or -1
    block_logical = _flushed("block_logical")    # [blocks] index in its owner's table
    slot_key = _flushed("slot_key")              # [S] request key (reserve)
    slot_p = _flushed("slot_p")                  # [S] Bernoulli p of the slot's request
    accept_seed = _flushed("accept_seed")        # [] Bernoulli seed
    # the step buffers and carried heads (step_state.py), for readers outside the step
    x, pos, slot = _of("buffers", "x"), _of("buffers", "pos"), _of("buffers", "slot")
    next_draft, draft_hidden = _of("heads", "next_draft"), _of("heads", "draft_hidden")
    last_capture = _of("heads", "last_capture")

    def __init__(self, target, draft, *, max_batch_size: int, max_seq_len: int, max_draft_len: int,
                 max_num_tokens: int = 8192, block_size: int | None = None, num_blocks: int | None = None,
                 attention: str = "auto", graphs: GraphMode = GraphMode.FULL, draft_sync_cap: int = DRAFT_SYNC_CAP):
        if max_num_tokens < max_draft_len + 1:
            raise DynspecError(f"max_num_tokens={max_num_tokens} is smaller than one verify window "
                               f"(max_draft_len {max_draft_len} + 1 = {max_draft_len + 1})")
        self.target, self.draft = target, draft
        self.max_batch_size, self.max_seq_len, self.max_draft_len = max_batch_size, max_seq_len, max_draft_len
        self.max_num_tokens = max_num_tokens
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.on_cuda = on_cuda = self.device.type == "cuda"      # the one device check (graphs, pinned copies)
        bs = block_size or (128 if on_cuda else 16)
        per_seq = -(-max_seq_len // bs)
        n_blocks = num_blocks or 1 + max_batch_size * per_seq
        fused = len(draft.capture_layers) * target.config.hidden_size
        n = max_batch_size + 1                          # slot max_batch_size: padding rows (scratch block)
        self.draft_sync_cap = draft_sync_cap            # lazy sync: the store's tokens a slot (0: none)
        self.kv_bytes = kv_pool_bytes(target.config, draft.config, n_blocks, bs, p.element_size())
        store = n * max(draft_sync_cap, 1) * fused * p.element_size()          # the FeatureStore, beside the pool
        check_pool_fits(self.kv_bytes, available_bytes(self.device) - store, device=self.device,
                        max_batch_size=max_batch_size, max_seq_len=max_seq_len)   # before any table is built
        # CPU: every batch size is its own shape (no padding work); CUDA: padded graph buckets
        self.buckets = batch_buckets(max_batch_size) if on_cuda else tuple(range(1, max_batch_size + 1))
        self.async_launch = on_cuda        # launch returns before the device has run the step (runtime/serving/loop.py)
        self.capture = tuple(draft.capture_layers)
        draft.kernels = target.kernels                         # the draft's glue on the target's Kernels
        self.vocab_size = target.config.vocab_size
        self.attention = choose_attention(attention, on_cuda, bs)   # RaggedAttention, else SdpaAttention
        self.triton = isinstance(self.attention, RaggedAttention)
        self.graph_mode = GraphMode(graphs)    # FULL: steps replay what session.capture captured (CUDA)
        self.blocks = BlockAllocator(n_blocks, bs, per_seq, max_batch_size)
        self.block_size, self.max_blocks_per_seq = bs, per_seq
        target.setup_pool(n_blocks, bs, per_seq * bs)
        draft.setup_pool(n_blocks, bs, per_seq * bs)
        dev = p.device
        self.pad_slot = max_batch_size
        self.slots = SlotState(self.blocks, n, n_blocks, per_seq, dev)
        self.heads = CarriedHeads.allocate(n, draft.config.hidden_size, fused, p.dtype, dev)
        self.features = FeatureStore.allocate(n, draft_sync_cap, fused, p.dtype, dev)    # [S, cap, w]
        self.buffers = StepBuffers.allocate(n, max_draft_len, dev)
        self._host_np = self.buffers.host_in.numpy()         # [7, R], shares its memory
        self.results = ResultReader(self.device, n * (max_draft_len + 3))
        self._host_in_free = None                 # CUDA event: the last copy out of host_in is done
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
        b, K = plan.batch_size, plan.k
        start = self.results.mark()
        self.slots.flush()                  # what reserve / release changed, before anything reads it
        self.slots.set_acceptance(acceptance)
        buf, s = self.buffers, self.parts()
        if b or plan.carry:
            self._load_rows(plan)
        if plan.carried_rows:
            gather_carried(buf, b)
        read = -(-(plan.max_position + 1) // self.block_size)     # blocks this step reads (eager)
        lazy_sync.catch_up(s, plan.catch_up)     # lazy sync: rows resuming K, before any draft work
        route, keys = self.route(plan)
        if route is Route.WHOLE_GRAPH:
            firsts = self._whole(s, plan, keys[0])
        elif route is Route.WHOLE_EAGER:
            firsts = eager_mixed.eager_mixed(s, plan, read)
        else:
            firsts = buf.out_n[:0]
            for key in keys:
                self._run(s, key, read, route)
        if plan.carry:
            save_carried(plan, buf, firsts)
        # the result: [b accepted | b x (K+1) tokens | first tokens of last chunks]
        out = torch.cat([buf.out_n[:b], buf.out_tokens[:b, : K + 1].reshape(-1), firsts])
        return self.results.stage(plan, out, start)

    def route(self, plan: StepPlan) -> tuple[Route, tuple]:
        """The one path of this step and its keys (graph_keys.Route):
            WHOLE_GRAPH  (whole key,)    chunks, or per-row K, that a whole-forward graph takes
                                         (mixed_graphs.WholeMixed.route_key; CPU: its function)
            WHOLE_EAGER  ()              other chunks (eager_mixed.py)
            DECODE_GRAPH / DECODE_EAGER  (refresh?, spec) or (decode,) GraphKeys: graphs where
                                         decode graphs were captured (GraphMode.FULL), else eager
        Example: 3 rows at K=2, one stale, no chunks, graphs captured -> (DECODE_GRAPH,
        (GraphKey("refresh", 4), GraphKey("spec", 4, 2)))."""
        B, K = plan.bucket, plan.k
        if (plan.chunks or plan.per_row) and self.whole is not None:
            key = self.whole.route_key(plan)
            if key is not None:
                return Route.WHOLE_GRAPH, (key,)
        if plan.chunks:
            return Route.WHOLE_EAGER, ()
        if K == 0:
            keys = (GraphKey("decode", B, sync=plan.sync),)
        else:
            keys = ((GraphKey("refresh", B),) if any(plan.stale) else ()) + (GraphKey("spec", B, K),)
        return self._decode_route(), keys

    def _decode_route(self) -> Route:
        return Route.DECODE_GRAPH if self.graph_mode is GraphMode.FULL and self.graph_chains else Route.DECODE_EAGER

    def parts(self) -> StepParts:
        """What this step's device functions take (step_state.StepParts)."""
        return StepParts(self.target, self.draft, self.buffers, self.heads, self.slots, self.decode_attention(),
                         self.triton, self.capture, self.block_size, self.max_blocks_per_seq, self.features)

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
        self.buffers.step_in.copy_(self.buffers.host_in, non_blocking=True)
        if self.on_cuda:
            if self._host_in_free is None:
                self._host_in_free = torch.cuda.Event()
            self._host_in_free.record()

    def _run(self, s: StepParts, key: GraphKey, read: int | None, route: Route) -> None:
        """A pure-decode key: DECODE_GRAPH replays its graph chain (a key not captured: eagerly,
        counted in eager_fallbacks); DECODE_EAGER runs its device function."""
        if self.on_dispatch is not None:
            self.on_dispatch(key)
        graph = self.graph_chains.get(key) if route is Route.DECODE_GRAPH else None
        if graph is not None:
            graph.replay()
            return
        if route is Route.DECODE_GRAPH:
            self.eager_fallbacks += 1     # a shape the schedule was not expected to reach
        draft_chain.device_fn(s, key, read)

    def _whole(self, s: StepParts, plan: StepPlan, key) -> torch.Tensor:
        """A whole-forward iteration of `key` -> the first generated token of each last chunk
        [n_last] (stale rows refreshed first, by the refresh graph)."""
        self.whole.stage(key, plan.chunks, plan.sync, plan.slots, plan.row_k)
        if plan.batch_size and plan.k and any(plan.stale):
            self._run(s, GraphKey("refresh", plan.bucket), None, self._decode_route())
        if self.on_dispatch is not None:
            self.on_dispatch(key)
        return self.whole.run(key)[:plan.last_chunks]

    def decode_attention(self):
        """Every step's attention, chosen at construction: RaggedAttention (for decode rows with
        RoPE and the K/V write inside its launch) where Triton runs, else gathered SDPA."""
        return self.attention

    def accept(self, D, g):
        """(accepted n [B], tokens E [B, K+1]) of drafts D, target greedy g (draft_chain.accept), on
        the slot state as reserve / release left it (flushed first)."""
        self.slots.flush()
        return draft_chain.accept(self.parts(), D, g)

    def forward_tokens(self, decode_rows: int, k: int, prefill_tokens: int, verify_tokens: int | None = None) -> int:
        """Tokens the target forward of an iteration runs, padding included (mixed_layout.forward_tokens)."""
        return forward_tokens(decode_rows, k, prefill_tokens, verify_tokens, self.buckets,
                              self.whole.buckets if self.whole is not None else (), self.packs_rows_alone)

    # ---- CUDA graphs and warm-ups (capture.py; the sequence: session.capture) -----------------
    def capture_decode_graphs(self, keys: Iterable[GraphKey]) -> int:
        """One graph chain per pure-decode key (CUDA under GraphMode.FULL; 0 elsewhere)."""
        if not self.on_cuda or self.graph_mode is not GraphMode.FULL:
            return 0
        n, cost = capture.capture_decode_graphs(self.parts(), self.graph_chains, keys)
        self.capture_costs["decode"] = self.capture_costs.get("decode", CaptureCost()) + cost
        return n

    def capture_whole_graphs(self, keys: Iterable[GraphKey] = (), exact: Iterable[tuple] = ()) -> int:
        """The whole-forward graphs (capture.capture_whole_graphs), then on CUDA mixed iterations
        at every speculative row shape of `keys` (warm_mixed). Returns how many graphs.
        CPU: WholeMixed is set up and its functions run uncaptured (tests check them there). CUDA with
        SDPA attention (attention="sdpa"): none; its batches are built on the host each step, so
        those iterations run eagerly."""
        cuda, keys = self.on_cuda, tuple(keys)
        if cuda and not self.triton or self.graph_mode is not GraphMode.FULL:
            return 0
        if self.whole is None:
            self.whole = WholeMixed(self.parts(), self.max_num_tokens, self.buckets)
        if not cuda:
            return 0
        n, cost = capture.capture_whole_graphs(self.parts(), self.whole, self.buckets, keys, exact)
        self.capture_costs["whole"] = self.capture_costs.get("whole", CaptureCost()) + cost
        self.warm_mixed(keys)
        return n

    def warm_chunks(self) -> int:
        """The eager chunk path compiled before serving (capture.warm_chunks). Returns the steps run."""
        n = capture.warm_chunks(self.step, self.pad_slot, self.max_seq_len, self.max_num_tokens)
        self.warm_chunk_steps += n
        return n

    def warm_mixed(self, keys: Iterable[GraphKey]) -> int:
        """Mixed iterations at every speculative row shape of `keys` (capture.warm_mixed)."""
        n = capture.warm_mixed(self.step, keys, self.pad_slot, self.buckets, self.max_seq_len, self.max_num_tokens)
        self.warm_chunk_steps += n
        return n

    @property
    def packs_rows(self) -> bool:
        """Per-row K verifies each row's K_i + 1 tokens (the whole-forward path is set up), else
        every row runs max K_i tokens with its acceptance capped (plan.Engine)."""
        return self.whole is not None

    @property
    def packs_rows_alone(self) -> bool:
        """packs_rows in a step without a prompt chunk too: on CPU (any whole key runs eagerly), not
        on CUDA, where such a vector's tokens fall below its row shape's captured buckets and it runs
        the decode graph at max K_i (mixed_graphs.WholeMixed.route_key)."""
        return self.whole is not None and not self.whole.cuda

    def drop_whole(self) -> None:
        """Mixed iterations back to the eager path (e.g. after a failed whole-graph capture)."""
        self.whole = None

    def drop_graphs(self) -> None:
        """Forget every captured graph (a graph bakes in what it captured, e.g. the all-reduce mode)."""
        self.graph_chains.clear()
        if self.whole is not None:
            self.whole.drop()
