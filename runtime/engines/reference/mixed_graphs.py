"""A mixed iteration's whole target forward, attention included, as one chain of CUDA graphs
per key (Np, B, T): token bucket Np, row bucket B, T = K+1 tokens a decode row. See
docs/design.md ("Graphs for mixed iterations").

The forward is target_pieces.py's pieces with attention between them; attention reads static
buffers only, so it is captured with the pieces:
    decode rows    the decode graphs' attention (engine.decode_attention: paged_decode.py's
                   Triton kernel on CUDA; its counters reset themselves, so replay is safe)
    prompt chunks  packed_attention with block lists and per-token (slot, position) in buffers

Packed layout of the Np tokens (the engine's eager mixed path packs the same way):
    [0, B*T)            decode rows, row r's T tokens (pending + K drafts); rows b..B-1 pad
    [B*T, B*T + L)      the chunks' L tokens, in plan order
    [B*T + L, Np)       pad: token 0 at position 0 of the padding slot (K/V into the scratch block)
Example b=3, B=4, T=2, chunks of 5 and 3 tokens, Np=16: decode 0..7 (6 and 7 pad), chunks 8..15.

Inputs: the chunks' tokens, positions, K/V write indices, slots, draft inputs, last-token
indices and block lists are laid out on the host (`stage`, numpy) in two pinned buffers and
reach the device in two copies; the graph copies them on into the pieces' buffers. The decode
rows' come from the engine's step_in copy. So nothing runs on the device before the launch but
those copies.

K = 0 keys (T = 1) run the whole iteration in the graph, not the target alone: the greedy head
of the decode rows and of each last chunk's last token (at most LAST of them; `key` refuses
more), the decode rows' outputs and keep-warm K/V (written to the scratch block when the plan
does not keep warm: one graph serves both), and the draft's pass over the chunks with its
outputs at the last tokens only. K > 0 keys return (h, H) and the engine finishes eagerly.

Memory: the graphs share one pool and write their outputs into static buffers, so nothing but
those buffers outlives a replay. On CPU (tests) the same functions run without capture.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from .attention import RaggedBatch, uniform_batch
from .graphs import capture_chain, chain_cuts, no_cut
from .kv_cache import SCRATCH_BLOCK
from .packed import PackedChunks, packed_attention, packed_block_mask, packed_kv_blocks, q_blocks
from .target_pieces import TargetPieces, mixed_buckets

Key = tuple[int, int, int]       # (Np, B, T)


def whole_keys(rows: Iterable[tuple[int, int]], token_buckets: Iterable[int]) -> tuple[Key, ...]:
    """Every (Np, B, T) with room for at least one chunk token, for each row shape (B, T) and
    chunk-only iterations (0, 1). ((1, 2),), buckets (16, 32) -> (16,0,1) (16,1,2) (32,0,1) (32,1,2)."""
    shapes = set(rows) | {(0, 1)}
    return tuple(sorted((n, B, T) for B, T in shapes for n in token_buckets if n > B * T))


class WholeMixed:
    """stage(...) then run(...) -> a mixed iteration from a graph chain per key once `capture` has
    run (CUDA), else eagerly (CPU, tests)."""

    LAST = 64                 # last chunks a K = 0 graph finishes (1024 tokens of 16-token prompts)

    def __init__(self, engine):
        e, t = engine, engine.target
        self.e = e
        self.pw = pw = TargetPieces(t, mixed_buckets(e.max_num_tokens), e.capture)
        self.buckets = pw.buckets
        self.top = top = pw.buckets[-1]
        self.pool_len = t.k_cache.shape[2]
        blocks = self.pool_len // e.block_size
        like, dev, cuda = t.tok_embeddings.weight, e.device, e.device.type == "cuda"
        S, q_block = self.LAST, PackedChunks.Q_BLOCK
        # staged inputs, int64: tokens | positions | write index | slot [top each] | draft inputs
        # [top + 1: the last is where padding's scatter lands] | last token (chunk-local) |
        # its place in the draft inputs | its slot [LAST each] | keep-warm flag [1]
        split = (top, top, top, top, top + 1, S, S, S, 1)
        n_in = sum(split)
        with torch.inference_mode():
            self.dec_tokens = torch.zeros(e.max_batch_size + 1, e.max_draft_len + 1, dtype=torch.long, device=dev)
            self.inp = torch.zeros(n_in, dtype=torch.long, device=dev)
            (self.in_tok, self.in_pos, self.in_write, self.in_slot, self.in_nxt, self.in_last, self.in_at,
             self.in_last_slot, self.in_warm) = self.inp.split(split)
            # [q blocks, 1 + blocks]: count, then block ids; one tensor, laid out as packed.kv_block_tensors'
            # (FlexAttention's compiled versions are guarded on strides: the same layout reuses them)
            kv = torch.zeros(q_blocks(top, q_block), 1 + blocks, dtype=torch.int32, device=dev)
            self.kv, self.kv_num, self.kv_idx = kv, kv[:, 0], kv[:, 1:]
            self.h = like.new_zeros(top, t.config.hidden_size)                                   # [Np, h]
            self.H = like.new_zeros(top, len(pw.capture_layers) * t.config.hidden_size)          # [Np, n*h]
            self.firsts = torch.zeros(S, dtype=torch.long, device=dev)                           # [LAST]
        self._host_inp = torch.zeros(n_in, dtype=torch.long, pin_memory=cuda)
        self._host_kv = torch.zeros(kv.shape, dtype=torch.int32, pin_memory=cuda)
        self._kv_np = self._host_kv.numpy()
        self._inp_np = np.split(self._host_inp.numpy(), np.cumsum(split)[:-1])   # views, laid out as self.inp
        self._free = None                     # CUDA event: the last copies out of the host buffers are done
        self._fns: dict[Key, Callable] = {}
        self.graphs: dict[Key, object] = {}

    def drop(self) -> None:
        """Forget the graphs (they bake in what they captured, e.g. the all-reduce mode)."""
        self.graphs.clear()
        self._fns.clear()

    def key(self, plan) -> Key | None:
        """The key of a mixed StepPlan: (the token bucket of its padded tokens, its row bucket,
        K+1); None above the top token bucket, or at K = 0 past LAST last chunks.
        Example: b=3 at K=1 in row bucket 4 plus 5 + 3 chunk tokens -> 16 tokens -> (16, 4, 2)."""
        n = self.pw.bucket(plan.padded_decode_tokens + plan.prefill_tokens)
        if n is None or (plan.k == 0 and plan.last_chunks > self.LAST):
            return None
        return (n, plan.bucket, plan.k + 1)

    # ---- host side ------------------------------------------------------------------------
    def stage(self, key: Key, chunks: Sequence, keep_warm: bool, lists: list[list[int]] | None = None) -> None:
        """The chunks' inputs of an iteration of `key`, laid out on the host and copied in two
        transfers. Chunk token j sits at packed index B*T + j; tokens past the chunks are padding
        (token 0 at position 0 of the padding slot, K/V into the scratch block). lists: the chunks'
        `packed_kv_blocks`, when the caller has them already (PackedChunks.lists)."""
        e, bs, top, S = self.e, self.e.block_size, self.top, self.LAST
        Np, B, T = key
        if self._free is not None:
            self._free.synchronize()
        tok, pos, write, slot, nxt, last, at, last_slot, warm = self._inp_np
        tok[:], pos[:], write[:], slot[:] = 0, 0, SCRATCH_BLOCK * bs, e.pad_slot
        nxt[:], last[:], at[:], last_slot[:] = 0, 0, top, e.pad_slot
        warm[0] = int(keep_warm)
        i, m, rows = 0, 0, []
        for c in chunks:
            n = len(c.tokens)
            table = e._table(c.slot)
            p = np.arange(c.start, c.start + n)
            tok[i:i + n] = c.tokens
            pos[i:i + n] = p
            write[i:i + n] = np.asarray(table)[p // bs] * bs + p % bs
            slot[i:i + n] = c.slot
            nxt[i:i + n - 1] = c.tokens[1:]
            nxt[i + n - 1] = c.next_token or 0                 # a last chunk's: its first generated token (graph)
            if c.last and m < S:
                last[m], at[m], last_slot[m] = i + n - 1, i + n - 1, c.slot
                m += 1
            rows.append((table, c.start, n))
            i += n
        if lists is None:
            lists = packed_kv_blocks(rows, bs, PackedChunks.Q_BLOCK)
        nqb = q_blocks(Np - B * T, PackedChunks.Q_BLOCK)
        kv = self._kv_np
        kv[:nqb, 0] = 0
        for j, blocks in enumerate(lists):
            kv[j, 0] = len(blocks)
            kv[j, 1:1 + len(blocks)] = blocks
        self.inp.copy_(self._host_inp, non_blocking=True)
        self.kv[:nqb].copy_(self._host_kv[:nqb], non_blocking=True)
        if e.device.type == "cuda":
            if self._free is None:
                self._free = torch.cuda.Event()
            self._free.record()

    # ---- the device function --------------------------------------------------------------
    def _fn(self, key: Key) -> Callable:
        if key not in self._fns:
            self._fns[key] = self._make(*key)
        return self._fns[key]

    def _make(self, Np: int, B: int, T: int) -> Callable:
        e, pw, t = self.e, self.pw, self.e.target
        out: dict = {}
        pieces = pw.make(Np, out)
        n, L = B * T, Np - B * T
        nqb = q_blocks(L, PackedChunks.Q_BLOCK)
        owner, logical, bs, P = e.block_owner, e.block_logical, e.block_size, self.pool_len
        scratch = SCRATCH_BLOCK * bs

        def run(cut: Callable[[int], None]) -> None:
            decode = e.decode_attention()
            dec = None
            if n:
                vpos = e.pos[:B, None] + torch.arange(T, device=e.device)                   # [B, T]
                dec = uniform_batch(e.block_tables, e.slot[:B], vpos, e.max_blocks_per_seq, bs)
                self.dec_tokens[:B, 0].copy_(e.x[:B])                                    # pending tokens, then drafts
                pw.tokens[:n].copy_(self.dec_tokens[:B, :T].reshape(-1))
                pw.positions[:n].copy_(dec.positions)
                pw.write_index[:n].copy_(dec.write_index)
            pw.tokens[n:Np].copy_(self.in_tok[:L])
            pw.positions[n:Np].copy_(self.in_pos[:L])
            pw.write_index[n:Np].copy_(self.in_write[:L])
            cmask = packed_block_mask(self.kv_num[:nqb], self.kv_idx[:nqb], self.in_slot[:L], pw.positions[n:Np],
                                      owner, logical, bs, P)
            pieces[0]()
            for i in range(len(t.layers)):
                q, k, v = pw.q[:Np], t.k_cache[i], t.v_cache[i]
                if n:
                    pw.o[:n].copy_(decode(q[:n], k, v, dec))
                pw.o[n:Np].copy_(packed_attention(q[n:Np], k, v, cmask))
                pieces[i + 1]()
                cut(i)
            h, H = out["h"], out["H"]
            if T == 1:
                self._finish(h, H, n, B, Np, dec, cmask, scratch)
            else:
                self.h[:Np].copy_(h)
                if H is not None:
                    self.H[:Np].copy_(H)
            out["state"].clear()           # only the static outputs outlive a graph: its pool serves the next capture
            del out["h"], out["H"]

        return run

    def _finish(self, h: Tensor, H: Tensor, n: int, B: int, Np: int, dec, cmask, scratch: int) -> None:
        """A K = 0 iteration's end, as the engine's eager path (engine._mixed) does it: greedy ids
        of the n decode rows and of the last chunks' last tokens; the rows' tokens, captures and
        keep-warm K/V; the draft's pass over the chunks, its head at the last tokens only."""
        e, pw = self.e, self.pw
        last = self.in_last
        g = e.target.head(h[torch.cat([torch.arange(n, device=h.device), n + last])], greedy=True)   # [n + LAST]
        firsts = g[n:]
        self.firsts.copy_(firsts)
        if n:
            e.out_tokens[:B, 0] = g[:n]
            e.out_n[:B] = 0
            e.last_capture[e.slot[:B]] = H[:n]
            warm = torch.where(self.in_warm != 0, dec.write_index, torch.full_like(dec.write_index, scratch))
            e.draft.extend_kv(g[:n], H[:n], RaggedBatch(dec.positions, warm, dec.q_pos, dec.slots, dec.tables,
                                                        dec.block_size))
        # draft entries of the chunks: (x_{p+1}, h_p); a last chunk's x_e is its first generated token
        self.in_nxt.index_copy_(0, self.in_at, firsts)
        cb = RaggedBatch(pw.positions[n:Np], pw.write_index[n:Np], pw.positions[n:Np][None], self.in_slot[:1],
                         e.block_tables[:1], e.block_size)
        d, dh = e.draft.run(self.in_nxt[:Np - n], H[n:Np], cb, lambda q, k, v, _: packed_attention(q, k, v, cmask),
                            greedy=True, rows=last)                                                    # [LAST]
        slot = self.in_last_slot
        e.next_draft[slot] = e.draft.to_target_ids(d)
        e.draft_hidden[slot] = dh
        e.last_capture[slot] = H[n + last]

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
                    self._fn(key)(no_cut)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for key in keys:
                self.graphs[key] = capture_chain(self._fn(key), cuts, pool, stream)
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        return len(keys)

    def _idle(self) -> None:
        """Buffers that make a warm-up or capture harmless: every token a pad token, every write
        into the scratch block (padding slot, no keep-warm)."""
        self.dec_tokens.zero_()
        self.pw.pad()
        self.stage((self.top, 0, 1), (), keep_warm=False)       # no chunks: every staged input padding

    def run(self, key: Key, b: int, drafts: Tensor | None) -> tuple[Tensor, Tensor]:
        """One mixed iteration of `key` after `stage`: b real decode rows (drafts [b, K] or None at
        K=0; pending tokens, positions and slots already in the engine's x / pos / slot, rows
        b..B-1 padding). K > 0: -> (h [Np, h], H [Np, n*h]), valid until the next run. K = 0
        (`key` admits it): the iteration is done; its first tokens are self.firsts."""
        Np, B, T = key
        if T > 1:
            self.dec_tokens[:b, 1:T].copy_(drafts)
            self.dec_tokens[b:B, 1:T].zero_()
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
        else:
            self._fn(key)(no_cut)
        return self.h[:Np], self.H[:Np]

