"""A mixed iteration's target forward as one chain of CUDA graphs per key (Np, B, T, draft): token
bucket Np, row bucket B, T = K+1 tokens a decode row, draft False for a policy that never drafts
(the target alone: no captured layers, no draft pass). See docs/design.md ("One packed forward").

The forward is the target's own (`Target.run`, as a decode step's), over one packed batch whose
attention is one launch a layer of the ragged kernel (ragged.py) for every row: its work items,
positions and K/V write indices sit in static buffers, so the kernel is captured with the rest.

Packed layout of the Np tokens (the engine's eager mixed path packs the same way):
    [0, B*T)            decode rows, row r's T tokens (pending + K drafts); rows b..B-1 pad
    [B*T, B*T + L)      the chunks' L tokens, in plan order
    [B*T + L, Np)       pad: token 0 at position 0 of the padding slot (K/V into the scratch block)
Example b=3, B=4, T=2, chunks of 5 and 3 tokens, Np=16, ITEM_TOKENS 4: decode 0..7 (6 and 7 pad),
chunks 8..15; items (s0, 0, 2) (s1, 2, 2) (s2, 4, 2) (pad, 6, 2) (c0, 8, 4) (c0, 12, 1) (c1, 13, 3),
then empty ones up to item_cap(16, 4, 2, max_chunks).

Inputs: the chunks' tokens, positions, K/V write indices, draft inputs, last-token indices and
the work items of the whole batch and of the chunks alone are laid out on the host (`stage`,
numpy) in one pinned buffer and reach the device in one copy; the graph copies them on into the
forward's buffers. The decode rows' tokens and positions come from the engine's step_in copy.

The graph holds the whole iteration (at most CHUNKS chunks; `key` refuses more: those
iterations run eagerly). K = 0 keys (T = 1): the forward, the decode rows' outputs and keep-warm
K/V (written to the scratch block when the plan does not keep warm: one graph serves both), and
the draft's pass over the chunks with its outputs at the last tokens only. K > 0 keys: the
draft chain of the decode rows first (their K drafts from the carried heads), the forward,
acceptance, and one draft pass over every packed token, its outputs at each row's accepted
index and each last chunk's last token. Stale rows are refreshed before, by the refresh graph.

On CPU without Triton (tests) the same functions run uncaptured with gathered SDPA over a batch
built on the host.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from .attention import RaggedBatch, ragged_batch, uniform_batch
from .carry import with_device_rows
from .graphs import capture_chain, chain_cuts, no_cut
from .kv_cache import SCRATCH_BLOCK
from .ragged import ITEM_FIELDS, ITEM_TOKENS, plan_items

Key = tuple[int, int, int, bool]       # (Np, B, T, draft)

# Token buckets up to 1024 (above that a forward is GEMM-bound and the launches a graph saves are
# a small share of it), 16 apart up to 128, 32 up to 512, 64 up to 1024: at most a gap of 1/5 past
# 128 tokens (129 -> 160), so a step pads about a tenth or less. A whole graph costs ~35 ms to
# capture (H200, 8B pair) and shares one memory pool with the rest.
BUCKETS = tuple(range(16, 129, 16)) + tuple(range(160, 513, 32)) + tuple(range(576, 1025, 64))


def mixed_buckets(max_num_tokens: int, top: int = BUCKETS[-1]) -> tuple[int, ...]:
    """The buckets up to min(max_num_tokens, top), that bound included: 72 -> (16, 32, 48, 64, 72)."""
    cap = min(max_num_tokens, top)
    return tuple(b for b in BUCKETS if b < cap) + (cap,)


def whole_keys(rows: Iterable[tuple[int, int, bool]], token_buckets: Iterable[int]) -> tuple[Key, ...]:
    """Every (Np, B, T, draft) with room for at least one chunk token, for each row shape (B, T,
    draft) and chunk-only iterations (0, 1, draft).
    ((1, 2, True),), buckets (16, 32) -> (16,0,1,T) (16,1,2,T) (32,0,1,T) (32,1,2,T)."""
    shapes = set(rows) | {(0, 1, d) for _, _, d in rows}
    return tuple(sorted((n, B, T, d) for B, T, d in shapes for n in token_buckets if n > B * T))


def item_cap(Np: int, B: int, T: int, max_chunks: int) -> int:
    """Pure. Work items a key's launch holds: each decode row's, the chunks' L = Np - B*T tokens
    cut at most once more per chunk (at most min(L, max_chunks) chunks), and the pad's tail.
    item_cap(16, 4, 2, 8) = 4 + 2 + 8 + 1 = 15 (ITEM_TOKENS 4)."""
    L = Np - B * T
    return B * -(-T // ITEM_TOKENS) + -(-L // ITEM_TOKENS) + min(L, max_chunks) + 1


class WholeMixed:
    """stage(key, plan) then run(key, b, drafts) -> a mixed iteration from a graph chain per key
    once `capture` has run (CUDA), else eagerly (CPU, tests)."""

    CHUNKS = 16               # chunks a graph takes: its launches hold work items for that many
    LAST = CHUNKS             # last chunks among them: rows of the head beside the decode rows

    def __init__(self, engine):
        e, t = engine, engine.target
        self.e = e
        self.buckets = mixed_buckets(e.max_num_tokens)
        self.top = top = self.buckets[-1]
        self.max_chunks = self.CHUNKS
        I = 2 * top + 1                   # items of any key: item_cap <= B*T + 2 L + 1 <= 2 Np + 1
        dev, cuda = e.device, e.device.type == "cuda"
        S = self.LAST
        # staged inputs, int64: tokens | positions | write index [top each] | draft inputs [top + 1:
        # the last is where padding's scatter lands] | last token (chunk-local) | its place in the
        # draft inputs | its slot [LAST each] | keep-warm flag [1] | items of the whole batch and
        # of the chunks alone [4 I each, laid out [4, I_key] from the start]
        split = (top, top, top, top + 1, S, S, S, 1, ITEM_FIELDS * I, ITEM_FIELDS * I)
        with torch.inference_mode():
            self.inp = torch.zeros(sum(split), dtype=torch.long, device=dev)
            (self.in_tok, self.in_pos, self.in_write, self.in_nxt, self.in_last, self.in_at, self.in_last_slot,
             self.in_warm, self.in_items, self.in_citems) = self.inp.split(split)
            self.tokens = torch.zeros(top, dtype=torch.long, device=dev)             # [Np] the forward's inputs
            self.positions = torch.zeros_like(self.tokens)
            self.write_index = torch.zeros_like(self.tokens)
            self.firsts = torch.zeros(S, dtype=torch.long, device=dev)               # [LAST]
        self._host_inp = torch.zeros(sum(split), dtype=torch.long, pin_memory=cuda)
        self._inp_np = np.split(self._host_inp.numpy(), np.cumsum(split)[:-1])   # views, laid out as self.inp
        self._host_batches: tuple[RaggedBatch, RaggedBatch] | None = None          # CPU without Triton
        self._free = None                     # CUDA event: the last copy out of the host buffer is done
        self._fns: dict[Key, Callable] = {}
        self.graphs: dict[Key, object] = {}

    def drop(self) -> None:
        """Forget the graphs (they bake in what they captured, e.g. the all-reduce mode)."""
        self.graphs.clear()
        self._fns.clear()

    def bucket(self, n: int) -> int | None:
        """The smallest token bucket >= n, or None above the largest."""
        return next((b for b in self.buckets if b >= n), None)

    def key(self, plan) -> Key | None:
        """The key of a mixed StepPlan: (the token bucket of its padded tokens, its row bucket,
        K+1, plan.draft); None above the top token bucket or past CHUNKS chunks.
        Example: b=3 at K=1 in row bucket 4 plus 5 + 3 chunk tokens -> 16 tokens -> (16, 4, 2, True)."""
        n = self.bucket(plan.padded_decode_tokens + plan.prefill_tokens)
        if n is None or len(plan.chunks) > self.CHUNKS:
            return None
        return (n, plan.bucket, plan.k + 1, plan.draft)

    # ---- host side ------------------------------------------------------------------------
    def stage(self, key: Key, chunks: Sequence, keep_warm: bool, slots: Sequence[int] = ()) -> None:
        """An iteration of `key`'s inputs, laid out on the host and copied in one transfer: the
        chunks' tokens from packed index B*T on, every token past them padding (token 0 at position
        0 of the padding slot, K/V into the scratch block), and the work items of decode rows in
        `slots` (rows past them on the padding slot), the chunks and the pad."""
        e, bs, top = self.e, self.e.block_size, self.top
        Np, B, T, _ = key
        n, L = B * T, Np - B * T
        if self._free is not None:
            self._free.synchronize()
        tok, pos, write, nxt, last, at, last_slot, warm, items, citems = self._inp_np
        tok[:], pos[:], write[:] = 0, 0, SCRATCH_BLOCK * bs
        nxt[:], last[:], at[:], last_slot[:] = 0, 0, top, e.pad_slot
        warm[0] = int(keep_warm)
        i, m = 0, 0
        for c in chunks:
            k = len(c.tokens)
            table = e._table(c.slot)
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
        # the pad's tail: rows of one work item each (its tokens at 0.. on CPU, all at 0 staged)
        rows = [(c.slot, len(c.tokens)) for c in chunks] + [(e.pad_slot, min(ITEM_TOKENS, L - j))
                                                            for j in range(i, L, ITEM_TOKENS)]
        row_slots = list(slots) + [e.pad_slot] * (B - len(slots))
        ia, ic = item_cap(Np, B, T, self.max_chunks), item_cap(L, 0, 1, self.max_chunks)
        items[:ITEM_FIELDS * ia] = plan_items(row_slots + [s for s, _ in rows], [T] * B + [k for _, k in rows], pad_to=ia).ravel()
        citems[:ITEM_FIELDS * ic] = plan_items([s for s, _ in rows], [k for _, k in rows], pad_to=ic).ravel()
        self.inp.copy_(self._host_inp, non_blocking=True)
        if not e.triton:                     # gathered SDPA's batches (CPU): decode rows at the host's positions
            starts = list(e.pos[:B].tolist()) + [c.start for c in chunks] + [0] * (len(rows) - len(chunks))
            lens = [T] * B + [k for _, k in rows]
            c_rows = [(s, st, k) for (s, k), st in zip(rows, starts[B:])]
            whole = ragged_batch(e.block_tables, row_slots + [s for s, _ in rows], starts, lens, bs)
            self._host_batches = whole, ragged_batch(e.block_tables, *map(list, zip(*c_rows)), bs)
        if e.device.type == "cuda":
            if self._free is None:
                self._free = torch.cuda.Event()
            self._free.record()

    # ---- the device function --------------------------------------------------------------
    def _fn(self, key: Key) -> Callable:
        if key not in self._fns:
            self._fns[key] = self._make(*key)
        return self._fns[key]

    def _batches(self, Np: int, B: int, T: int) -> tuple[RaggedBatch, RaggedBatch]:
        """(the whole batch, the chunks' alone) over the static buffers, for the ragged kernel."""
        e, n = self.e, B * T
        ia, ic = item_cap(Np, B, T, self.max_chunks), item_cap(Np - n, 0, 1, self.max_chunks)

        def batch(lo: int, items: Tensor) -> RaggedBatch:
            pos = self.positions[lo:Np]
            return RaggedBatch(pos, self.write_index[lo:Np], pos[None], e.slot[:rows], e.block_tables[:1],
                               e.block_size, items=(items, e.block_tables))

        rows = B + 1                      # the decode rows and a chunk: what sizes the kernel's splits
        F = ITEM_FIELDS
        return batch(0, self.in_items[:F * ia].view(F, ia)), batch(n, self.in_citems[:F * ic].view(F, ic))

    def _make(self, Np: int, B: int, T: int, draft: bool) -> Callable:
        e, t, bs, S = self.e, self.e.target, self.e.block_size, self.LAST
        n, L = B * T, Np - B * T
        rows = torch.arange(n, device=e.device)

        def run(cut: Callable[[int], None]) -> None:
            logit_index = torch.cat([rows, n + self.in_last])                              # [n + LAST]
            dec = D = None
            if n:
                vpos = e.pos[:B, None] + torch.arange(T, device=e.device)                   # [B, T]
                dec = uniform_batch(e.block_tables, e.slot[:B], vpos, e.max_blocks_per_seq, bs)
                if T > 1:                                                                # pending tokens, then drafts
                    D = e.draft_chain(B, T - 1)                                          # [B, K]
                    self.tokens[:n].copy_(torch.cat([e.x[:B, None], D], 1).reshape(-1))
                else:
                    self.tokens[:n].copy_(e.x[:B])
                self.positions[:n].copy_(dec.positions)
                self.write_index[:n].copy_(dec.write_index)
            self.tokens[n:Np].copy_(self.in_tok[:L])
            self.positions[n:Np].copy_(self.in_pos[:L])
            self.write_index[n:Np].copy_(self.in_write[:L])
            if e.triton:
                whole, chunks = self._batches(Np, B, T)
            else:
                whole, chunks = self._host_batches
                if n:
                    whole = with_device_rows(whole, e.pos, e.slot, e.block_tables, B, T)
            t.layer_hook = cut
            try:
                g, H = t.run(self.tokens[:Np], whole, capture=e.capture if draft else (), logit_index=logit_index,
                             attention=e.decode_attention(), greedy=True)                # [n + LAST], [Np, n*h]
            finally:
                t.layer_hook = None
            if T == 1 and not draft:                       # the target alone: the outputs, nothing more
                self.firsts.copy_(g[n:])
                if n:
                    e.out_tokens[:B, 0] = g[:n]
                    e.out_n[:B] = 0
            elif T == 1:
                self._finish(g, H, n, B, Np, dec, chunks)
            else:
                self._verify(g, H, D, B, T, Np, whole)

        return run

    def _verify(self, g: Tensor, H: Tensor, D: Tensor | None, B: int, T: int, Np: int, whole: RaggedBatch) -> None:
        """A K > 0 iteration's end, as the decode graphs' spec step does it: acceptance over the B
        rows, then one draft pass over every packed token (the rows' catch-up entries (E_i, H_i)
        and the chunks' entries (x_{p+1}, h_p)), its head at each row's accepted index and at each
        last chunk's last token. g [B*T + LAST], H [Np, n*h].
        Example B=2, T=3, accepted n = (1, 2), one last chunk ending at chunk index 4:
            heads = [0*3 + 1, 1*3 + 2, 6 + 4] = [1, 5, 10]."""
        e, n = self.e, B * T
        firsts = g[n:]
        self.firsts.copy_(firsts)
        self.in_nxt.index_copy_(0, self.in_at, firsts)       # a last chunk's x_e is its first generated token
        acc, E = e.accept(D, g[:n].view(B, T))                                             # [B], [B, T]
        e.out_tokens[:B, :T] = E
        e.out_n[:B] = acc
        tokens = torch.cat([E.reshape(-1), self.in_nxt[:Np - n]])                          # [Np]
        heads = torch.cat([torch.arange(B, device=e.device) * T + acc, n + self.in_last])  # [B + LAST]
        slot = torch.cat([e.slot[:B], self.in_last_slot])
        d, dh = e.draft.run(tokens, H[:Np], whole, e.decode_attention(), greedy=True, rows=heads)
        e.next_draft[slot] = e.draft.to_target_ids(d)
        e.draft_hidden[slot] = dh
        e.last_capture[slot] = H[heads]

    def _finish(self, g: Tensor, H: Tensor, n: int, B: int, Np: int, dec, chunks: RaggedBatch) -> None:
        """A K = 0 iteration's end, as the engine's eager path (engine._mixed) does it: the rows'
        tokens, captures and keep-warm K/V; the draft's pass over the chunks, its head at the last
        tokens only."""
        e = self.e
        firsts = g[n:]
        self.firsts.copy_(firsts)
        if n:
            e.out_tokens[:B, 0] = g[:n]
            e.out_n[:B] = 0
            e.last_capture[e.slot[:B]] = H[:n]
            scratch = SCRATCH_BLOCK * e.block_size
            warm = torch.where(self.in_warm != 0, dec.write_index, torch.full_like(dec.write_index, scratch))
            e.draft.extend_kv(g[:n], H[:n], RaggedBatch(dec.positions, warm, dec.q_pos, dec.slots, dec.tables,
                                                        dec.block_size))
        # draft entries of the chunks: (x_{p+1}, h_p); a last chunk's x_e is its first generated token
        self.in_nxt.index_copy_(0, self.in_at, firsts)
        d, dh = e.draft.run(self.in_nxt[:Np - n], H[n:Np], chunks, e.decode_attention(), greedy=True,
                            rows=self.in_last)                                                     # [LAST]
        slot = self.in_last_slot
        e.next_draft[slot] = e.draft.to_target_ids(d)
        e.draft_hidden[slot] = dh
        e.last_capture[slot] = H[n + self.in_last]

    # ---- graphs ---------------------------------------------------------------------------
    def capture(self, keys: Iterable[Key]) -> int:
        """Warm up and capture each key's forward as a graph chain (one pool). CUDA only; call with
        the engine's step buffers on the padding rows (capture_graphs leaves them so)."""
        keys = [k for k in sorted(set(keys)) if k not in self.graphs]
        if not keys:
            return 0
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        cuts = chain_cuts(len(self.e.target.layers))
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
        """Buffers that make a warm-up or capture of `key` harmless: every token a pad token, every
        write into the scratch block (padding slot, no keep-warm), the work items laid out for the
        key (its decode rows and the pad's, on the padding slot)."""
        self.tokens.zero_()
        self.positions.zero_()
        self.write_index.fill_(SCRATCH_BLOCK * self.e.block_size)
        self.stage(key or (self.top, 0, 1, True), (), keep_warm=False)     # no chunks: every staged input padding

    def run(self, key: Key) -> Tensor:
        """One whole mixed iteration of `key` after `stage` (pending tokens, positions and slots of
        its decode rows already in the engine's x / pos / slot, padding rows past the real ones;
        stale rows refreshed before): its outputs in the engine's out_tokens / out_n and carried
        state, and the first generated token of each last chunk, in the returned self.firsts [LAST]."""
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
        else:
            self._fn(key)(no_cut)
        return self.firsts
