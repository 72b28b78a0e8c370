"""The target's forward over static buffers, cut at attention into L + 1 pieces, for the
whole-forward graphs of mixed iterations (mixed_graphs.py). See docs/design.md ("Graphs for
mixed iterations").

    piece 0      embed, RoPE tables, layer 0 up to attention              -> q
    piece i      layer i-1 from attention's output on, layer i up to it   -> q      (i = 1..L-1)
    piece L      layer L-1 from attention's output on, the captured layers, the final norm

The caller runs attention between the pieces: o[:N] = attention(q[:N], ...). tokens, positions,
write_index, q and o are static buffers sized for the top token bucket; the stream x passes
from piece to piece in a dict (`out["state"]`), which the caller clears once the last piece ran.
Padding tokens are token 0 at position 0, writing K/V into the scratch block, which no row reads.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .kv_cache import SCRATCH_BLOCK

# Token buckets up to 1024: above that a forward is GEMM-bound and the launches a graph saves
# are a small share of it.
BUCKETS = (16, 32, 64, 128, 192, 256, 384, 512, 640, 768, 896, 1024)


def mixed_buckets(max_num_tokens: int, top: int = BUCKETS[-1]) -> tuple[int, ...]:
    """The buckets up to min(max_num_tokens, top), that bound included: 72 -> (16, 32, 64, 72)."""
    cap = min(max_num_tokens, top)
    return tuple(b for b in BUCKETS if b < cap) + (cap,)


class TargetPieces:
    """Static buffers [top bucket] and `make(n, out)`: the target's pieces over their first n
    tokens; out receives the last piece's h [n, h] and H [n, n_capture * h]."""

    def __init__(self, target, buckets, capture: tuple[int, ...]):
        self.target, self.buckets, self.capture_layers = target, tuple(sorted(buckets)), capture
        c, layer = target.config, target.layers[0]
        top = self.buckets[-1]
        self.scratch = SCRATCH_BLOCK * target.block_size                              # flat pool index
        like = target.tok_embeddings.weight
        with torch.inference_mode():       # as the engine's own tensors: no extra compiled versions
            self.tokens = torch.zeros(top, dtype=torch.long, device=like.device)     # [Np] static inputs
            self.positions = torch.zeros_like(self.tokens)
            self.write_index = torch.full_like(self.tokens, self.scratch)
            self.q = like.new_zeros(top, layer.n_local_heads, c.head_dim)             # [Np, nh, hd]
            self.o = like.new_zeros(top, layer.n_local_heads * c.head_dim)            # [Np, nh*hd]

    def bucket(self, n: int) -> int | None:
        """The smallest token bucket >= n, or None above the largest."""
        return next((b for b in self.buckets if b >= n), None)

    def pad(self) -> None:
        """Every token padding (token 0 at position 0, K/V into the scratch block), attention
        output 0: what warm-ups and captures run on."""
        self.tokens.zero_()
        self.positions.zero_()
        self.write_index.fill_(self.scratch)
        self.o.zero_()

    def make(self, n: int, out: dict) -> list[Callable[[], None]]:
        t = self.target
        f, comm, L = t.kernels, t.collectives, len(t.layers)
        st: dict[str, Tensor] = {}
        out["state"] = st                  # what passes from piece to piece
        tokens, positions, widx = self.tokens[:n], self.positions[:n], self.write_index[:n]
        q, o = self.q[:n], self.o[:n]

        def first() -> None:
            x, st["cos"], st["sin"] = t.embed(tokens, positions)
            st["x"], qi = t.layers[0].attn_in(x, None, st["cos"], st["sin"], t.k_cache[0], t.v_cache[0], widx, f,
                                              comm)
            q.copy_(qi)

        def middle(i: int) -> Callable[[], None]:
            def piece() -> None:
                x, r = t.layers[i - 1].attn_out(st["x"], o, f, comm)
                if i - 1 in self.capture_layers:
                    x, r = comm.settle(x, r), None
                    st[f"cap{i - 1}"] = x
                if i < L:
                    st["x"], qi = t.layers[i].attn_in(x, r, st["cos"], st["sin"], t.k_cache[i], t.v_cache[i], widx, f,
                                                      comm)
                    q.copy_(qi)
                else:
                    out["h"] = t.final_norm(x, r)                                                   # [n, h]
                    out["H"] = (torch.cat([st[f"cap{j}"] for j in self.capture_layers], dim=-1)
                                if self.capture_layers else None)                                   # [n, n*h]
            return piece

        return [first] + [middle(i) for i in range(1, L + 1)]
