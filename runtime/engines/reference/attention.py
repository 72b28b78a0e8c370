"""Ragged attention over a paged KV cache: each token attends to its own row's cache up to its
own position. See docs/design.md ("The reference engine").

A forward carries N packed tokens in R rows. A row is one sequence's contiguous run of new
tokens: a decode row (K+1 tokens: the pending token and K drafts) or a prompt chunk. Every
sequence owns a slot; its block table maps logical block j to a physical block of the pool.

Worked example, block_size 4, two rows:
    row 0  slot 2, table [7, 3, ...]   tokens at positions 5, 6      (a decode row, K=1)
    row 1  slot 0, table [1, ...]      tokens at positions 0, 1, 2   (a prompt chunk)
    packed tokens      [a5 a6 b0 b1 b2]                                          N = 5
    write_index        [3*4+1, 3*4+2, 1*4+0, 1*4+1, 1*4+2] = [13 14 4 5 6]      flat pool slots
    q_index  [R, Tq]   [[0 1 5], [2 3 4]]       (5 = the zero pad token; Tq = 3)
    q_pos    [R, Tq]   [[5 6 0], [0 1 2]]       (a pad query sits at 0: it sees one key, no NaN)
    kv_index [R, S]    row 0: pool slots of logical positions 0..S-1 = [28..31, 12..15]
    key at logical s is visible to a query at position p iff s <= p.
Reads past a row's length land in the row's own blocks or in the scratch block 0, and the
s <= p rule hides them, so rollback is by length: nothing is cleared.

Two implementations of the same rule:
- `sdpa_attention` (as an object: `SdpaAttention`): gathers each row's blocks and runs SDPA with a
  boolean mask (any device; every step on CPU, the oracle of the other).
- `ragged.RaggedAttention`: every row, decode rows and prompt chunks alike, through one Triton
  kernel over the pool (CUDA; Triton's interpreter in tests).
Both are an `Attention`: attention(q, k_pool, v_pool, batch), and rope_attend(...) with RoPE and
the K/V write inside (None where it does not: the caller runs rope_write, then the attention).
The engine picks one at construction. The ragged kernel's work items (plan_items) are laid out
here, beside the batches that carry them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


ITEM_TOKENS = 4             # tokens of a work item of a ragged batch (G = 4: 16 queries, tl.dot's least M)
ITEM_FIELDS = 3             # rows of an item list: slot, first packed token, tokens


def item_count(lens, item_tokens: int = ITEM_TOKENS) -> int:
    """Items of rows of `lens` tokens: sum of ceil(len / item_tokens). item_count([3, 3, 40], 16) = 5."""
    return int(sum(-(-int(n) // item_tokens) for n in lens))


def plan_items(slots, lens, item_tokens: int = ITEM_TOKENS, pad_to: int | None = None) -> np.ndarray:
    """Pure. [3, I] int64: (slot, first packed token, tokens) of each item of rows packed in
    order, row r holding lens[r] tokens of slots[r]; pad_to: I, the items past the rows' (slot 0,
    first token 0, 0 tokens: programs that do nothing), for a launch of a fixed grid (graphs).
    plan_items([4, 9, 2], [3, 3, 40], 16) = [[4 9 2 2 2], [0 3 6 22 38], [3 3 16 16 8]]."""
    lens = np.asarray(lens, dtype=np.int64)
    per = -(-lens // item_tokens)                                           # [R] items a row
    I = int(per.sum())
    if pad_to is not None and pad_to < I:
        raise ValueError(f"{I} work items do not fit a launch of {pad_to}")
    out = np.zeros((ITEM_FIELDS, I if pad_to is None else pad_to), dtype=np.int64)
    row = np.repeat(np.arange(len(lens)), per)                              # [I] row of each item
    j = np.arange(I) - (np.cumsum(per) - per)[row]                          # [I] index in its row
    first = (np.cumsum(lens) - lens)[row]                                   # [I] its row's first token
    out[0, :I] = np.asarray(slots, dtype=np.int64)[row]
    out[1, :I] = first + j * item_tokens
    out[2, :I] = np.minimum(item_tokens, lens[row] - j * item_tokens)
    return out


def _kv_index(tables: Tensor, block_size: int) -> Tensor:
    """[R, nb] block tables -> [R, nb * block_size] flat pool indices of positions 0..S-1."""
    R, nb = tables.shape
    offs = torch.arange(block_size, device=tables.device)
    return (tables[:, :, None] * block_size + offs).reshape(R, nb * block_size)


@dataclass(frozen=True)
class RaggedBatch:
    """Where one forward's tokens sit in the paged cache (device tensors, built per call).
    q_index, out_index and kv_index are made when first read: a CUDA graph runs every kernel it
    captured, read or not, and the decode graphs' Triton kernel reads none of them."""
    positions: Tensor      # [N] absolute position of each packed token
    write_index: Tensor    # [N] flat pool index (block * block_size + offset) for its K/V
    q_pos: Tensor          # [R, Tq] each query's position (0 for padding)
    slots: Tensor          # [R] each row's slot
    tables: Tensor         # [R, S // block_size] each row's block table (the part read)
    block_size: int
    ragged: tuple[Tensor, Tensor] | None = None   # (q_index, out_index) of rows of different lengths;
                                                  # None: uniform, every row Tq tokens packed row-major
    items: tuple[Tensor, Tensor] | None = None    # (items [3, I], block tables [slots, W]): the ragged
                                                  # kernel's work items (plan_items), by slot

    @property
    def uniform(self) -> bool:
        return self.ragged is None

    @cached_property
    def q_index(self) -> Tensor:
        """[R, Tq] packed token of row r's t-th query; N marks padding."""
        if self.ragged is not None:
            return self.ragged[0]
        R, T = self.q_pos.shape
        return torch.arange(R * T, device=self.q_pos.device).view(R, T)

    @cached_property
    def out_index(self) -> Tensor:
        """[N] packed token -> r * Tq + t."""
        return self.ragged[1] if self.ragged is not None else torch.arange(self.positions.shape[0],
                                                                           device=self.positions.device)

    @cached_property
    def kv_index(self) -> Tensor:
        """[R, S] flat pool index of row r's logical positions 0..S-1."""
        return _kv_index(self.tables, self.block_size)


