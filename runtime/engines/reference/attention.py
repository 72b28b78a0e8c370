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

Three implementations of the same rule, and `SplitRows`, which gives a mixed iteration's decode
rows and prompt chunks each their own:
- `sdpa_attention`: gathers each row's blocks and runs SDPA with a boolean mask (any device;
  the CPU path and the GPU's mixed iterations).
- `flex_attention_paged`: FlexAttention straight over the pool, with a block mask listing each
  row's physical blocks, so blocks past a row's length are never read (the GPU decode path).
- `packed.PackedChunks`: FlexAttention with prompt chunks' packed tokens as one query sequence,
  each block of 128 queries visiting its rows' blocks only (prompt chunks under attention "flex").
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import Tensor


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


def ragged_batch(block_tables: Tensor, slots: list[int], first_pos: list[int], lens: list[int],
                 block_size: int) -> RaggedBatch:
    """Rows of different lengths (decode rows and prompt chunks), laid out on the host with numpy
    (a fixed number of calls for any row count) and copied to the device in one transfer, with no
    device-to-host sync (the pageable copy still waits for work already queued on the stream).
    Row r holds lens[r] tokens at positions first_pos[r].., packed in row order.
    Example, rows (slot 2, pos 5, 2 tokens) and (slot 0, pos 0, 3 tokens): row_of = [0 0 1 1 1],
    t = [0 1 0 1 2], positions = [5 6 0 1 2], out_index = [0 1 3 4 5] (Tq = 3)."""
    import numpy as np

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
    parts = [q_index.ravel(), q_pos.ravel(), row_of * Tq + t, positions, slots_a[row_of], slots_a]
    flat = torch.from_numpy(np.concatenate(parts)).to(dev)                           # the one copy
    q_index_d, q_pos_d, out_index, positions_d, token_slot, slots_t = flat.split([len(x) for x in parts])
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
    )


def write_kv(k_pool: Tensor, v_pool: Tensor, k: Tensor, v: Tensor, batch: RaggedBatch) -> None:
    """k_pool, v_pool [kvh, blocks*block_size, hd]; k, v [N, kvh, hd] -> written at write_index."""
    k_pool.index_copy_(1, batch.write_index, k.transpose(0, 1))
    v_pool.index_copy_(1, batch.write_index, v.transpose(0, 1))


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


_compiled_flex = None


FLEX_RECOMPILE_LIMIT = 128


