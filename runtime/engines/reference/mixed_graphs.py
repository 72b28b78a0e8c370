"""A mixed iteration's whole target forward, attention included, as one CUDA graph per key
(Np, B, T): token bucket Np, row bucket B, T = K+1 tokens a decode row. See docs/design.md
("Graphs for mixed iterations").

piecewise.py leaves attention eager between its 33 graphed pieces, so a mixed step is
host-bound (H200: 18.5 ms for b=1 + a 128-token chunk, 5.1 ms for the decode step alone). Here
attention reads static buffers only, so it is captured with the pieces:
    decode rows    the decode graphs' kernel: paged_decode.py's Triton kernel on CUDA (its
                   counters reset themselves, so replay is safe), else FlexAttention over the
                   pool with a block mask built in the graph from the engine's pos / slot buffers
    prompt chunks  packed_attention with block lists and per-token (slot, position) in buffers

Packed layout of the Np tokens:
    [0, B*T)            decode rows, row r's T tokens (pending + K drafts); rows b..B-1 pad
    [B*T, B*T + L)      the chunks' L tokens, packed as in the plan
    [B*T + L, Np)       pad: token 0 at position 0 of the padding slot (K/V into the scratch block)
Example b=3, B=4, T=2, chunks of 5 and 3 tokens, Np=16: decode 0..7 (6 and 7 pad), chunks 8..15.
The plan's packing (ragged_batch) puts chunk token j at b*T + j; here it sits (B-b)*T later.

Memory: the graphs share one pool and write h, H into static buffers, so nothing but those
buffers outlives a replay. On CPU (tests) the same functions run without capture.
H200, 8B shape, 512 context, ms a step (benchmarks/results/h200_c15_mixed_step.json): b=1 + a
128-token chunk 10.1 whole vs 15.8 piecewise (decode alone 5.1); b=128 + 256 tokens 21.7 vs 22.8.
At 1024 context with the step's host work in one copy (h200_c23_mixed_step.json): b=1 + 128
9.25 whole (decode alone 4.95), b=64 + 128 11.76 (7.63).
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor

from .attention import PerStepMasks, uniform_batch
from .packed import PackedChunks, packed_attention, packed_block_mask
from .paged_decode import PagedDecode
from .piecewise import capture_graph

Key = tuple[int, int, int]       # (Np, B, T)


def whole_keys(rows: Iterable[tuple[int, int]], token_buckets: Iterable[int]) -> tuple[Key, ...]:
    """Every (Np, B, T) with room for at least one chunk token, for each row shape (B, T) and
    chunk-only iterations (0, 1). ((1, 2),), buckets (16, 32) -> (16,0,1) (16,1,2) (32,0,1) (32,1,2)."""
    shapes = set(rows) | {(0, 1)}
    return tuple(sorted((n, B, T) for B, T in shapes for n in token_buckets if n > B * T))


class WholeMixed:
    """run(...) -> (h, H) of a mixed iteration in the packed layout above, from a graph per key
    once `capture` has run (CUDA), else eagerly (CPU, tests)."""

    def __init__(self, engine):
        e, pw, t = engine, engine.piecewise, engine.target
        self.e, self.pw = e, pw
        top = pw.buckets[-1]
        self.pool_len = t.k_cache.shape[2]
        blocks = self.pool_len // e.block_size
        like, dev = t.tok_embeddings.weight, e.device
        q_block = PackedChunks.Q_BLOCK
        with torch.inference_mode():
            self.dec_tokens = torch.zeros(e.max_batch_size + 1, e.max_draft_len + 1, dtype=torch.long, device=dev)
            self.tok_slot = torch.full((top,), e.pad_slot, dtype=torch.long, device=dev)          # [L]
            # [q blocks, 1 + blocks]: count, then block ids; one tensor, laid out as packed.kv_block_tensors'
            # (FlexAttention's compiled versions are guarded on strides: the same layout reuses them)
            kv = torch.zeros(-(-top // q_block), 1 + blocks, dtype=torch.int32, device=dev)
            self.kv_num, self.kv_idx = kv[:, 0], kv[:, 1:]
            self.h = like.new_zeros(top, t.config.hidden_size)                                   # [Np, h]
            self.H = like.new_zeros(top, len(pw.capture_layers) * t.config.hidden_size)          # [Np, n*h]
        self._fns: dict[Key, Callable[[], None]] = {}
        self.graphs: dict[Key, "torch.cuda.CUDAGraph"] = {}

    def drop(self) -> None:
        """Forget the graphs (they bake in what they captured, e.g. the all-reduce mode)."""
        self.graphs.clear()
        self._fns.clear()

    def key(self, B: int, T: int, n_chunk: int) -> Key | None:
        n = self.pw.bucket(B * T + n_chunk)
        return None if n is None else (n, B, T)

    def _fn(self, key: Key) -> Callable[[], None]:
        if key not in self._fns:
            self._fns[key] = self._make(*key)
        return self._fns[key]

    def _make(self, Np: int, B: int, T: int) -> Callable[[], None]:
        e, pw, t = self.e, self.pw, self.e.target
        out: dict = {}
        pieces = pw._make_pieces(Np, out)
        n, L = B * T, Np - B * T
        nqb = -(-L // PackedChunks.Q_BLOCK)
        owner, logical, bs, P = e.block_owner, e.block_logical, e.block_size, self.pool_len
        triton = e.decode_kernel == "triton" and e.attention == "flex"

        def run() -> None:
            # the decode rows: the decode graphs' kernel, Triton's for the rows it supports, else
            # FlexAttention with one block mask a run (built at its first use, shared by the layers)
            flex = PerStepMasks(owner, logical, bs)
            decode = PagedDecode(bs, flex) if triton else flex
            dec = None
            if n:
                vpos = e.pos[:B, None] + torch.arange(T, device=e.device)                   # [B, T]
                dec = uniform_batch(e.block_tables, e.slot[:B], vpos, e.max_blocks_per_seq, bs)
                pw.tokens[:n].copy_(self.dec_tokens[:B, :T].reshape(-1))
                pw.positions[:n].copy_(dec.positions)
                pw.write_index[:n].copy_(dec.write_index)
            cmask = packed_block_mask(self.kv_num[:nqb], self.kv_idx[:nqb], self.tok_slot[:L], pw.positions[n:Np],
                                      owner, logical, bs, P)
            pieces[0]()
            for i in range(len(t.layers)):
                q, k, v = pw.q[:Np], t.k_cache[i], t.v_cache[i]
                if n:
                    pw.o[:n].copy_(decode(q[:n], k, v, dec))
                pw.o[n:Np].copy_(packed_attention(q[n:Np], k, v, cmask))
                pieces[i + 1]()
            self.h[:Np].copy_(out["h"])
            if out["H"] is not None:
                self.H[:Np].copy_(out["H"])
            out["state"].clear()           # only h and H outlive a graph: its pool serves the next capture
            del out["h"], out["H"]

        return run

    def capture(self, keys: Iterable[Key]) -> int:
        """Warm up and capture each key's forward (one pool). CUDA only; call with the engine's
        step buffers on the padding rows (capture_graphs leaves them so)."""
        keys = [k for k in sorted(set(keys)) if k not in self.graphs]
        if not keys:
            return 0
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        with torch.inference_mode():
            self._idle()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for key in keys:
                    self._fn(key)()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for key in keys:
                self.graphs[key] = capture_graph(self._fn(key), pool, stream)
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        return len(keys)

    def _idle(self) -> None:
        """Buffers that make a warm-up or capture harmless: every token a pad token."""
        self.dec_tokens.zero_()
        self.pw._pad(0, self.pw.buckets[-1])
        self.tok_slot.fill_(self.e.pad_slot)
        self.kv_num.zero_()

    def run(self, key: Key, b: int, drafts: Tensor | None, prompt: Tensor, positions: Tensor, write_index: Tensor,
            token_slot: Tensor, num: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
        """One mixed iteration: b real decode rows (drafts [b, K] or None at K=0; pending tokens,
        positions and slots already in the engine's x / pos / slot, rows b..B-1 padding), the
        chunks' prompt tokens, positions, write indices and slots [Nc], and their block lists
        (packed.kv_block_tensors: num [m], idx [m, blocks] on the device).
        -> (h [Np, h], H [Np, n*h]), buffers valid until the next run."""
        Np, B, T = key
        n, Nc = B * T, prompt.shape[0]
        self.dec_tokens[:B, 0].copy_(self.e.x[:B])
        if T > 1:
            self.dec_tokens[:b, 1:T].copy_(drafts)
            self.dec_tokens[b:B, 1:T].zero_()
        pw = self.pw
        pw.tokens[n:n + Nc].copy_(prompt)
        pw.positions[n:n + Nc].copy_(positions)
        pw.write_index[n:n + Nc].copy_(write_index)
        pw._pad(n + Nc, Np)
        self.tok_slot[:Nc].copy_(token_slot)
        self.tok_slot[Nc:Np - n].fill_(self.e.pad_slot)
        m = num.shape[0]
        self.kv_num[:m].copy_(num)
        self.kv_num[m:].zero_()
        self.kv_idx[:m].copy_(idx)
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
        else:
            self._fn(key)()
        return self.h[:Np], self.H[:Np]