def uniform_batch(block_tables: Tensor, slots: Tensor, q_pos: Tensor, read_blocks: int,
                  block_size: int) -> RaggedBatch:
    """R rows of T tokens each, row r's tokens at positions q_pos[r] ([R, T]), packed row-major.
    Device ops only (no host sync): the CUDA-graph decode path builds it inside the graph.
    block_tables [slots, max_blocks]; slots [R]; read_blocks: how many blocks each row reads."""
    R, T = q_pos.shape
    tables = block_tables[slots]                                                    # [R, max_blocks]
    blk = torch.gather(tables, 1, q_pos // block_size)                              # [R, T]
    n = R * T
    return RaggedBatch(
        positions=q_pos.reshape(n),
        write_index=(blk * block_size + q_pos % block_size).reshape(n),
        q_pos=q_pos,
        slots=slots,
        tables=tables[:, :read_blocks],
        block_size=block_size,
    )


def to_device(host: Tensor, device) -> Tensor:
    """A host tensor on `device`. CUDA: staged in pinned memory and copied with non_blocking=True,
    in stream order: a pageable copy would hold the host until the work queued before it is done
    (the overlapped loop's step in flight); the caching host allocator keeps the pinned block
    until the copy has run. Elsewhere a plain copy (or the tensor itself on CPU)."""
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def ragged_batch(block_tables: Tensor, slots: list[int], first_pos: list[int], lens: list[int],
                 block_size: int) -> RaggedBatch:
    """Rows of different lengths (decode rows and prompt chunks), laid out on the host with numpy
    (a fixed number of calls for any row count) and copied to the device in one transfer, with no
    device-to-host sync (`to_device`: pinned, so the host does not wait for the work queued before it).
    Row r holds lens[r] tokens at positions first_pos[r].., packed in row order.
    Example, rows (slot 2, pos 5, 2 tokens) and (slot 0, pos 0, 3 tokens): row_of = [0 0 1 1 1],
    t = [0 1 0 1 2], positions = [5 6 0 1 2], out_index = [0 1 3 4 5] (Tq = 3)."""
    dev = block_tables.device
    lens_a = np.asarray(lens, dtype=np.int64)
    R, Tq, n = len(lens), int(lens_a.max()), int(lens_a.sum())
    row_of = np.repeat(np.arange(R), lens_a)                                         # [N] row of each token
    t = np.arange(n) - (np.cumsum(lens_a) - lens_a)[row_of]                          # [N] index in its row
    positions = np.asarray(first_pos, dtype=np.int64)[row_of] + t                    # [N]
    q_index = np.full((R, Tq), n, dtype=np.int64)
    q_index[row_of, t] = np.arange(n)
    q_pos = np.zeros((R, Tq), dtype=np.int64)
    q_pos[row_of, t] = positions
    slots_a = np.asarray(slots, dtype=np.int64)
    items = plan_items(slots_a, lens_a)                                              # [3, I]
    parts = [q_index.ravel(), q_pos.ravel(), row_of * Tq + t, positions, slots_a[row_of], slots_a, items.ravel()]
    flat = to_device(torch.from_numpy(np.concatenate(parts)), dev)                   # the one copy
    q_index_d, q_pos_d, out_index, positions_d, token_slot, slots_t, items_d = flat.split([len(x) for x in parts])
    read = -(-(int(positions.max()) + 1) // block_size)                             # blocks to read
    tables = block_tables[slots_t]
    blk = block_tables[token_slot, positions_d // block_size]
    return RaggedBatch(
        positions=positions_d,
        write_index=blk * block_size + positions_d % block_size,
        q_pos=q_pos_d.view(R, Tq),
        slots=slots_t,
        tables=tables[:, :read],
        block_size=block_size,
        ragged=(q_index_d.view(R, Tq), out_index),
        items=(items_d.view(len(items), -1), block_tables),
    )


def _rows(q: Tensor, batch: RaggedBatch) -> Tensor:
    """Packed q [N, nh, hd] -> per-row queries [R, Tq, nh, hd] (padding queries are zeros)."""
    padded = torch.cat([q, q.new_zeros(1, *q.shape[1:])])                             # [N+1, nh, hd]
    return padded[batch.q_index]


def sdpa_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch) -> Tensor:
    """q [N, nh, hd] (RoPE applied), pools [kvh, P, hd] -> [N, nh*hd].
    GQA without copying K/V: the g = nh/kvh query heads of each KV head become g*Tq query rows
    of one attention over that head (head h uses KV head h // g, as transformers' repeat_kv)."""
    N, nh, hd = q.shape
    kvh = k_pool.shape[0]
    g = nh // kvh
    R, Tq = batch.q_index.shape
    S = batch.kv_index.shape[1]
    qr = _rows(q, batch).view(R, Tq, kvh, g, hd).permute(0, 2, 3, 1, 4).reshape(R, kvh, g * Tq, hd)
    k = k_pool[:, batch.kv_index].transpose(0, 1)                                      # [R, kvh, S, hd]
    v = v_pool[:, batch.kv_index].transpose(0, 1)
    keys = torch.arange(S, device=q.device)
    mask = keys.view(1, 1, S) <= batch.q_pos.view(R, Tq, 1)                            # [R, Tq, S]
    mask = mask.unsqueeze(1).expand(R, g, Tq, S).reshape(R, 1, g * Tq, S)
    o = F.scaled_dot_product_attention(qr, k, v, attn_mask=mask)                       # [R, kvh, g*Tq, hd]
    o = o.view(R, kvh, g, Tq, hd).permute(0, 3, 1, 2, 4).reshape(R * Tq, nh * hd)
    return o[batch.out_index]


@runtime_checkable
class Attention(Protocol):
    """What a forward's layers call: the attention of packed q over the pools, and the fused form."""

    def __call__(self, q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch) -> Tensor: ...

    def rope_attend(self, qkv: Tensor, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor,
                    batch: RaggedBatch, n_heads: int) -> Tensor | None: ...


class SdpaAttention:
    """sdpa_attention as an Attention: no fused form (rope_attend None: the layer writes RoPE and
    K/V first, layer_ops.rope_write)."""

    def __call__(self, q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch) -> Tensor:
        return sdpa_attention(q, k_pool, v_pool, batch)

    def rope_attend(self, qkv, cos, sin, k_pool, v_pool, batch, n_heads) -> None:
        return None


def as_attention(attention) -> Attention:
    """An Attention from what a caller passed: itself, or a bare (q, k_pool, v_pool, batch)
    function (tests, recorders) with no fused form."""
    return attention if isinstance(attention, Attention) else _Plain(attention)


@dataclass(frozen=True)
class _Plain(SdpaAttention):
    fn: object

    def __call__(self, q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch) -> Tensor:
        return self.fn(q, k_pool, v_pool, batch)
