"""A mixed iteration's packed forward inputs in one launch (mixed_graphs.WholeMixed, where the
engine's attention is the Triton kernel: CUDA, or Triton's interpreter in tests). Imported only
where Triton runs.

Each packed token i whose cell c = CELL[i] >= 0 is decode row r = c // T's token j = c % T: the
pending token X[r] (j = 0) or draft D[r, j-1], at position POS[r] + j, its K/V at
TABLES[SLOT[r], p // BS] * BS + p % BS; every other token (chunks, padding) takes the staged
IN_TOK, IN_POS, IN_WRITE. Torch ran this as about 15 launches (the grid's positions and write
indices, then a gather, a select and a copy for each of the three outputs).
Example T = 2, cells [0 1 -1 2 3], X [7 8], D [[5], [6]], POS [10 20], BS 16, tables of both
slots [3 4]: tokens [7 5 s2 8 6], positions [10 11 p2 20 21], write [58 59 w2 68 69] (block 3 at
offsets 10 and 11, block 4 at offsets 4 and 5)."""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

BLOCK = 128


@triton.jit
def _pack(CELL, X, D, POS, SLOT, TABLES, IN_TOK, IN_POS, IN_WRITE, TOK, P, W, n, T, stride_d, stride_t,
          BS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    cell = tl.load(CELL + i, mask=live, other=-1)
    dec = live & (cell >= 0)
    c = tl.maximum(cell, 0)
    r = c // T
    j = c % T
    x = tl.load(X + r, mask=dec & (j == 0), other=0)
    d = tl.load(D + r * stride_d + j - 1, mask=dec & (j > 0), other=0)
    pos = tl.load(POS + r, mask=dec, other=0) + j
    slot = tl.load(SLOT + r, mask=dec, other=0)
    blk = tl.load(TABLES + slot * stride_t + pos // BS, mask=dec, other=0)
    tok = tl.where(j == 0, x, d)
    tl.store(TOK + i, tl.where(dec, tok, tl.load(IN_TOK + i, mask=live, other=0)), mask=live)
    tl.store(P + i, tl.where(dec, pos, tl.load(IN_POS + i, mask=live, other=0)), mask=live)
    tl.store(W + i, tl.where(dec, blk * BS + pos % BS, tl.load(IN_WRITE + i, mask=live, other=0)), mask=live)


def pack_inputs(cell: Tensor, x: Tensor, drafts: Tensor | None, pos: Tensor, slot: Tensor, tables: Tensor,
                block_size: int, staged: tuple[Tensor, Tensor, Tensor], out: tuple[Tensor, Tensor, Tensor]) -> None:
    """cell [n] (-1: not a decode token), x, pos, slot [B] rows' pending token, first position and
    slot, drafts [B, T-1] or None (T = 1), tables [slots, blocks]; staged and out: (tokens,
    positions, write index) [n] each, int64 -> out filled (module docstring). No host sync."""
    n = cell.shape[0]
    T = 1 if drafts is None else drafts.shape[1] + 1
    d = x if drafts is None else drafts.contiguous()
    if n:
        _pack[(triton.cdiv(n, BLOCK),)](cell, x, d, pos, slot, tables, *staged, *out, n, T,
                                        T - 1, tables.stride(0),
                                        BS=block_size, BLOCK=BLOCK)
