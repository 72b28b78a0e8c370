"""A mixed iteration's target forward as one chain of CUDA graphs per key (Np, B, T, draft): token
bucket Np, row bucket B, T = K+1 tokens a decode row, draft False for a policy that never drafts
(the target alone: no captured layers, no draft pass). See docs/design.md ("One packed forward").

The forward is the target's own (`Target.run`, as a decode step's), over one packed batch whose
attention is one launch a layer of the ragged kernel (ragged.py) for every row: its work items,
positions and K/V write indices sit in static buffers, so the kernel is captured with the rest.

Packed layout of the Np tokens (the real decode rows unpadded, each at its own K_i + 1 tokens):
    [0, n)              decode rows r < b, row r's K_r + 1 tokens (pending + K_r drafts); n = sum(K_r + 1)
    [n, n + L)          the chunks' L tokens, in plan order
    [n + L, Np)         pad: token 0 at position 0 of the padding slot (K/V into the scratch block)
Rows b..B-1 of the row bucket take no tokens: they run the draft chain (on the padding slot) only.
The grid [B, T] (T = max K_r + 1) is the acceptance's view: cell r*T + j is row r's token j; a
staged map takes cells to packed tokens and back, so the layout is data and the graph is keyed
by (Np, B, T, draft) only.
Example b=3 in row bucket 4 at K = (2, 0, 1), T=3, chunks of 5 and 3 tokens, Np=16, ITEM_TOKENS 4:
    packed  a0 a1 a2 | b0 | c0 c1 | x0..x4 | y0 y1 y2 | pad pad          n = 6, L = 8
    cells   row a: 0 1 2, row b: 3, row c: 6 7  (cells 4, 5, 8 and row 3's verify nothing)
    items   (sa, 0, 3) (sb, 3, 1) (sc, 4, 2) (sx, 6, 4) (sx, 10, 1) (sy, 11, 3) (pad, 14, 2), then empty ones

Inputs (the chunks' tokens, positions, K/V write indices and draft inputs, the cell map both
ways, the last-token indices, the work items) are laid out on the host (`stage`) in one pinned
buffer, one copy; the graph merges the decode rows' tokens and positions (the engine's step_in
copy, the draft chain) in through the cell map (`_pack`: one launch of pack_kernel.py on Triton).

The graph holds the whole iteration (at most CHUNKS chunks; more run eagerly). K = 0 keys (T = 1):
the forward, the rows' outputs, then one draft pass over every packed token (the chunks' entries;
the rows' keep-warm entries, into the scratch block unless the plan keeps warm), its outputs at the
last chunks' last tokens; under lazy sync (draft STORE: plan.store_chunks) no draft pass, every
token's capture into the feature store (the draft catches up when its row drafts). K > 0 keys: the
rows' draft chain from their carried heads, the forward, acceptance (row r at most K_r), one draft
pass over every packed token, outputs at each row's accepted index and each last chunk's last
token. Stale rows are refreshed before, by the refresh graph.

On CPU without Triton (tests) the same functions run uncaptured, with gathered SDPA.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from dynspec.runtime.engines.reference.attention import (ITEM_FIELDS, ITEM_TOKENS, RaggedBatch, plan_items, ragged_batch,
                                                         uniform_batch)
from dynspec.runtime.engines.reference.draft_chain import accept, draft_chain
from dynspec.runtime.engines.reference.graphs import capture_chain, chain_cuts, no_cut
from dynspec.runtime.engines.reference.kv_cache import SCRATCH_BLOCK
from dynspec.runtime.engines.reference.mixed_layout import (BUCKETS, STORE, Key, cell_map, item_cap, least_tokens,
                                                            mixed_buckets, store_slots, token_bucket, whole_keys)
from dynspec.runtime.engines.reference.step_state import StepParts

__all__ = ["BUCKETS", "Key", "WholeMixed", "cell_map", "item_cap", "least_tokens", "mixed_buckets", "whole_keys"]


class WholeMixed:
    """stage(key, plan) then run(key) -> a mixed iteration from a graph chain per key once
    `capture` has run (CUDA), else eagerly (CPU, tests)."""

    CHUNKS = 16               # chunks a graph takes: its launches hold work items for that many
    LAST = CHUNKS             # last chunks among them: rows of the head beside the decode rows

    def __init__(self, parts: StepParts, max_num_tokens: int, row_buckets: Sequence[int]):
        self.s = parts
        self.buckets = mixed_buckets(max_num_tokens)
        self.top = top = self.buckets[-1]
        self.max_chunks = self.CHUNKS
        Tm = parts.buffers.max_draft_len + 1
        G = max(row_buckets) * Tm                     # grid cells of the largest row shape
        I = item_cap(top, max(row_buckets), Tm, self.max_chunks)     # items of any key
        dev = parts.device
        self.cuda = cuda = dev.type == "cuda"
        S = self.LAST
        # staged inputs, int64, at packed places: tokens | positions | write index [top each] | draft
        #   inputs [top + 1: the last takes padding's scatter] | cell of each packed token (-1: none) [top] |
        #   packed token of each cell [G] | last token (packed) | its draft-input place | its slot [LAST each]
        #   | keep-warm flag [1] | work items [3 I] | feature-store slot (STORE: chunks' newest cap; else pad) [top]
        split = (top, top, top, top + 1, top, G, S, S, S, 1, ITEM_FIELDS * I, top)
        with torch.inference_mode():
            self.inp = torch.zeros(sum(split), dtype=torch.long, device=dev)
            (self.in_tok, self.in_pos, self.in_write, self.in_nxt, self.in_cell, self.in_cellp, self.in_last,
             self.in_at, self.in_last_slot, self.in_warm, self.in_items, self.in_store) = self.inp.split(split)
            self.tokens = torch.zeros(top, dtype=torch.long, device=dev)             # [Np] the forward's inputs
            self.positions = torch.zeros_like(self.tokens)
            self.write_index = torch.zeros_like(self.tokens)
            self.firsts = torch.zeros(S, dtype=torch.long, device=dev)               # [LAST]
        self._host_inp = torch.zeros(sum(split), dtype=torch.long, pin_memory=cuda)
        self._inp_np = np.split(self._host_inp.numpy(), np.cumsum(split)[:-1])   # views, laid out as self.inp
        self._host_batch: RaggedBatch | None = None                                 # CPU without Triton
        self._free = None                     # CUDA event: the last copy out of the host buffer is done
        self._fns: dict[Key, Callable] = {}
        self.graphs: dict[Key, object] = {}

    def drop(self) -> None:
        """Forget the graphs (they bake in what they captured, e.g. the all-reduce mode)."""
        self.graphs.clear()
        self._fns.clear()

    def bucket(self, n: int) -> int | None:
        """The smallest token bucket >= n, or None above the largest (mixed_layout.token_bucket)."""
        return token_bucket(n, self.buckets)

    def key(self, plan) -> Key | None:
        """The key of a StepPlan: (the token bucket of its tokens, its row bucket, K+1, plan.draft,
        STORE where plan.store_chunks); None above the top token bucket or past CHUNKS chunks.
        Example: b=3 at K=1 in row bucket 4 plus 5 + 3 chunk tokens -> 14 tokens -> (16, 4, 2, True)."""
        n = self.bucket(plan.decode_tokens + plan.prefill_tokens)
        if n is None or len(plan.chunks) > self.CHUNKS:
            return None
        return (n, plan.bucket, plan.k + 1, STORE if plan.store_chunks else plan.draft)

    def route_key(self, plan) -> Key | None:
        """The key `plan` runs under here, or None (eager): on CUDA a captured key only; on CPU any
        key (uncaptured: tests). A plan with chunks whose tokens fall below its row shape's least
        captured bucket (mixed_layout.least_tokens) pads up to that bucket; one without runs the decode graph."""
        key = self.key(plan)
        if key is None or not self.cuda or key in self.graphs:
            return key
        return self.captured_above(key) if plan.chunks else None

    def captured_above(self, key: Key) -> Key | None:
        """The captured key of the smallest token bucket above `key`'s at its row shape, or None."""
        _, B, T, d = key
        return next(((n, B, T, d) for n in self.buckets if n > key[0] and (n, B, T, d) in self.graphs), None)

    # ---- host side ------------------------------------------------------------------------
    def stage(self, key: Key, chunks: Sequence, sync: str, slots: Sequence[int] = (),
              row_k: Sequence[int] = ()) -> None:
        """An iteration of `key`'s inputs, laid out on the host and copied in one transfer: the
        decode rows in `slots` at row_k[r] + 1 tokens each (default T), the chunks' tokens after
        them, every token past them padding (token 0 at position 0 of the padding slot, K/V into
        the scratch block), the cell map and the work items. sync: plan.StepPlan.sync."""
        s, bs, top = self.s, self.s.block_size, self.top
        pad_slot = s.buffers.pad_slot
        Np, B, T, _ = key
        if self._free is not None:
            self._free.synchronize()
        tok, pos, write, nxt, cell, cellp, last, at, last_slot, warm, items, store = self._inp_np
        row_k = tuple(row_k) or (T - 1,) * len(slots)
        cells, packed, n = cell_map(row_k, B, T)
        tok[:], pos[:], write[:] = 0, 0, SCRATCH_BLOCK * bs
        nxt[:], cell[:], last[:], at[:], last_slot[:], store[:] = 0, -1, 0, top, pad_slot, pad_slot
        cell[:n], cellp[:B * T] = cells, packed
        warm[0] = int(sync == "warm")
        i, m = n, 0
        for c in chunks:
            k = len(c.tokens)
            table = s.slots.table(c.slot)
            p = np.arange(c.start, c.start + k)
            tok[i:i + k] = c.tokens
            pos[i:i + k] = p
            write[i:i + k] = np.asarray(table)[p // bs] * bs + p % bs
            nxt[i:i + k - 1] = c.tokens[1:]
            nxt[i + k - 1] = c.next_token or 0                 # a last chunk's: its first generated token (graph)
            if c.last:
                last[m], at[m], last_slot[m] = i + k - 1, i + k - 1, c.slot
                m += 1
            i += k
        store[n:i] = store_slots(chunks, s.features.cap, pad_slot)
        # rows: the decode rows, the chunks, the pad's tail in rows of one work item each
        tail = [(pad_slot, min(ITEM_TOKENS, Np - j)) for j in range(i, Np, ITEM_TOKENS)]
        rows = ([(s, k + 1) for s, k in zip(slots, row_k)] + [(c.slot, len(c.tokens)) for c in chunks] + tail)
        ia = item_cap(Np, B, T, self.max_chunks)
        items[:ITEM_FIELDS * ia] = plan_items([s for s, _ in rows], [k for _, k in rows], pad_to=ia).ravel()
        self.inp.copy_(self._host_inp, non_blocking=True)
        if not s.ragged:                     # gathered SDPA's batch (CPU): decode rows at the host's positions
            starts = list(s.buffers.pos[:len(slots)].tolist()) + [c.start for c in chunks] + [0] * len(tail)
            self._host_batch = ragged_batch(s.slots.block_tables, [r for r, _ in rows], starts, [k for _, k in rows],
                                            bs)
        if self.cuda:
            if self._free is None:
                self._free = torch.cuda.Event()
            self._free.record()

    # ---- the device function --------------------------------------------------------------
    def _fn(self, key: Key) -> Callable:
        if key not in self._fns:
            self._fns[key] = self._make(*key)
        return self._fns[key]

    def _batch(self, Np: int, B: int, T: int) -> RaggedBatch:
        """The whole batch over the static buffers, for the ragged kernel."""
        s = self.s
        ia = item_cap(Np, B, T, self.max_chunks)
        pos, tables = self.positions[:Np], s.slots.block_tables
        return RaggedBatch(pos, self.write_index[:Np], pos[None], s.buffers.slot[:B + 1], tables[:1],
                           s.block_size, items=(self.in_items[:ITEM_FIELDS * ia].view(ITEM_FIELDS, ia),
                                                tables))     # B + 1 rows: what sizes the kernel's splits

    def _make(self, Np: int, B: int, T: int, draft: bool) -> Callable:
        s, t = self.s, self.s.target
        n = B * T                                   # grid cells

        def run(cut: Callable[[int], None]) -> None:
            cell = self.in_cell[:Np]
            dec = cell >= 0                                                              # [Np] decode tokens
            cell = cell.clamp(min=0)
            D = draft_chain(s, B, T - 1) if n and T > 1 else None                         # [B, K]
            self._pack(Np, B, T, D, dec, cell)
            whole = self._batch(Np, B, T) if s.ragged else self._device_rows(Np)
            logit_index = torch.cat([self.in_cellp[:n], self.in_last])                   # [B*T + LAST]
            t.layer_hook = cut
            try:
                g, H = t.run(self.tokens[:Np], whole, capture=s.capture if draft else (), logit_index=logit_index,
                             attention=s.attention, greedy=True)                          # [B*T + LAST], [Np, w]
            finally:
                t.layer_hook = None
            self.firsts.copy_(g[n:])
            if T == 1:
                if n:
                    s.buffers.out_tokens[:B, 0] = g[:n]
                    s.buffers.out_n[:B] = 0
                if draft == STORE:
                    self._store(H, B, Np)
                elif draft:
                    self._finish(g, H, B, Np, dec, cell, whole)
            else:
                self._verify(g, H, D, B, T, Np, dec, cell, whole)

        return run

    def _pack(self, Np: int, B: int, T: int, D: Tensor | None, dec: Tensor, cell: Tensor) -> None:
        """The forward's tokens, positions and K/V write indices [Np]: the decode rows' (pending
        token, then drafts D [B, T-1], from the rows' positions and tables) at their cells, the
        staged ones elsewhere. One launch where the attention is the Triton kernel (pack_kernel.py)."""
        s, buf = self.s, self.s.buffers
        out = (self.tokens[:Np], self.positions[:Np], self.write_index[:Np])
        staged = (self.in_tok[:Np], self.in_pos[:Np], self.in_write[:Np])
        tables = s.slots.block_tables
        if s.ragged:
            from dynspec.runtime.engines.reference.pack_kernel import pack_inputs   # Triton: imported where it runs

            return pack_inputs(self.in_cell[:Np], buf.x[:B], D, buf.pos[:B], buf.slot[:B], tables, s.block_size,
                               staged, out)
        if not B * T:
            for o, st in zip(out, staged):
                o.copy_(st)
            return
        vpos = buf.pos[:B, None] + torch.arange(T, device=s.device)                         # [B, T]
        grid = uniform_batch(tables, buf.slot[:B], vpos, s.max_blocks_per_seq, s.block_size)
        toks = buf.x[:B] if D is None else torch.cat([buf.x[:B, None], D], 1).reshape(-1)  # [B*T]
        for o, src, st in zip(out, (toks, grid.positions, grid.write_index), staged):
            o.copy_(torch.where(dec, src[cell], st))

    def _device_rows(self, Np: int) -> RaggedBatch:
        """CPU (SDPA): the host-built batch with the decode tokens' positions and K/V write
        indices from the device buffers (the overlapped loop's carried rows get theirs there)."""
        b = self._host_batch
        rows = (self.in_cell[:Np] >= 0).nonzero().squeeze(1)                     # [n] decode tokens
        positions, write = b.positions.clone(), b.write_index.clone()
        positions[rows], write[rows] = self.positions[rows], self.write_index[rows]
        q_pos = b.q_pos.clone()
        q_pos.view(-1)[b.out_index[rows]] = self.positions[rows]
        return RaggedBatch(positions, write, q_pos, b.slots, b.tables, b.block_size, b.ragged, b.items)

    def _verify(self, g: Tensor, H: Tensor, D: Tensor, B: int, T: int, Np: int, dec: Tensor, cell: Tensor,
                whole: RaggedBatch) -> None:
        """A K > 0 iteration's end, as the decode graphs' spec step does it: acceptance over the B
        rows' grid (row r at most K_r: engine.accept), then one draft pass over every packed token
        (the rows' catch-up entries (E_i, H_i) and the chunks' entries (x_{p+1}, h_p)), its head at
        each row's accepted cell and at each last chunk's last token. g [B*T + LAST], H [Np, w].
        Example the module docstring's rows, accepted (1, 0, 1), a last chunk ending at 10: heads [1, 3, 5, 10]."""
        s, buf, n = self.s, self.s.buffers, B * T
        self.in_nxt.index_copy_(0, self.in_at, g[n:])       # a last chunk's x_e is its first generated token
        acc, E = accept(s, D, g[:n].view(B, T))                                            # [B], [B, T]
        buf.out_tokens[:B, :T] = E
        buf.out_n[:B] = acc
        tokens = torch.where(dec, E.reshape(-1)[cell], self.in_nxt[:Np])                  # [Np]
        first = self.in_cellp[torch.arange(B, device=s.device) * T]                          # [B] cells of x_L
        s.features.write(buf.slot[:B], buf.pos[:B], H[first])                            # h_L (lazy sync)
        heads = torch.cat([self.in_cellp[torch.arange(B, device=s.device) * T + acc], self.in_last])   # [B + LAST]
        slot = torch.cat([buf.slot[:B], self.in_last_slot])
        d, dh = s.draft.run(tokens, H[:Np], whole, s.attention, greedy=True, rows=heads)
        s.heads.set_heads(slot, s.draft.to_target_ids(d), dh, H[heads])

    def _rows_captured(self, H: Tensor, B: int) -> None:
        """K = 0: each decode row's capture h_L carried (for a refresh) and into the feature store."""
        if B:
            h, buf = H[self.in_cellp[:B]], self.s.buffers
            self.s.heads.set_heads(buf.slot[:B], capture=h)
            self.s.features.write(buf.slot[:B], buf.pos[:B], h)

    def _store(self, H: Tensor, B: int, Np: int) -> None:
        """A lazy K = 0 iteration's end (STORE): no draft work; the rows' captures as _finish's, each chunk
        token's h_p stored at (its slot, p), each last chunk's carried for the refresh of its head."""
        s = self.s
        self._rows_captured(H, B)
        s.features.write(self.in_store[:Np], self.positions[:Np], H[:Np])
        s.heads.set_heads(self.in_last_slot, capture=H[self.in_last])

    def _finish(self, g: Tensor, H: Tensor, B: int, Np: int, dec: Tensor, cell: Tensor, whole: RaggedBatch) -> None:
        """A K = 0 iteration's end: the rows' captures, then one draft pass over the rows' keep-warm entries
        (g_r, h_r) (K/V to scratch unless kept warm) and the chunks' (x_{p+1}, h_p), heads at last chunks."""
        s = self.s
        self._rows_captured(H, B)
        self.in_nxt.index_copy_(0, self.in_at, g[B:])      # a last chunk's x_e is its first generated token
        tokens = torch.where(dec, g[:B][cell], self.in_nxt[:Np]) if B else self.in_nxt[:Np]     # [Np]
        scratch = torch.full_like(whole.write_index, SCRATCH_BLOCK * s.block_size)
        write = torch.where(dec & (self.in_warm == 0), scratch, whole.write_index)
        batch = RaggedBatch(whole.positions, write, whole.q_pos, whole.slots, whole.tables, whole.block_size,
                            whole.ragged, whole.items)
        d, dh = s.draft.run(tokens, H[:Np], batch, s.attention, greedy=True, rows=self.in_last)   # [LAST]
        s.heads.set_heads(self.in_last_slot, s.draft.to_target_ids(d), dh, H[self.in_last])

    # ---- graphs ---------------------------------------------------------------------------
    def capture(self, keys: Iterable[Key]) -> int:
        """Warm up and capture each key's forward as a graph chain (one pool). CUDA only; call with
        the engine's step buffers on the padding rows (capture.capture_whole_graphs leaves them so)."""
        keys = [k for k in sorted(set(keys)) if k not in self.graphs]
        if not keys:
            return 0
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        cuts = chain_cuts(len(self.s.target.layers))
        with torch.inference_mode():
            self._idle()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for key in keys:
                    self._idle(key)
                    self._fn(key)(no_cut)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for key in keys:
                self._idle(key)
                self.graphs[key] = capture_chain(self._fn(key), cuts, pool, stream)
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        return len(keys)

    def _idle(self, key: Key | None = None) -> None:
        """Buffers that make a warm-up or capture of `key` harmless: pad tokens, writes into the scratch
        block (padding slot, no keep-warm), the key's work items (its rows and the pad's, padding slot)."""
        self.tokens.zero_()
        self.positions.zero_()
        self.write_index.fill_(SCRATCH_BLOCK * self.s.block_size)
        self.stage(key or (self.top, 0, 1, True), (), "off")     # no rows, no chunks: every input padding

    def run(self, key: Key) -> Tensor:
        """One whole iteration of `key` after `stage` (its rows' pending tokens, positions and slots in the
        engine's x / pos / slot, padding rows past them; stale rows refreshed before): its outputs in
        out_tokens / out_n and the carried state; each last chunk's first generated token, self.firsts [LAST]."""
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
        else:
            self._fn(key)(no_cut)
        return self.firsts
