"""Prompt chunks' attention as one packed query sequence: FlexAttention over the paged pool,
each block of 128 packed queries visiting only the blocks of the rows its tokens belong to.
Used for the chunks of mixed iterations (attention.SplitRows) and by mixed_graphs.py, whose
buffers hold the same block lists. See docs/design.md ("Graphs for mixed iterations").

Worked example, block_size 4, q blocks of 4: chunk a = 6 tokens of a slot with table (7, 3) at
positions 0..5, chunk b = 2 tokens of a slot with table (1,) at positions 0..1:
    packed tokens   a0 a1 a2 a3 | a4 a5 b0 b1
    q block 0 reads [7]; q block 1 reads [7, 3, 1]; inside them `attention.sees` applies the
    token's own slot and s <= p.

One compiled FlexAttention per pool layout (target, draft) serves every chunk shape: the queries
are padded to whole q blocks, at least MIN_Q_BLOCKS (3 tokens -> 256 queries, 300 -> 384), and the
mask's per-query tensors are fresh, at storage offset 0. Dynamo specialises a size of 1 and a
storage offset of 0 or 1, and inductor chose its kernel by query length (below 128 or not), so
without that a chunk of 128 tokens, or one at the start of the packed rows, compiled anew inside
a served step (1-2 s on the H200). Padding queries sit at position -1 and see nothing.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .attention import RaggedBatch, _flex, sees, to_device

MIN_Q_BLOCKS = 2


def q_blocks(tokens: int, q_block: int = 128) -> int:
    """q blocks the chunk attention of `tokens` packed queries runs at: whole blocks, at least
    MIN_Q_BLOCKS. q_blocks(3) = 2, q_blocks(256) = 2, q_blocks(300) = 3."""
    return max(MIN_Q_BLOCKS, -(-tokens // q_block))


def packed_kv_blocks(rows, block_size: int, q_block: int = 128) -> list[list[int]]:
    """Pure. rows: (block table, first position, token count) of each prompt chunk, in packed
    order -> for each q block of q_block packed tokens, the physical blocks its tokens read
    (each row's table up to the block of its last token in that q block).
    Example, block_size 4, q_block 4: rows ((7, 3), 0, 6), ((1,), 0, 2), tokens a0..a5 b0 b1:
        q block 0  a0..a3          reads [7]
        q block 1  a4 a5 b0 b1     reads [7, 3, 1]"""
    out: list[list[int]] = [[] for _ in range(-(-sum(n for _, _, n in rows) // q_block))]
    i = 0
    for table, p0, n in rows:
        t = 0
        while t < n:
            m = (i + t) // q_block
            end = min(n, (m + 1) * q_block - i)       # this row's tokens t..end-1 fall in q block m
            out[m].extend(table[: (p0 + end - 1) // block_size + 1])
            t = end
        i += n
    return [list(dict.fromkeys(x)) for x in out]    # once each: rows of one slot (padding) share blocks


class PackedChunks:
    """attention(q, k_pool, v_pool, batch) of prompt chunks on CUDA: FlexAttention over the pool
    with the chunks' packed tokens as one query sequence ([1, nh, N, hd]); q block m (128 packed
    tokens) visits only the blocks `packed_kv_blocks` lists for it, and mask_mod applies the token's
    own slot and s <= p inside them. One launch a layer, where gathered SDPA is about a dozen plus a
    copy of every row's blocks. The mask is built on the host, once per step and pool length, and serves every layer and the
    draft's pass over the same chunks."""

    Q_BLOCK = 128                 # a multiple of the kernels' BLOCK_M

    def __init__(self, batch: RaggedBatch, rows, token_slot: Tensor, owner: Tensor, logical: Tensor,
                 block_size: int):
        """rows as `packed_kv_blocks`; token_slot [N] the slot of each packed token (device)."""
        self.batch, self.token_slot, self.owner, self.logical = batch, token_slot, owner, logical
        self.block_size, self.lists = block_size, packed_kv_blocks(rows, block_size, self.Q_BLOCK)
        self._kv: dict[int, tuple[Tensor, Tensor]] = {}
        self._masks: dict[int, object] = {}

    def kv_blocks(self, blocks: int) -> tuple[Tensor, Tensor]:
        """`kv_block_tensors` of the lists over a pool of `blocks` blocks, copied once per size
        (the masks and mixed_graphs.py's buffers share the copy)."""
        if blocks not in self._kv:
            self._kv[blocks] = kv_block_tensors(self.lists, blocks, self.token_slot.device)
        return self._kv[blocks]

    def mask(self, pool_len: int):
        """The block mask over a pool of pool_len positions (built once per length; the engine
        builds the target's before the step's first kernel, so its copy does not wait)."""
        if pool_len not in self._masks:
            self._masks[pool_len] = packed_block_mask(*self.kv_blocks(pool_len // self.block_size),
                                                      self.token_slot, self.batch.positions, self.owner,
                                                      self.logical, self.block_size, pool_len, self.Q_BLOCK)
        return self._masks[pool_len]

    def __call__(self, q: Tensor, k_pool: Tensor, v_pool: Tensor, batch: RaggedBatch) -> Tensor:
        if batch is not self.batch:
            raise ValueError("PackedChunks attends the batch it was built for only")
        return packed_attention(q, k_pool, v_pool, self.mask(k_pool.shape[1]))


def kv_block_tensors(lists: list[list[int]], blocks: int, device) -> tuple[Tensor, Tensor]:
    """`packed_kv_blocks`' lists -> (num [nqb] int32, idx [nqb, blocks] int32) on device, in one copy;
    nqb = max(len(lists), MIN_Q_BLOCKS), the padding q blocks visiting no block."""
    nqb = max(len(lists), MIN_Q_BLOCKS)
    host = torch.zeros(nqb, 1 + blocks, dtype=torch.int32)
    for m, x in enumerate(lists):
        host[m, 0] = len(x)
        host[m, 1: 1 + len(x)] = torch.tensor(x, dtype=torch.int32)
    dev = to_device(host, device)                        # pinned: the host does not wait (attention.to_device)
    return dev[:, 0], dev[:, 1:]


def packed_block_mask(num: Tensor, idx: Tensor, token_slot: Tensor, positions: Tensor, owner: Tensor,
                      logical: Tensor, block_size: int, pool_len: int, q_block: int = PackedChunks.Q_BLOCK):
    """The BlockMask of packed query tokens over the pool: q block m (q_block tokens) visits the
    num[m] blocks idx[m, :num[m]]; inside them token i sees pool position s of block blk iff
    owner[blk] == token_slot[i] and its logical position <= positions[i]. A token of a slot
    that owns no block (the padding slot) sees nothing; FlexAttention gives it zeros.
    num [nqb], idx [nqb, pool_len // block_size]; token_slot, positions [L], nqb = q_blocks(L).
    The mask covers nqb x q_block queries (packed_attention pads q to that); the padding ones
    sit at position -1."""
    from torch.nn.attention.flex_attention import BlockMask

    bs, nqb, L = block_size, num.shape[0], positions.shape[0]
    if nqb != q_blocks(L, q_block):
        raise ValueError(f"{L} packed queries run at {q_blocks(L, q_block)} q blocks of {q_block}; {nqb} given")
    Lp = nqb * q_block
    slot_of = token_slot.new_zeros(Lp)              # fresh: offset 0 whatever view the caller holds
    slot_of[:L] = token_slot
    pos_of = positions.new_full((Lp,), -1)
    pos_of[:L] = positions

    def mask_mod(b, h, qi, ki):
        return sees(owner, logical, bs, slot_of[qi], pos_of[qi], ki)

    return BlockMask.from_kv_blocks(num.view(1, 1, nqb), idx.view(1, 1, nqb, -1), BLOCK_SIZE=(q_block, bs),
                                    mask_mod=mask_mod, seq_lengths=(Lp, pool_len), compute_q_blocks=False)


FORCE_MAIN_KERNEL = {"FORCE_USE_FLEX_ATTENTION": True}


def packed_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, mask) -> Tensor:
    """q [L, nh, hd] packed tokens as one query sequence, `packed_block_mask` -> [L, nh*hd]."""
    L, nh, hd = q.shape
    # padded to the mask's Lp queries and contiguous (a pad of 0 returns the strided view): the
    # target's q ([L, nh, hd] rows), the draft's and slices of either then share one compiled
    # version (strides are guarded); one copy
    qr = torch.nn.functional.pad(q.transpose(0, 1), (0, 0, 0, mask.seq_lengths[0] - L)).contiguous()[None]
    torch._dynamo.mark_static(qr, 0)
    torch._dynamo.mark_static(qr, 1)
    # the main kernel always: below 128 queries inductor would pick its decoding kernel, whose
    # BLOCK_M = next_pow2(L x heads per KV head) (L=126, 4 -> 512) must divide the 128-query sparse
    # block; no config then fits and the lowering fails (NoValidChoicesError: H200, 8B shape, bf16)
    o = _flex()(qr, k_pool[None], v_pool[None], block_mask=mask, enable_gqa=True,
                kernel_options=FORCE_MAIN_KERNEL)
    return o[0, :, :L].transpose(0, 1).reshape(L, nh * hd)
