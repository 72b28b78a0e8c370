"""The reference engine's target model: a Llama-family decoder in a few hundred lines.

gpt-fast style: fused q/k/v and gate/up weights, and a paged KV cache (attention.py,
kv_cache.py). `run` takes packed tokens of several rows (decode rows and prompt chunks) and
is CUDA-graph capturable for a fixed batch layout: no `.item()`, no host sync and no
data-dependent Python branches.

Cache semantics (the engine relies on these):
- Each sequence owns a slot whose block table maps its positions to pool blocks. A call
  writes the K/V of every input token at its absolute position.
- A query at position p attends to positions <= p of its own sequence. Entries beyond a
  sequence's length are stale but never read by a query that does not own them, so rolling a
  request back is just "write from the accepted length on" (no clearing).

Tensor parallelism: head counts are per instance (`Block.n_local_heads`, `n_local_kv_heads`),
and the lm_head output and the two per-layer reduction points go through `Target.collectives`
(identity on one device). Each reduction point is joined to the norm after it:
`Collectives.add_rms_norm(part, r, ...)` sums the row-parallel output `part` over the ranks, adds
the residual r and normalises (one launch with TP's one-shot all-reduce). So the stream between
layers is (x, r) with the stream = x + (r summed over the ranks): r is down_proj's partial output.

model_config.py reads the HF config (TargetConfig); layer_ops.py holds the elementwise glue
(RMSNorm, RoPE, `Kernels`). The cache set-up helpers here are shared with the EAGLE-3 draft in
draft.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dynspec.runtime.engines.reference.attention import SdpaAttention, RaggedBatch, as_attention, uniform_batch
from dynspec.runtime.engines.reference.layer_ops import Kernels, first_max, rope_tables
from dynspec.runtime.engines.reference.model_config import TargetConfig


DEFAULT_BLOCK_SIZE = 16


def setup_paged_cache(m: nn.Module, c, like: Tensor, layers: int | None, num_blocks: int, block_size: int,
                      max_seq_len: int) -> None:
    """Give `m` zeroed k_cache/v_cache pools [layers, kvh, num_blocks*block_size, hd] (no layer
    axis when layers is None) and RoPE tables for max_seq_len, on `like`'s device and dtype.
    Shared by the target and the draft; they use the same block tables."""
    shape = (c.num_kv_heads, num_blocks * block_size, c.head_dim)
    shape = shape if layers is None else (layers, *shape)
    m.k_cache = torch.zeros(shape, device=like.device, dtype=like.dtype)
    m.v_cache = torch.zeros(shape, device=like.device, dtype=like.dtype)
    m.rope_cos, m.rope_sin = rope_tables(c.head_dim, c.rope_theta, c.rope_scaling, max_seq_len,
                                         like.device, like.dtype)
    m.block_size, m.max_seq_len = block_size, max_seq_len


def setup_row_cache(m: nn.Module, c, like: Tensor, layers: int | None, max_batch: int, max_seq_len: int) -> None:
    """A pool in which row r owns blocks 1 + r*nb .. (r+1)*nb (block 0 is scratch), for the
    row-major `forward(tokens [B, T], positions [B, T], row0=...)` of tests and tools."""
    bs = DEFAULT_BLOCK_SIZE
    nb = -(-max_seq_len // bs)
    setup_paged_cache(m, c, like, layers, 1 + max_batch * nb, bs, max_seq_len)
    m.row_tables = 1 + torch.arange(max_batch * nb, device=like.device).view(max_batch, nb)   # [max_batch, nb]
    m.max_batch = max_batch


def row_batch(m: nn.Module, positions: Tensor, row0: int, kv_len: int | None) -> RaggedBatch:
    """The RaggedBatch of rows row0..row0+B-1 of a `setup_row_cache` pool; positions [B, T]."""
    if getattr(m, "row_tables", None) is None:
        raise RuntimeError(f"{type(m).__name__}.setup_cache(max_batch, max_seq_len) must be called before forward")
    B = positions.shape[0]
    nb = m.row_tables.shape[1]
    read = nb if kv_len is None else -(-kv_len // m.block_size)
    slots = torch.arange(row0, row0 + B, device=positions.device)
    return uniform_batch(m.row_tables, slots, positions, read, m.block_size)


def _empty(*shape: int, device=None, dtype=None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


class Block(nn.Module):
    """One decoder layer: x + attn(norm(x)), then + mlp(norm(.)). Weights fused at load."""

    def __init__(self, c: TargetConfig, device=None, dtype=None):
        super().__init__()
        self.c = c                     # head counts are this instance's (a TP shard's) own
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.attention_norm = _empty(c.hidden_size, device=device, dtype=dtype)
        self.wqkv = _empty(self.q_size + 2 * self.kv_size, c.hidden_size, device=device, dtype=dtype)
        self.wo = _empty(c.hidden_size, self.q_size, device=device, dtype=dtype)
        self.ffn_norm = _empty(c.hidden_size, device=device, dtype=dtype)
        self.w13 = _empty(2 * c.intermediate_size, c.hidden_size, device=device, dtype=dtype)  # [gate; up]
        self.w2 = _empty(c.hidden_size, c.intermediate_size, device=device, dtype=dtype)

    @property
    def n_local_heads(self) -> int:
        return self.q_size // self.c.head_dim

    @property
    def n_local_kv_heads(self) -> int:
        return self.kv_size // self.c.head_dim

    def forward(self, x: Tensor, r: Tensor | None, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor,
                batch: RaggedBatch, f: Kernels, attention, comm: "Collectives") -> tuple[Tensor, Tensor]:
        """The residual stream entering this layer is x + r (x alone when r is None; r still to be
        summed over the ranks), x, r [N, h] packed tokens; cos, sin [N, 1, hd/2]; pools [kvh, P, hd]
        -> (x', r'): the stream after the layer is x' + r', left unsummed so that the next layer's
        norm does the all-reduce and the add in its kernel."""
        x, qkv = self.qkv(x, r, f, comm)
        o = attention.rope_attend(qkv, cos, sin, k_pool, v_pool, batch, self.n_local_heads)   # None: not fused
        if o is None:
            q = f.rope_write(qkv, cos, sin, k_pool, v_pool, batch.write_index, self.n_local_heads,
                             self.n_local_kv_heads)
            o = attention(q, k_pool, v_pool, batch)
        return self.attn_out(x, o, f, comm)

    def qkv(self, x: Tensor, r: Tensor | None, f: Kernels, comm: "Collectives") -> tuple[Tensor, Tensor]:
        """(the stream x + r [N, h] (r summed over the ranks), qkv [N, (nh + 2 kvh) * hd] before RoPE)."""
        eps = self.c.rms_norm_eps
        if r is None:
            h = f.rms_norm(x, self.attention_norm, eps)
        else:
            x, h = comm.add_rms_norm(r, x, self.attention_norm, eps, f)
        return x, F.linear(h, self.wqkv)

    def attn_in(self, x: Tensor, r: Tensor | None, cos: Tensor, sin: Tensor, k_pool: Tensor, v_pool: Tensor,
                write_index: Tensor, f: Kernels, comm: "Collectives") -> tuple[Tensor, Tensor]:
        """Up to attention: (the stream x + r [N, h], q [N, nh, hd]); this token's K/V written."""
        x, qkv = self.qkv(x, r, f, comm)
        return x, f.rope_write(qkv, cos, sin, k_pool, v_pool, write_index, self.n_local_heads, self.n_local_kv_heads)

    def attn_out(self, x: Tensor, o: Tensor, f: Kernels, comm: "Collectives") -> tuple[Tensor, Tensor]:
        """From attention's output o [N, nh*hd] on: (x', r') with the stream after the layer x' + r'
        (r' down_proj's output, still to be summed over the ranks)."""
        x, h = comm.add_rms_norm(F.linear(o, self.wo), x, self.ffn_norm, self.c.rms_norm_eps, f)
        return x, F.linear(f.silu_mul(F.linear(h, self.w13)), self.w2)