def _flex():
    """FlexAttention, compiled on CUDA (eager elsewhere: the reference math). Default dynamic, but
    `flex_attention_paged` marks the batch (row) dimension static: inductor lowers to its split-KV
    decoding kernel only when batch and heads are static (`_use_flex_decoding`); with a symbolic
    batch it pads each row's few queries to a 128-row tile instead. H200, one layer, 512 context
    (benchmarks/results/h200_flex_decode_static.json): b=16 153 -> 26 us, b=64 555 -> 67 us.
    So there is one version per row bucket (every caller pads its rows to one: decode graphs and
    mixed iterations alike), times T=1 and a symbolic T for verify windows, times pool layouts:
    about 2 x 10 buckets for the default max batch. Past dynamo's recompile limit (default 8) flex
    would silently run eagerly, materialising scores over the whole pool, so the limit is raised
    and fullgraph=True makes any fallback an error instead."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if _compiled_flex is None and torch.cuda.is_available():
        from torch import _dynamo

        cfg = _dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, name, max(getattr(cfg, name), FLEX_RECOMPILE_LIMIT))
        _compiled_flex = torch.compile(flex_attention, fullgraph=True)
    return _compiled_flex or flex_attention


def sees(owner: Tensor, logical: Tensor, block_size: int, slot, pos, ki):
    """The one visibility rule of every FlexAttention mask here: pool position ki (block ki //
    block_size) is visible to a query of `slot` at position `pos` iff its block belongs to that
    slot and its logical position is <= pos. A slot that owns no block (padding) sees nothing."""
    blk = ki // block_size
    return (owner[blk] == slot) & (logical[blk] * block_size + ki % block_size <= pos)


def paged_block_mask(batch: RaggedBatch, owner: Tensor, logical: Tensor, block_size: int, pool_len: int):
    """The FlexAttention BlockMask of `batch` over a pool of pool_len positions. owner [blocks] is
    the slot holding each physical block (-1 if free), logical [blocks] its index in that slot's
    table. The mask lists, for row r, the physical blocks of its table it reads; mask_mod applies
    s <= p inside them. It depends on the batch alone, so one step builds it once and every layer
    reuses it (`PerStepMasks`). Built in every layer, its max / clamp / fill / index kernels were a
    visible share of a b=1 decode step (H200 kernel table: benchmarks/results/h200x2_tp1_kernels.json)."""
    from torch.nn.attention.flex_attention import BlockMask

    R, Tq = batch.q_index.shape
    blocks = pool_len // block_size
    nb = batch.tables.shape[1]
    slots, q_pos = batch.slots, batch.q_pos
    qb = 128 * -(-Tq // 128)          # one query block per row; a multiple of the kernels' BLOCK_M
    used = torch.clamp(q_pos.max(dim=1).values // block_size + 1, max=nb)            # [R] blocks up to the row's end
    num = used.to(torch.int32).view(R, 1, 1)
    idx = torch.zeros(R, 1, 1, blocks, dtype=torch.int32, device=batch.tables.device)
    idx[:, 0, 0, :nb] = batch.tables.to(torch.int32)

    def mask_mod(b, h, qi, ki):
        return sees(owner, logical, block_size, slots[b], q_pos[b, qi], ki)

    return BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(qb, block_size), mask_mod=mask_mod,
                                    seq_lengths=(Tq, pool_len), compute_q_blocks=False)   # forward only


class PerStepMasks:
    """attention(q, k_pool, v_pool, batch) for one step: FlexAttention whose block mask is built
    the first time a (batch, pool length) is seen and reused by every later layer of the step:
    the target's 32 layers, and the draft's catch-up over the same verify batch (target and draft
    pools share the block tables, owner and logical maps). Another batch gets its own mask."""

    def __init__(self, owner: Tensor, logical: Tensor, block_size: int):
        self.owner, self.logical, self.block_size = owner, logical, block_size
        self._masks: list = []          # [(batch, pool_len, mask)]: a few per step, compared by identity

    def __call__(self, q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch) -> Tensor:
        P = k_pool.shape[1]
        for b, p, mask in self._masks:
            if b is batch and p == P:
                break
        else:
            mask = paged_block_mask(batch, self.owner, self.logical, self.block_size, P)
            self._masks.append((batch, P, mask))
        return flex_attention_paged(q, k_pool, v_pool, batch, self.owner, self.logical, self.block_size, mask)


def flex_attention_paged(q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch, owner: Tensor,
                         logical: Tensor, block_size: int, mask=None, flex=None, static_batch: bool = True,
                         **flex_kwargs) -> Tensor:
    """FlexAttention over the whole pool with `paged_block_mask` (built here unless given).
    Same inputs and result as `sdpa_attention`. flex / flex_kwargs: another compile of
    flex_attention, and e.g. kernel_options; static_batch=False leaves the row count to automatic
    dynamic shapes (benchmarks/flex_decode.py compares them; see `_flex`)."""
    if mask is None:
        mask = paged_block_mask(batch, owner, logical, block_size, k_pool.shape[1])
    if batch.uniform:             # decode rows / verify windows: [R*Tq, nh, hd] is already [R, Tq, nh, hd]
        qr = q.reshape(*batch.q_pos.shape, *q.shape[1:]).transpose(1, 2)               # [R, nh, Tq, hd]
    else:
        qr = _rows(q, batch).transpose(1, 2)                                           # [R, nh, Tq, hd]
    if static_batch:
        torch._dynamo.mark_static(qr, 0)           # R: one compile per row bucket (see _flex)
        torch._dynamo.mark_static(qr, 1)           # heads: the decoding kernel needs them static too
    o = (flex or _flex())(qr, k_pool[None], v_pool[None], block_mask=mask, enable_gqa=True,
                          **flex_kwargs)                                                  # [R, nh, Tq, hd]
    R, nh, Tq, hd = o.shape
    o = o.transpose(1, 2).reshape(R * Tq, nh * hd)
    return o if batch.uniform else o[batch.out_index]


@dataclass(frozen=True)
class SplitRows:
    """attention(q, k_pool, v_pool, batch) of a mixed iteration's forward, whose first nd packed
    tokens are b uniform decode rows (T = K+1 tokens each) and the rest prompt chunks:
        decode rows   `decode` over `decode_batch` (FlexAttention over the pool on CUDA)
        prompt chunks `chunk` over `chunk_batch`: packed.PackedChunks when the engine's attention
                      is "flex" (CUDA's default), else gathered SDPA over the chunks' own rows
    One gathered SDPA over every row would copy each decode row's whole context in every layer
    (b=64 rows of 1000 tokens, 8 KV heads of 128, bf16: 262 MB a layer). Called for `whole` only:
    the target's layers and the draft's catch-up over the same packed tokens.
    decode_batch may hold B >= b rows: rows b..B-1 pad to the row bucket (the engine's padding
    slot, reading only the scratch block), so that FlexAttention sees a batch it has compiled for.
    Example b=3, T=2, B=4: q[:6] and two zero queries go in, the first 6 outputs come back."""
    whole: RaggedBatch
    nd: int                       # packed tokens of the decode rows (b x T)
    decode: object                # attention(q, k_pool, v_pool, batch) for the decode rows
    decode_batch: RaggedBatch     # B uniform rows of T tokens, the first b of them real
    chunk_batch: RaggedBatch
    chunk: object = sdpa_attention   # attention(q, k_pool, v_pool, chunk_batch) for the prompt chunks

    def __call__(self, q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch) -> Tensor:
        if batch is not self.whole:
            raise ValueError("SplitRows attends the batch it was built for only")
        nd, pad = self.nd, self.decode_batch.q_pos.numel() - self.nd
        qd = torch.cat([q[:nd], q.new_zeros(pad, *q.shape[1:])]) if pad else q[:nd]      # [B*T, nh, hd]
        return torch.cat([self.decode(qd, k_pool, v_pool, self.decode_batch)[:nd],
                          self.chunk(q[nd:], k_pool, v_pool, self.chunk_batch)])           # [N, nh*hd]
