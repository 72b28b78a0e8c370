"""Decode rows' attention over the paged pool as one Triton kernel (CUDA; Triton's interpreter in
CPU tests). See docs/design.md ("Decode attention kernel").

One launch does a split-KV decode's both halves: each program attends one (row, KV head) over a
share of that row's used tiles, writes its partial (m, l, acc), and the last program of the
(row, KV head) to finish (an atomic counter it resets) merges the partials.

Grid (R * kvh, S). Program (r*kvh + h, s) holds the M = T*G queries of row r that read KV head h
(G = nh / kvh query heads, T tokens a row), query m -> token m // G, head h*G + m % G.
Worked example, 8 KV heads, 132 SMs, a table of 9 blocks of 128 (18 tiles of 64), a row at
position 1024: S = splits_for(8, 18, 132) = 18 programs for each KV head, PER = ceil(18 / 18) = 1
tile each; the row's keys 0..1024 fill tiles 0..16, so split 17 loads nothing (its m = -inf,
l = 0 still count in the merge). Tile j is keys 64j..64j+63, in logical block j*64 // 128, read
through the row's block table. Splits come from the table's width, not the row's length, so a
program's table, query and position loads go out together.

paged_decode_rope_attention (PagedDecode.rope_attend, which model.Block asks first) is model.rope_write
and this kernel in one launch: from qkv [N, (nh + 2 kvh) * hd] each program rotates its queries, and the
program whose keys hold a new token's position writes its rotated K and its V at batch.write_index,
then reads its tiles. Worked example, the one above: the row's new key 1024 is tile 16's, so split 16
writes it; the other 17 splits only rotate their 4 queries.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .attention import RaggedBatch, sdpa_attention

TILE = 64                   # keys a tile (divides the CUDA block size, 128)
MAX_QUERIES = 64            # T * G above this: not a decode row, the caller's fallback runs
MAX_SPLITS = 64             # the merge loads [splits, hd] partials at once: bound its registers


def _kernel():
    """The jitted kernel (Triton imported here: CPU installs without it never load it)."""
    from .paged_decode_kernel import paged_decode

    return paged_decode


_counters: dict = {}
_sm_counts: dict = {}


def _sms(device) -> int:
    if device not in _sm_counts:
        _sm_counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sm_counts[device]


def _counter(device, n: int) -> Tensor:
    """A zeroed int32 counter per (row, KV head), kept per device: the kernel leaves it zeroed, so a
    captured graph may replay it. Grown only outside a capture (graphs keep the pointer they
    captured, so outgrown buffers stay alive in the list)."""
    held = _counters.setdefault(device, [])
    if not held or held[-1].numel() < n:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"paged_decode: {n} merge counters needed inside a CUDA-graph capture; "
                               f"run the shape once before capturing it")
        held.append(torch.zeros(max(n, 2048), dtype=torch.int32, device=device))
    return held[-1]


def splits_for(rows_x_heads: int, tiles: int, sms: int) -> int:
    """Pure. Programs per (row, KV head): about two waves over the SMs, no more than the tiles
    a row can hold, at most MAX_SPLITS. splits_for(8, 17, 132) = 17; splits_for(2048, 17, 132) = 1."""
    return max(1, min(tiles, (2 * sms) // rows_x_heads, MAX_SPLITS))


def tile_fits(tile: int, block_size: int) -> bool:
    """Pure. A tile of keys the kernel can take: a power of two >= 16 dividing the block size."""
    return tile >= 16 and tile & (tile - 1) == 0 and block_size % tile == 0


def supports(q: Tensor, k_pool: Tensor, batch: RaggedBatch, block_size: int, v_pool: Tensor | None = None,
             tile: int = TILE) -> bool:
    """Uniform rows of few queries per KV head, with the head size, tile and layouts the kernel
    was checked for on the H200 (head sizes 16 and 128; tests/test_gpu.py)."""
    return _fits(q.shape[1], q.shape[-1], k_pool, v_pool, batch, block_size, tile)


def _fits(nh: int, hd: int, k_pool: Tensor, v_pool: Tensor | None, batch: RaggedBatch, block_size: int,
          tile: int = TILE) -> bool:
    T = batch.q_pos.shape[1]
    kvh = k_pool.shape[0]
    return (batch.uniform and nh % kvh == 0 and T * (nh // kvh) <= MAX_QUERIES and hd in (16, 32, 64, 128)
            and tile_fits(min(tile, block_size), block_size) and k_pool.stride(-1) == 1 and (v_pool is None or v_pool.stride(-1) == 1)
            and batch.tables.stride(-1) == 1)


def rope_fits(qkv: Tensor, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch,
              block_size: int, n_heads: int) -> bool:
    """`supports` for paged_decode_rope_attention: also qkv [N, (nh + 2 kvh) * hd] and cos, sin
    [N, 1, hd/2] of one layout, each with unit last stride, and a packed write_index. Not checked (a device value): that each
    row's table (batch.tables, the part read) covers its new positions, as the engine's decode
    batches' do (every row's whole table); a key past it would not be written, where rope_write writes
    it."""
    kvh, hd = k_pool.shape[0], k_pool.shape[-1]
    return (qkv.dim() == 2 and qkv.shape[1] == (n_heads + 2 * kvh) * hd and qkv.stride(-1) == 1
            and cos.shape[0] == qkv.shape[0] == batch.positions.shape[0] and cos.shape[-1] == hd // 2
            and cos.stride(-1) == 1 and sin.stride() == cos.stride() and sin.shape == cos.shape
            and batch.write_index.is_contiguous() and _fits(n_heads, hd, k_pool, v_pool, batch, block_size))


class PagedDecode:
    """attention(q, k_pool, v_pool, batch) of decode rows: the kernel for the rows it `supports`;
    rows it refuses (more than MAX_QUERIES queries a KV head, another head size or layout) go
    through gathered SDPA (attention.sdpa_attention). model.Block asks `rope_attend` first: RoPE
    and the K/V write inside the kernel, for the rows `rope_fits`."""

    def __init__(self, block_size: int):
        self.block_size = block_size

    def __call__(self, q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch) -> Tensor:
        if supports(q, k_pool, batch, self.block_size, v_pool):
            return _launch(q, k_pool, v_pool, batch, self.block_size)
        return sdpa_attention(q, k_pool, v_pool, batch)

    def rope_attend(self, qkv: Tensor, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch,
                    n_heads: int) -> Tensor | None:
        """paged_decode_rope_attention where `rope_fits`, else None (the caller runs rope_write
        and this attention)."""
        if not rope_fits(qkv, cos, sin, k_pool, v_pool, batch, self.block_size, n_heads):
            return None
        return _launch(None, k_pool, v_pool, batch, self.block_size, rope=(qkv, cos, sin, n_heads))


def paged_decode_rope_attention(qkv: Tensor, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor,
                                batch: RaggedBatch, block_size: int, n_heads: int, sms: int | None = None) -> Tensor:
    """model.rope_write then paged_decode_attention, in one launch: qkv [N, (nh + 2 kvh) * hd] unrotated,
    cos, sin [N, 1, hd/2] -> [N, nh*hd]; each token's K (with RoPE) and V are written into the pools at
    batch.write_index, as rope_write writes them."""
    if not rope_fits(qkv, cos, sin, k_pool, v_pool, batch, block_size, n_heads):
        raise ValueError("paged_decode_rope_attention takes qkv [N, (nh + 2 kvh) * hd] and cos, sin [N, 1, hd/2] "
                         "of uniform decode rows (see rope_fits)")
    return _launch(None, k_pool, v_pool, batch, block_size, sms, rope=(qkv, cos, sin, n_heads))


def paged_decode_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch, block_size: int,
                           sms: int | None = None, tile: int = TILE, **launch) -> Tensor:
    """q [R*T, nh, hd] (RoPE applied), pools [kvh, P, hd], a uniform batch -> [R*T, nh*hd]; the
    same result as attention.sdpa_attention (each query sees its row's positions <= its own).
    tile (keys a tile, dividing block_size) and launch (num_warps, num_stages, per: tiles a program
    instead of splits_for's share): the kernel's launch parameters, for tests."""
    if not supports(q, k_pool, batch, block_size, v_pool, tile):
        raise ValueError(f"paged_decode_attention takes uniform decode rows and a tile (here {tile}) that "
                         f"tile_fits block_size {block_size} (see supports)")
    return _launch(q, k_pool, v_pool, batch, block_size, sms, tile, **launch)


def _launch(q: Tensor | None, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch, block_size: int,
            sms: int | None = None, tile: int = TILE, rope: tuple | None = None, **launch) -> Tensor:
    """paged_decode_attention once `supports` holds (PagedDecode checks it before calling); with
    rope = (qkv, cos, sin, n_heads) and q None, paged_decode_rope_attention once `rope_fits` holds."""
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
    R, T = batch.q_pos.shape
    G = nh // kvh
    tile = min(tile, block_size)
    tiles = batch.tables.shape[1] * block_size // tile
    if sms is None:
        sms = _sms(q.device) if q.is_cuda else 4
    per = launch.pop("per", None) or -(-tiles // splits_for(R * kvh, tiles, sms))   # tiles a program
    S = -(-tiles // per)                      # no program without a tile of the table: 18 tiles, 16 -> per 2, S 9
    mq = 1 << (T * G - 1).bit_length()        # the queries a (row, KV head), to a power of two
    block_m = max(16, mq)                     # tl.dot's smallest M
    o = torch.empty(N, nh, hd, dtype=k_pool.dtype, device=q.device)
    part = torch.empty(R * kvh * S * block_m, hd, dtype=torch.float32, device=q.device)
    ml = torch.empty(R * kvh * S * block_m, 2, dtype=torch.float32, device=q.device)
    qpos, tables = batch.q_pos.contiguous(), batch.tables                      # int64, read as they are
    _kernel()[(R * kvh, S)](
        q, k_pool, v_pool, tables, qpos, o, part, ml, _counter(q.device, R * kvh), qkv, cos, sin, widx,
        hd ** -0.5, tiles,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        tables.stride(0), o.stride(0), o.stride(1), qkv.stride(0), cos.stride(0),
        T=T, G=G, KVH=kvh, HD=hd, BS=block_size, TILE_N=tile, BLOCK_M=block_m, SPLITS=S,
        SPLITS_P2=1 << (S - 1).bit_length(), PER=per, MQ=mq, ROPE=rope is not None,
        IEEE=k_pool.dtype in (torch.float32, torch.float64), **launch)
    return o.view(N, nh * hd)