class Collectives:
    """The model's tensor-parallel reduction points; identity on one device. A TP engine
    swaps in one whose all_reduce sums row-parallel partial outputs over ranks and whose
    gather_vocab joins vocab-sharded logits."""

    def all_reduce(self, x: Tensor) -> Tensor:
        return x

    def add_rms_norm(self, part: Tensor, r: Tensor, weight: Tensor, eps: float, f: Kernels) -> tuple[Tensor, Tensor]:
        """(r + part summed over the ranks, rms_norm of it), part, r [N, h]: a row-parallel output
        joined to the residual and the norm after it."""
        return f.add_rms_norm(r, self.all_reduce(part), weight, eps)

    def settle(self, x: Tensor, r: Tensor | None) -> Tensor:
        """The stream x + r itself (r summed over the ranks), for the layers whose outputs are read."""
        return x if r is None else x + self.all_reduce(r)

    def gather_vocab(self, logits: Tensor) -> Tensor:
        return logits

    def argmax(self, logits: Tensor) -> Tensor:
        """Greedy ids [...] of the head's output [..., V] (a TP engine's: its vocab shard,
        reduced over ranks with 2N numbers per row instead of gathering the logits)."""
        return first_max(logits)[1]


class Target(nn.Module):
    """Llama-family target. Parameters are allocated uninitialised; load.py fills them."""

    def __init__(self, config: TargetConfig, *, device=None, dtype=None):
        super().__init__()
        c = self.config = config
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, _weight=torch.empty(
            c.vocab_size, c.hidden_size, device=device, dtype=dtype), _freeze=True)
        self.layers = nn.ModuleList(Block(c, device, dtype) for _ in range(c.num_layers))
        self.norm = _empty(c.hidden_size, device=device, dtype=dtype)
        self.output = None if c.tie_word_embeddings else _empty(
            c.vocab_size, c.hidden_size, device=device, dtype=dtype)
        self.kernels = Kernels()                                  # per model; the engine may swap in compiled ones
        self.collectives = Collectives()
        self.attention = SdpaAttention()                          # (q, k_pool, v_pool, batch) -> [N, nh*hd]
        self.layer_hook = None                                    # run() calls it with i after layer i (graph captures)
        self.max_batch = self.max_seq_len = self.block_size = 0
        self.row_tables: Tensor | None = None
        self.register_buffer("k_cache", None, persistent=False)  # [L, kvh, blocks*block_size, hd]
        self.register_buffer("v_cache", None, persistent=False)
        self.register_buffer("rope_cos", None, persistent=False)  # [S, hd/2]
        self.register_buffer("rope_sin", None, persistent=False)

    @property
    def lm_head(self) -> Tensor:
        return self.tok_embeddings.weight if self.output is None else self.output

    def setup_cache(self, max_batch: int, max_seq_len: int) -> None:
        """Rows 0..max_batch-1 of max_seq_len positions each, for the row-major `forward`."""
        setup_row_cache(self, self.config, self.tok_embeddings.weight, self.config.num_layers, max_batch, max_seq_len)

    def setup_pool(self, num_blocks: int, block_size: int, max_seq_len: int) -> None:
        """A pool of num_blocks blocks; the engine hands out the block tables."""
        setup_paged_cache(self, self.config, self.tok_embeddings.weight, self.config.num_layers, num_blocks,
                          block_size, max_seq_len)

    def run(self, tokens: Tensor, batch: RaggedBatch, *, capture: tuple[int, ...] = (),
            logit_index: Tensor | None = None, attention=None,
            greedy: bool = False) -> tuple[Tensor, Tensor | None]:
        """tokens [N] packed -> (logits [M, V] at logit_index (all N when None),
        captured [N, len(capture)*h] or None). greedy: the argmax ids [M] instead of the logits.

        `capture` lists decoder layers (0-based) whose OUTPUTS (residual stream after the
        layer, before the final norm) are concatenated in the given order.
        """
        if self.k_cache is None:
            raise RuntimeError("Target.setup_cache or setup_pool must be called before forward")
        c = self.config
        for i in capture:
            if not 0 <= i < c.num_layers or capture.count(i) > 1:
                raise ValueError(f"capture {capture} must name distinct layers in 0..{c.num_layers - 1}")
        attention = as_attention(attention or self.attention)             # attention.Attention
        x, cos, sin = self.embed(tokens, batch.positions)
        caps: dict[int, Tensor] = {}
        f, comm = self.kernels, self.collectives
        r = None                                                          # stream = x + r summed over ranks
        for i, layer in enumerate(self.layers):
            x, r = layer(x, r, cos, sin, self.k_cache[i], self.v_cache[i], batch, f, attention, comm)
            if i in capture:
                x, r = comm.settle(x, r), None
                caps[i] = x
            if self.layer_hook is not None:
                self.layer_hook(i)                                        # engine._capture_chain's cut points
        hidden = torch.cat([caps[i] for i in capture], dim=-1) if capture else None  # [N, n*h]
        if logit_index is not None:                                       # every rank keeps the same rows
            x, r = x[logit_index], (None if r is None else r[logit_index])
        return self.head(self.final_norm(x, r), greedy), hidden

    def final_norm(self, x: Tensor, r: Tensor | None) -> Tensor:
        """The stream x + r (r summed over the ranks) [M, h] through the final norm."""
        eps = self.config.rms_norm_eps
        if r is None:
            return self.kernels.rms_norm(x, self.norm, eps)
        return self.collectives.add_rms_norm(r, x, self.norm, eps, self.kernels)[1]

    def embed(self, tokens: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """tokens, positions [N] -> (x [N, h], cos, sin [N, 1, hd/2])."""
        return (self.tok_embeddings(tokens), self.rope_cos[positions].unsqueeze(1),
                self.rope_sin[positions].unsqueeze(1))

    def head(self, h: Tensor, greedy: bool) -> Tensor:
        """The final-normed stream h [M, h] -> logits [M, V] (float32 on CPU), or greedy ids [M]."""
        out = F.linear(h, self.lm_head)                                   # [M, V | V_pad/N]
        if greedy:
            return self.collectives.argmax(out)
        out = self.collectives.gather_vocab(out)
        return out.float() if out.device.type == "cpu" else out

    def forward(self, tokens: Tensor, positions: Tensor, *, row0: int = 0, kv_len: int | None = None,
                capture: tuple[int, ...] = (), logits: str = "all") -> tuple[Tensor, Tensor | None]:
        """Row-major use (tests, tools) on a `setup_cache` pool: tokens, positions [B, T] in
        rows row0..row0+B-1 -> (logits [B, T or 1, V], captured [B, T, len(capture)*h] or None).
        Only positions < kv_len are read (default: max_seq_len)."""
        if logits not in ("all", "last"):
            raise ValueError(f"logits must be 'all' or 'last', not {logits!r}")
        B, T = tokens.shape
        batch = row_batch(self, positions, row0, kv_len)
        last = torch.arange(T - 1, B * T, T, device=tokens.device) if logits == "last" else None
        out, hidden = self.run(tokens.reshape(B * T), batch, capture=capture, logit_index=last)
        return out.view(B, -1, out.shape[-1]), (None if hidden is None else hidden.view(B, T, -1))
