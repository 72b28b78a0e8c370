"""Which shard of each weight a rank of the reference models holds (pure): the shapes a split
rests on (TpShape, check_tp) and the rules, as slices of a full tensor (shard_part: what load.py's
`part` reads) or as tensors cut from a loaded one (shard_weights: tp.apply_tp).

The rules (Megatron-style, as dynspec/checkpoint/shapes.py states them and TRT-LLM runs them):
    wqkv  [q | k | v] rows   column-parallel: rank r keeps its q heads and its KV heads
    w13   [gate | up] rows   column-parallel: rank r keeps rows r*i/N.. of gate and of up
    wo, w2                   row-parallel: input columns / N, output summed by one all-reduce
    embedding, lm_head       vocabulary-parallel: rows padded to a multiple of N, then / N
    norms, fc, d2t, t2d      replicated
Which KV heads a rank keeps comes from the same kv_heads_per_rank / kv_replication that convert
uses, and whether N works at all from convert's require_tp (dynspec/checkpoint/tp_checks.py), so
the check and the run cannot disagree.

Worked example, 4 q heads, 2 KV heads (GQA groups of 2), N=4 -> replication 2:
    rank 0: q head 0, KV head 0    rank 1: q head 1, KV head 0
    rank 2: q head 2, KV head 1    rank 3: q head 3, KV head 1
q head j uses KV head j // 2 in the unsharded model too, so every rank attends as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
from torch import Tensor

from dynspec.checkpoint.shapes import ModelShape, kv_heads_per_rank, kv_replication, padded_vocab
from dynspec.checkpoint.tp_checks import require_tp


# ----------------------------------------------------------------------------- shapes (pure)

@dataclass(frozen=True)
class TpShape:
    """How one model (target or draft) splits N ways."""
    tp: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int                  # rows of lm_head (the draft: draft_vocab_size)
    embed_vocab: int            # rows of the embedding

    @property
    def local_heads(self) -> int:
        return self.heads // self.tp

    @property
    def local_kv_heads(self) -> int:
        return kv_heads_per_rank(self.kv_heads, self.tp)

    @property
    def kv_replication(self) -> int:
        return kv_replication(self.kv_heads, self.tp)

    @property
    def local_intermediate(self) -> int:
        return self.intermediate // self.tp

    def kv_head0(self, rank: int) -> int:
        """First KV head of `rank`: 8 heads, N=4 -> 0, 2, 4, 6; 2 heads, N=4 -> 0, 0, 1, 1."""
        return (rank // self.kv_replication) * self.local_kv_heads


def model_shape(config) -> ModelShape:
    """convert's ModelShape of a TargetConfig or Eagle3Config (lm_head rows as `vocab`)."""
    return ModelShape(layers=getattr(config, "num_layers", 1), hidden=config.hidden_size, heads=config.num_heads,
                      kv_heads=config.num_kv_heads, head_dim=config.head_dim, intermediate=config.intermediate_size,
                      vocab=getattr(config, "draft_vocab_size", config.vocab_size))


def check_tp(target_config, draft_config, tp: int, target_where: str = "the target",
             draft_where: str = "the draft") -> tuple[TpShape, TpShape]:
    """convert's require_tp on both models, from their configs alone (call it before loading):
    one DynspecError naming every number at fault, e.g. 'num_attention_heads=6 is not divisible
    by tp=4 (6 % 4 = 2)'."""
    require_tp(model_shape(target_config), tp, target_where)
    require_tp(model_shape(draft_config), tp, draft_where, "draft_vocab_size")
    return tp_shape(target_config, tp), tp_shape(draft_config, tp)


def tp_shape(config, tp: int) -> TpShape:
    return TpShape(tp, config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size,
                   getattr(config, "draft_vocab_size", config.vocab_size), config.vocab_size)


# ----------------------------------------------------------------------------- sharding (pure)

def column(w: Tensor, rank: int, parts: int) -> Tensor:
    """Rows rank*n/parts .. (rank+1)*n/parts of w [n, m]."""
    n = w.shape[0] // parts
    return w[rank * n:(rank + 1) * n]


def row(w: Tensor, rank: int, parts: int) -> Tensor:
    """Columns rank*m/parts .. of w [n, m] (the input side of a row-parallel linear)."""
    m = w.shape[1] // parts
    return w[:, rank * m:(rank + 1) * m]


