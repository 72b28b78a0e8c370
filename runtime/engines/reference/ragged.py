"""Ragged attention over the paged pool as one Triton kernel (CUDA; Triton's interpreter in CPU
tests): decode rows (K+1 tokens each) and prompt chunks of any length in one launch. See
docs/design.md ("The ragged attention kernel").

Work items. A row's tokens are cut into items of at most ITEM_TOKENS tokens; an item is (its row
of the block tables: the slot, first packed token, tokens). Grid (items x kvh, splits): program (i*kvh + h, s) holds the
M = tokens x G queries of item i that read KV head h (G = nh / kvh), query m -> token m // G,
head h*G + m % G, and attends its row's keys in split s's share of the table (the keys up to its
last token's position; `s <= p` per query inside). With one split it writes its output; with
more, each program writes a partial (m, l, acc) and the last of an item's programs to finish (an
atomic counter it resets) merges them.
Worked example, items of 16 tokens (ITEM_TOKENS is 4), packed rows: decode rows of slots 4 and 9 at K=2 (3 tokens each),
then a 40-token chunk of slot 2 at positions 100..139:
    items  (4, 0, 3) (9, 3, 3) (2, 6, 16) (2, 22, 16) (2, 38, 8)          5 items, 5 x kvh programs a split
    item (2, 22, 16) reads the chunk's keys 0..131 (its last token sits at 116 + 15 = 131).

Uniform rows (decode steps: R rows of T tokens, packed row-major) need no item list: item r is
row r. There the kernel can also take RoPE and the K/V write (rope_attend): each program rotates
its queries, and the program whose keys hold a new token's position writes its rotated K and its
V before it reads, so a decode layer's attention is one launch. Work items read every key from the
pool, written before the launch (rope_write): a chunk's item reads keys that other items bring.
Split sizes come from the table width, not the row's length, so a program's table, query and
position loads go out together.
Worked example, 8 KV heads, 132 SMs, a table of 9 blocks of 128 (18 tiles of 64), one row at
position 1024: splits_for(8, 18, 132) = 18 programs a KV head, one tile each; split 17 loads
nothing (its m = -inf, l = 0 still count in the merge); tile 16 holds key 1024, so split 16 writes it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from dynspec.errors import DynspecError
from dynspec.runtime.engines.reference.attention import (ITEM_FIELDS, ITEM_TOKENS, Attention, RaggedBatch, SdpaAttention,
                                                         item_count, plan_items, sdpa_attention)

__all__ = ["ATTENTIONS", "ITEM_FIELDS", "ITEM_TOKENS", "LaunchShape", "RaggedAttention", "item_count", "launch_shape", "plan_items",
           "choose_attention", "ragged_attention", "splits_for"]

ATTENTIONS = ("auto", "triton", "sdpa")

TILE = 64                   # keys a tile (divides the CUDA block size, 128)
MAX_QUERIES = 128           # tokens x G of a uniform row above this: the rows go as items
MAX_SPLITS = 64             # the merge loads [splits, hd] partials at once: bound its registers
ITEM_SPLITS = 16            # and of a ragged batch's items (one compiled kernel serves every split count)
HEAD_DIMS = (16, 32, 64, 128)


def _kernel():
    """The jitted kernel (Triton imported here: CPU installs without it never load it)."""
    from dynspec.runtime.engines.reference.ragged_kernel import ragged_paged_attention

    return ragged_paged_attention


_counters: dict = {}
_sm_counts: dict = {}


def _sms(device) -> int:
    if device not in _sm_counts:
        _sm_counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sm_counts[device]


def _counter(device, n: int) -> Tensor:
    """A zeroed int32 counter per (item, KV head), kept per device: the kernel leaves it zeroed, so
    a captured graph may replay it. Grown only outside a capture (graphs keep the pointer they
    captured, so outgrown buffers stay alive in the list)."""
    held = _counters.setdefault(device, [])
    if not held or held[-1].numel() < n:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"ragged attention: {n} merge counters needed inside a CUDA-graph capture; "
                               f"run the shape once before capturing it")
        held.append(torch.zeros(max(n, 4096), dtype=torch.int32, device=device))
    return held[-1]


def splits_for(programs: int, tiles: int, sms: int) -> int:
    """Pure. Splits of each item's keys: about two waves over the SMs, no more than the tiles
    a row can hold, at most MAX_SPLITS. splits_for(8, 17, 132) = 17; splits_for(2048, 17, 132) = 1."""
    return max(1, min(tiles, (2 * sms) // max(1, programs), MAX_SPLITS))


def _fits(nh: int, hd: int, k_pool: Tensor, v_pool: Tensor | None, block_size: int, tile: int = TILE) -> bool:
    kvh = k_pool.shape[0]
    t = min(tile, block_size)
    return (nh % kvh == 0 and hd in HEAD_DIMS and t >= 16 and t & (t - 1) == 0 and block_size % t == 0
            and k_pool.stride(-1) == 1 and (v_pool is None or v_pool.stride(-1) == 1))


def _uniform(batch: RaggedBatch, G: int) -> bool:
    """Rows the kernel takes as items of their own (no item list)."""
    return (batch.items is None and batch.uniform and batch.q_pos.shape[1] * G <= MAX_QUERIES
            and batch.tables.stride(-1) == 1)


class RaggedAttention:
    """attention(q, k_pool, v_pool, batch) of every packed row, decode rows and prompt chunks, in
    one launch. A batch built with items (attention.ragged_batch) or of uniform rows runs the
    kernel; other layouts and head sizes go through gathered SDPA (attention.sdpa_attention).
    model.Block asks `rope_attend` first: RoPE and the K/V write inside the kernel, for uniform rows."""

    def __init__(self, block_size: int):
        self.block_size = block_size

    def __call__(self, q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch) -> Tensor:
        nh, hd = q.shape[1], q.shape[-1]
        if _fits(nh, hd, k_pool, v_pool, self.block_size) and (batch.items is not None or batch.uniform):
            return _launch(q, k_pool, v_pool, batch, self.block_size)
        return sdpa_attention(q, k_pool, v_pool, batch)

    def rope_attend(self, qkv: Tensor, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor,
                    batch: RaggedBatch, n_heads: int) -> Tensor | None:
        """The attention with RoPE and the K/V write in its launch, where the rows are uniform
        (decode steps) and qkv [N, (nh + 2 kvh) * hd], cos, sin [N, 1, hd/2] have unit last
        strides; else None (the caller runs rope_write, then this attention: a batch with items,
        whose chunks read keys that other programs' items bring). Each row's table (batch.tables)
        must cover its new positions, as the engine's decode batches' do (every row's whole table)."""
        kvh, hd = k_pool.shape[0], k_pool.shape[-1]
        if not (_fits(n_heads, hd, k_pool, v_pool, self.block_size) and _uniform(batch, n_heads // kvh)
                and qkv.dim() == 2 and qkv.shape[1] == (n_heads + 2 * kvh) * hd and qkv.stride(-1) == 1
                and cos.shape[0] == qkv.shape[0] == batch.positions.shape[0] and cos.shape[-1] == hd // 2
                and cos.stride(-1) == 1 and sin.stride() == cos.stride() and sin.shape == cos.shape
                and batch.write_index.is_contiguous()):
            return None
        return _launch(None, k_pool, v_pool, batch, self.block_size, rope=(qkv, cos, sin, n_heads))


def choose_attention(attention: str, on_cuda: bool, block_size: int) -> Attention:
    """The attention a caller asked for, chosen once: RaggedAttention (its Triton kernel: "triton",
    or "auto" on CUDA) or SdpaAttention ("sdpa", or "auto" elsewhere)."""
    if attention not in ATTENTIONS:
        raise DynspecError(f"attention {attention!r}: one of {', '.join(ATTENTIONS)}")
    if attention == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise DynspecError("attention 'triton' on CPU runs under Triton's interpreter only: set TRITON_INTERPRET=1 "
                           "before triton is imported")
    ragged = attention == "triton" or attention == "auto" and on_cuda
    return RaggedAttention(block_size) if ragged else SdpaAttention()


def ragged_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch, block_size: int,
                     sms: int | None = None, tile: int = TILE, **launch) -> Tensor:
    """q [N, nh, hd] (RoPE applied), pools [kvh, P, hd] -> [N, nh*hd]: the result of
    attention.sdpa_attention (each query sees its row's positions <= its own), for a batch with
    items or of uniform rows. tile, sms and launch (num_warps, num_stages, per: tiles a program):
    the kernel's launch parameters, for tests."""
    if not _fits(q.shape[1], q.shape[-1], k_pool, v_pool, block_size, tile):
        raise ValueError(f"ragged_attention takes head sizes {HEAD_DIMS} and a power-of-two tile (here {tile}) "
                         f"of at least 16 that divides block_size {block_size}")
    if batch.items is None and not batch.uniform:
        raise ValueError("ragged_attention needs a batch of uniform rows or one with items (ragged_batch)")
    return _launch(q, k_pool, v_pool, batch, block_size, sms, tile, **launch)


def _uniform_items(batch: RaggedBatch) -> tuple[Tensor, Tensor]:
    """(items [3, I], batch.tables) of uniform rows too long for one item each: an item's first
    field is its row of batch.tables (device ops; capturable)."""
    R, T = batch.q_pos.shape
    per = -(-T // ITEM_TOKENS)
    j = torch.arange(R * per, device=batch.q_pos.device)
    row, k = j // per, j % per
    return torch.stack([row, row * T + k * ITEM_TOKENS, (T - k * ITEM_TOKENS).clamp(max=ITEM_TOKENS)]), batch.tables


def _launch(q: Tensor | None, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch, block_size: int,
            sms: int | None = None, tile: int = TILE, rope: tuple | None = None, **launch) -> Tensor:
    kvh, hd = k_pool.shape[0], k_pool.shape[-1]
    if rope is not None:
        qkv, cos, sin, nh = rope
        N = qkv.shape[0]
        widx = batch.write_index
        q = qkv                                                   # Q unused under ROPE
    else:
        N, nh = q.shape[0], q.shape[1]
        q = q.contiguous()
        qkv = cos = sin = widx = q                                # unused without ROPE
    G = nh // kvh
    uniform = batch.items is None and (rope is not None or _uniform(batch, G))
    if rope is not None and (batch.items is not None or not _uniform(batch, G)):
        raise ValueError("RoPE inside the ragged kernel takes uniform rows only (a batch with items: rope_write first)")
    if uniform:
        R, T = batch.q_pos.shape
        items, tables, I = q, batch.tables, R                     # ITEMS unused
    else:
        items, tables = batch.items if batch.items is not None else _uniform_items(batch)
        T, I = ITEM_TOKENS, items.shape[1]
        R = batch.slots.shape[0]                                  # rows: what sizes the splits (an item
                                                                  # of a short row takes one of them)
    if sms is None:
        sms = _sms(k_pool.device) if k_pool.is_cuda else 4
    shape = launch_shape(uniform, I if uniform else R, T, G, kvh, hd, block_size, tables.shape[1], sms, tile,
                         launch.pop("per", None))
    S, per, block_m = shape.splits, shape.per, shape.constants["BLOCK_M"]
    o = torch.empty(N, nh, hd, dtype=k_pool.dtype, device=k_pool.device)
    rows = I * kvh * S * block_m if S > 1 else 1
    part = torch.empty(rows, hd, dtype=torch.float32, device=k_pool.device)
    ml = torch.empty(rows, 2, dtype=torch.float32, device=k_pool.device)
    positions = batch.positions
    _kernel()[(I * kvh, S)](
        q, k_pool, v_pool, tables, positions, o, part, ml, _counter(k_pool.device, I * kvh), items, qkv, cos, sin,
        widx, hd ** -0.5, shape.tiles, I, S, per,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        tables.stride(0), o.stride(0), o.stride(1), qkv.stride(0), cos.stride(0),
        ROPE=rope is not None, IEEE=k_pool.dtype in (torch.float32, torch.float64),
        **shape.constants, **launch)
    return o.view(N, nh * hd)


@dataclass(frozen=True)
class LaunchShape:
    splits: int                   # programs an item (row) and KV head
    per: int                      # tiles a program
    tiles: int                    # tiles of the table width
    constants: dict               # the kernel's constexprs but ROPE and IEEE: one compiled version each


def launch_shape(uniform: bool, rows: int, T: int, G: int, kvh: int, hd: int, block_size: int, width: int,
                 sms: int, tile: int = TILE, per: int | None = None) -> LaunchShape:
    """Pure. The launch over `rows` rows (uniform: R rows of T tokens; else work items of T =
    ITEM_TOKENS) with G queries a token and KV head, over tables `width` blocks wide. Splits come
    from the rows (x kvh programs), about two waves over the SMs. Uniform rows get constant
    splits (static loops); items get runtime ones, each item taking only the splits that hold its
    keys, so every item count shares the one version of (G, kvh, hd, block size, tile).
    Example, 8 KV heads, G 4, 132 SMs, tables of 16 blocks of 128 (32 tiles):
        uniform, 1 row, T 1    splits 32, per 1, BLOCK_M 16
        items of 2 rows        splits 16 (of at most ITEM_SPLITS), per 2, BLOCK_M 16, SPLITS 0"""
    tile = min(tile, block_size)
    tiles = width * block_size // tile
    cap = MAX_SPLITS if uniform else ITEM_SPLITS
    per = per or -(-tiles // min(cap, splits_for(rows * kvh, tiles, sms)))
    S = -(-tiles // per)                      # no program without a tile of the table: 18 tiles, 16 -> per 2, S 9
    mq = 1 << (T * G - 1).bit_length()        # the queries an (item, KV head), to a power of two
    p2 = 1 << (S - 1).bit_length()
    constants = dict(T=T, G=G, KVH=kvh, HD=hd, BS=block_size, TILE_N=tile, BLOCK_M=max(16, mq),
                     SPLITS=S if uniform else 0, PER=per if uniform else 0,
                     SPLITS_P2=p2 if uniform else max(ITEM_SPLITS, p2), UNIFORM=uniform)
    return LaunchShape(S, per, tiles, constants)
