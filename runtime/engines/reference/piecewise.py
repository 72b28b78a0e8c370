"""The target's forward for mixed iterations (decode rows + prompt chunks) as CUDA graphs cut at
attention, one set per token bucket. See docs/design.md ("Graphs for mixed iterations").

A mixed iteration's shapes change with every chunk, so one whole-forward graph per shape is
out of reach; but everything except attention depends only on the token count N. So N is
padded to a bucket Np and the forward is cut into L + 1 pieces, each captured once per bucket:

    piece 0      embed, RoPE tables, layer 0 up to attention              -> q
    piece i      layer i-1 from attention's output on, layer i up to it   -> q      (i = 1..L-1)
    piece L      layer L-1 from attention's output on, the captured layers, the final norm

Between pieces, attention runs eagerly on the N real tokens: o[:N] = attention(q[:N], ...).
q and o are static buffers (copied in and out); the stream x passes from piece to piece in the
graph pool (the next piece was captured reading it; nothing else runs in between). Padded
tokens (N..Np-1) are token 0 at position 0, writing K/V into the scratch block, which no row reads.
The lm_head then runs eagerly on the M rows whose logits are wanted.

Memory: all pieces share one graph pool. A run replays one bucket's pieces in order, and every
tensor a piece reads was written earlier in the same run (piece 0 rewrites x, cos and sin), so a
later capture may reuse an earlier bucket's freed intermediates as scratch. Buckets never
interleave; `out` (the last piece's h and H) stays allocated and is read before the next run.

Worked sizes, Llama-3.1-8B: 33 graphs a bucket, 396 for the 12 buckets; q and o are sized for
the top bucket, 8 MiB each at 1024 tokens; each bucket keeps its last piece's outputs (h, H)
and the pool its largest temporaries, about 0.3 GB in all. On CPU (tests) the same pieces run
without capture, so the padding and buffers are checked there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from .attention import RaggedBatch
from .kv_cache import SCRATCH_BLOCK

# Token buckets up to 1024: above that a forward is GEMM-bound (tens of ms on an H200), and the
# eager launches it saves are a few ms at most.
BUCKETS = (16, 32, 64, 128, 192, 256, 384, 512, 640, 768, 896, 1024)


def mixed_buckets(max_num_tokens: int, top: int = BUCKETS[-1]) -> tuple[int, ...]:
    """The buckets up to min(max_num_tokens, top), that bound included: 72 -> (16, 32, 64, 72)."""
    cap = min(max_num_tokens, top)
    return tuple(b for b in BUCKETS if b < cap) + (cap,)


def chain_cuts(layers: int) -> frozenset[int]:
    """Pure. The target layers after which a graph chain starts its next graph: after layer 0
    and after layer layers // 4 (32 -> {0, 8}; 6 -> {0, 1}; 1 -> {0})."""
    return frozenset({0, max(1, layers // 4)} & set(range(layers)))


@dataclass(frozen=True)
class GraphChain:
    """CUDA graphs replayed in turn as one step (capture_chain)."""
    graphs: tuple

    def replay(self) -> None:
        for g in self.graphs:
            g.replay()


def capture_chain(fn: Callable[[Callable[[int], None]], None], cuts: frozenset[int], pool, stream) -> GraphChain:
    """fn(cut) captured as consecutive graphs on `stream` into `pool`; fn calls cut(i) after
    target layer i, and a new graph starts after each layer in `cuts` (none: one graph). What
    passes between the pieces stays in the pool, and nothing runs between their replays. A
    graph's kernels start only once its launch has been submitted, about a microsecond a node
    (H200: 0.4 ms for the 413 nodes of a b=1 decode step; 0.68 ms for a mixed step's whole
    forward, call 23's trace); after a one-layer first piece the GPU runs while the host submits
    the rest. Example, 32 layers: embed + layer 0 | layers 1..8 | layers 9..31 + head."""
    graphs = [torch.cuda.CUDAGraph()]
    open_ = [False]                                          # a capture is under way

    def begin() -> None:
        graphs[-1].capture_begin(pool=pool)
        open_[0] = True

    def end() -> None:
        open_[0] = False
        graphs[-1].capture_end()

    def cut(i: int) -> None:
        if i in cuts:
            end()
            graphs.append(torch.cuda.CUDAGraph())
            begin()

    with torch.cuda.stream(stream):
        begin()
        try:
            fn(cut)
        finally:
            if open_[0]:                                     # not after a failed begin: keep its error
                end()
    torch.cuda.current_stream().wait_stream(stream)
    return GraphChain(tuple(graphs))


def capture_graph(fn: Callable[[], None], pool, stream) -> "torch.cuda.CUDAGraph":
    """fn captured as one CUDA graph on `stream` into `pool`, without torch.cuda.graph()'s gc +
    empty_cache per capture (hundreds of captures at start-up)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        g.capture_begin(pool=pool)
        try:
            fn()
        finally:
            g.capture_end()
    return g


class PiecewiseTarget:
    """`run(tokens, batch, attention, logit_index)` == target.run(..., greedy=True) for N <= the
    largest bucket (`fits(N)`); `capture()` records the pieces as CUDA graphs (else they run
    eagerly, the same code)."""

    def __init__(self, target, buckets: Sequence[int], capture: tuple[int, ...]):
        self.target, self.buckets, self.capture_layers = target, tuple(sorted(buckets)), capture
        c, dev = target.config, target.tok_embeddings.weight.device
        layer = target.layers[0]
        top = self.buckets[-1]
        self.scratch = SCRATCH_BLOCK * target.block_size                              # flat pool index
        like = target.tok_embeddings.weight
        with torch.inference_mode():       # as the engine's own tensors: no extra compiled versions
            self.tokens = torch.zeros(top, dtype=torch.long, device=dev)             # [Np] static inputs
            self.positions = torch.zeros(top, dtype=torch.long, device=dev)
            self.write_index = torch.full((top,), self.scratch, dtype=torch.long, device=dev)
            self.q = like.new_zeros(top, layer.n_local_heads, c.head_dim)             # [Np, nh, hd]
            self.o = like.new_zeros(top, layer.n_local_heads * c.head_dim)            # [Np, nh*hd]
        self.out: dict[int, dict[str, Tensor]] = {}        # bucket -> the last piece's h, H
        self.drop()

    def drop(self) -> None:
        """Back to eager pieces (graphs bake in what they captured, e.g. the all-reduce mode)."""
        self.out.clear()
        self._pieces: dict[int, list[Callable[[], None]]] = {n: self._make_pieces(n) for n in self.buckets}
        self.graphs = 0

    def fits(self, n: int) -> bool:
        return n <= self.buckets[-1]

    def bucket(self, n: int) -> int | None:
        """The smallest token bucket >= n, or None above the largest."""
        return next((b for b in self.buckets if b >= n), None)

    def _make_pieces(self, n: int, out: dict | None = None) -> list[Callable[[], None]]:
        """Bucket n's pieces, eager; out receives the last piece's h and H (default: self.out[n])."""
        t = self.target
        f, comm, L = t.kernels, t.collectives, len(t.layers)
        st: dict[str, Tensor] = {}
        out = self.out.setdefault(n, {}) if out is None else out
        out["state"] = st                  # what passes from piece to piece (a caller may drop it after the last)
        tokens, positions, widx = self.tokens[:n], self.positions[:n], self.write_index[:n]
        q, o = self.q[:n], self.o[:n]

        def first() -> None:
            x, st["cos"], st["sin"] = t.embed(tokens, positions)
            st["x"], qi = t.layers[0].attn_in(x, None, st["cos"], st["sin"], t.k_cache[0], t.v_cache[0], widx, f)
            q.copy_(qi)

        def middle(i: int) -> Callable[[], None]:
            def piece() -> None:
                x, r = t.layers[i - 1].attn_out(st["x"], o, f, comm)
                if i - 1 in self.capture_layers:
                    st[f"cap{i - 1}"] = x + r
                if i < L:
                    st["x"], qi = t.layers[i].attn_in(x, r, st["cos"], st["sin"], t.k_cache[i], t.v_cache[i], widx, f)
                    q.copy_(qi)
                else:
                    out["h"] = f.add_rms_norm(x, r, t.norm, t.config.rms_norm_eps)[1]              # [Np, h]
                    out["H"] = (torch.cat([st[f"cap{j}"] for j in self.capture_layers], dim=-1)
                                if self.capture_layers else None)                                   # [Np, n*h]
            return piece

        return [first] + [middle(i) for i in range(1, L + 1)]

    def capture(self) -> int:
        """Warm up and capture every bucket's pieces (largest first, one pool). CUDA only."""
        if self.graphs:
            self.drop()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        with torch.inference_mode():
            self._pad(0, self.buckets[-1])     # the warm-up writes K/V: into the scratch block only
            self.o.zero_()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for n in reversed(self.buckets):
                    for piece in self._pieces[n]:
                        piece()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for n in reversed(self.buckets):
                replays = [capture_graph(piece, pool, stream).replay for piece in self._pieces[n]]
                self._pieces[n] = replays
                self.graphs += len(replays)
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        return self.graphs

    def _pad(self, N: int, n: int) -> None:
        """Tokens N..n-1 of the buffers: token 0 at position 0, K/V into the scratch block, and
        attention output 0 (stale but finite otherwise; zero keeps it so)."""
        self.tokens[N:n].zero_()
        self.positions[N:n].zero_()
        self.write_index[N:n].fill_(self.scratch)
        self.o[N:n].zero_()

    def run(self, tokens: Tensor, batch: RaggedBatch, attention, logit_index: Tensor) -> tuple[Tensor, Tensor | None]:
        """tokens [N] packed -> (greedy ids [M] at logit_index, captured layers [N, n*h]). The
        captured layers are a view of the bucket's buffers: valid until the next run."""
        N = tokens.shape[0]
        n = self.bucket(N)
        self.tokens[:N].copy_(tokens)
        self.positions[:N].copy_(batch.positions)
        self.write_index[:N].copy_(batch.write_index)
        self._pad(N, n)
        t = self.target
        pieces = self._pieces[n]
        pieces[0]()
        for i in range(len(t.layers)):
            self.o[:N].copy_(attention(self.q[:N], t.k_cache[i], t.v_cache[i], batch))
            pieces[i + 1]()
        out = self.out[n]
        H = out["H"]
        return t.head(out["h"][logit_index], greedy=True), (None if H is None else H[:N])