def shard_qkv(wqkv: Tensor, s: TpShape, rank: int) -> Tensor:
    """[q | k | v] rows [(nh + 2 kvh) hd, in] -> this rank's [(nh/N + 2 kvh_local) hd, in]."""
    hd = s.head_dim
    q_rows, kv_rows = s.heads * hd, s.kv_heads * hd
    q, k, v = wqkv.split((q_rows, kv_rows, kv_rows))
    kv0, kvn = s.kv_head0(rank) * hd, s.local_kv_heads * hd
    return torch.cat((column(q, rank, s.tp), k[kv0:kv0 + kvn], v[kv0:kv0 + kvn]))


def shard_gate_up(w13: Tensor, s: TpShape, rank: int) -> Tensor:
    """[gate | up] rows [2i, h] -> [gate_r | up_r] [2i/N, h] (silu_mul still splits in half)."""
    gate, up = w13.chunk(2)
    return torch.cat((column(gate, rank, s.tp), column(up, rank, s.tp)))


def shard_vocab(w: Tensor, rank: int, parts: int) -> Tensor:
    """Rows of w [V, h] padded with zeros to a multiple of parts, then this rank's V_pad/parts."""
    pad = padded_vocab(w.shape[0], parts) - w.shape[0]
    if pad:
        w = torch.cat((w, w.new_zeros(pad, w.shape[1])))
    return column(w, rank, parts)


def shard_part(rule: str, shape: tuple[int, ...], s: TpShape, rank: int) -> tuple[tuple[slice, ...], int]:
    """The same rules on one HF tensor before fusing, as load.py reads it: (the index of this
    rank's part in the full tensor, zero rows to append). rule: "q" (q_proj), "kv" (k_proj,
    v_proj: convert's KV heads of the rank), "column" (gate_proj, up_proj), "row" (o_proj,
    down_proj), "vocab" (embedding, lm_head). Stacking q|k|v and gate|up parts gives exactly
    shard_qkv / shard_gate_up of the fused weight. E.g. vocab 161, N=2, rank 1: rows 81..160,
    then 1 zero row (V_pad/N = 81)."""
    if rule in ("q", "column"):
        n = shape[0] // s.tp
        return (slice(rank * n, (rank + 1) * n),), 0
    if rule == "kv":
        kv0, kvn = s.kv_head0(rank) * s.head_dim, s.local_kv_heads * s.head_dim
        return (slice(kv0, kv0 + kvn),), 0
    if rule == "row":
        m = shape[1] // s.tp
        return (slice(None), slice(rank * m, (rank + 1) * m)), 0
    if rule == "vocab":
        n = padded_vocab(shape[0], s.tp) // s.tp
        lo = min(rank * n, shape[0])
        hi = min(lo + n, shape[0])
        return (slice(lo, hi),), n - (hi - lo)
    raise ValueError(f"unknown sharding rule {rule!r}")


# How each named weight of the reference models splits: the last name component -> rule.
RULES = {
    "wqkv": "qkv", "w13": "gate_up", "wo": "row", "w2": "row",
    "output": "vocab", "lm_head": "vocab", "tok_embeddings.weight": "vocab", "embed_tokens.weight": "vocab",
}


def rule_of(name: str) -> str:
    """'layers.3.wqkv' -> 'qkv'; 'norm' -> 'replicated'."""
    for key, rule in RULES.items():
        if name == key or name.endswith("." + key):
            return rule
    return "replicated"


def shard_weights(named: Mapping[str, Tensor], s: TpShape, rank: int) -> dict[str, Tensor]:
    """Every named weight of one model -> this rank's shard (contiguous copies).
    {'layers.0.wqkv': [(4+2*2)*16, 64], ...} at N=2, rank 1 -> {'layers.0.wqkv': [(2+2*1)*16, 64], ...}"""
    out = {}
    for name, w in named.items():
        r = rule_of(name)
        if r == "qkv":
            w = shard_qkv(w, s, rank)
        elif r == "gate_up":
            w = shard_gate_up(w, s, rank)
        elif r == "row":
            w = row(w, rank, s.tp)
        elif r == "vocab":
            w = shard_vocab(w, rank, s.tp)
        out[name] = w.contiguous()
    return out
