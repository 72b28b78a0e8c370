"""Tensor parallelism of the reference models: each rank loads only its shard (tp_shard.py's
shard_part, load.py's `part`), or a loaded model is sharded in place (apply_tp, gpt-fast style);
the rules and the shapes are tp_shard.py's.

Collectives go through the model's own reduction points (`model.Collectives`: add_rms_norm
after wo and after w2, the sum joined to the norm after it; gather_vocab and argmax on the
lm_head output), which TpCollectives fills in; the
embedding becomes a VocabParallelEmbedding module; the per-instance head counts (q_size,
kv_size, a local config that sizes the KV pool) become this rank's. The model code is as is.

lm_head: the engine only ever takes argmax of the logits, and `vocab_parallel_argmax` (each
rank's (max, index), 2 numbers per row per rank) is far cheaper than gathering V/N logits per
row per rank. It needs the engine to call it instead of logits.argmax(-1); until then the head
all-gathers (docs/tensor_parallel.md).
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dynspec.runtime.engines.reference.layer_ops import first_max
from dynspec.runtime.engines.reference.tp_shard import TpShape, check_tp, shard_part, shard_vocab, shard_weights
from dynspec.runtime.tp.tp_groups import TpContext


# ----------------------------------------------------------------------------- the vocabulary-parallel argmax

def shard_argmax(local_logits: Tensor, vocab: int, rank: int) -> Tensor:
    """(max, global index) [..., 2] in float64 of one rank's logits [..., V_pad/N], which cover
    rows rank*V_pad/N.. . Padding rows (index >= vocab) are left out; a shard of padding only
    gives (-inf, 0). Within the shard the first max wins, as in torch.argmax."""
    n = local_logits.shape[-1]
    lo = rank * n
    real = max(0, min(n, vocab - lo))
    if real == 0:
        best = torch.full(local_logits.shape[:-1], float("-inf"), dtype=torch.float64, device=local_logits.device)
        return torch.stack((best, torch.zeros_like(best)), dim=-1)
    best, idx = first_max(local_logits[..., :real])
    return torch.stack((best.double(), (idx + lo).double()), dim=-1)


def pick_argmax(pairs: Tensor) -> Tensor:
    """[..., N, 2] of (max, index) in rank order -> the global argmax [...]. Ranks hold ascending
    index ranges and argmax takes the first max, so ties go to the lowest index, as torch's do."""
    r = pairs[..., 0].argmax(dim=-1, keepdim=True)      # [..., 1]
    return pairs[..., 1].gather(-1, r).squeeze(-1).long()


def vocab_parallel_argmax(local_logits: Tensor, vocab: int, ctx: TpContext) -> Tensor:
    """argmax over the whole vocabulary from each rank's logits shard, exchanging 2*N numbers
    per row instead of V_pad logits: [B, T, V_pad/N] on each rank -> [B, T] on every rank."""
    pair = shard_argmax(local_logits, vocab, ctx.tp_rank).unsqueeze(-2)      # [..., 1, 2]
    return pick_argmax(ctx.all_gather(pair, dim=-2))                         # [..., N, 2] -> [...]


# ----------------------------------------------------------------------------- the model's reduction points

class TpCollectives:
    """model.Collectives over one replica's ranks: all_reduce sums the row-parallel partial
    outputs of wo and w2; gather_vocab joins the vocab shards of the logits in rank order and
    drops the padding rows: [N, V_pad/N] on each rank -> [N, V] on every rank; argmax is the
    vocabulary-parallel one: [N, V_pad/N] on each rank -> ids [N] on every rank, 2 numbers per
    rank and row on the wire (what the engine calls; gather_vocab serves logits to tools)."""

    def __init__(self, ctx: TpContext, vocab: int):
        self.ctx, self.vocab = ctx, vocab

    def all_reduce(self, x: Tensor) -> Tensor:
        return self.ctx.all_reduce(x)

    def add_rms_norm(self, part: Tensor, r: Tensor, weight: Tensor, eps: float, f) -> tuple[Tensor, Tensor]:
        """r + the sum of part over the ranks, and its norm: one launch where the reducer fuses
        them (one-shot on CUDA, runtime/tp/allreduce.py), else the all-reduce (NCCL, gloo) and then
        the model's add_rms_norm (the Triton one with compiled kernels on CUDA)."""
        reducer = self.ctx.reducer
        if reducer is not None and reducer.fuses_norm(part, r, weight):
            return reducer.add_rms_norm(part, r, weight, eps, f.add_rms_norm)
        return f.add_rms_norm(r, self.all_reduce(part), weight, eps)

    def settle(self, x: Tensor, r: Tensor | None) -> Tensor:
        return x if r is None else x + self.all_reduce(r)

    def gather_vocab(self, logits: Tensor) -> Tensor:
        return self.ctx.all_gather(logits, dim=-1)[..., :self.vocab]

    def argmax(self, logits: Tensor) -> Tensor:
        return vocab_parallel_argmax(logits, self.vocab, self.ctx)


class VocabParallelEmbedding(nn.Module):
    """Embedding rows rank*V_pad/N.. of the vocabulary. Each rank looks up the ids it holds,
    zeros elsewhere; the all-reduce adds exactly one nonzero row per id, so the result is the
    unsharded lookup bit for bit. `weight` is the shard [V_pad/N, h] (shard_vocab's), so a tied
    lm_head is vocab-parallel too."""

    def __init__(self, shard: Tensor, ctx: TpContext):
        super().__init__()
        self.ctx = ctx
        self.weight = nn.Parameter(shard.contiguous(), requires_grad=False)

    def forward(self, ids: Tensor) -> Tensor:
        n = self.weight.shape[0]
        lo = self.ctx.tp_rank * n
        mine = (ids >= lo) & (ids < lo + n)                                  # [N]
        x = F.embedding(torch.where(mine, ids - lo, 0), self.weight)         # [N, h]
        return self.ctx.all_reduce(x * mine.unsqueeze(-1).to(x.dtype))


# ----------------------------------------------------------------------------- applying TP to models

def _replace_param(module: nn.Module, name: str, value: Tensor) -> None:
    """Parameter `name` becomes `value`, a tensor of another (the shard's) shape."""
    del module._parameters[name]
    module.register_parameter(name, nn.Parameter(value, requires_grad=False))


def _shard_module(module: nn.Module, names: tuple[str, ...], s: TpShape, rank: int) -> None:
    shards = shard_weights({n: getattr(module, n).detach() for n in names}, s, rank)
    for name, w in shards.items():
        _replace_param(module, name, w)


def _local_config(config, s: TpShape):
    """The config with this rank's head and MLP widths (what setup_cache/setup_pool size by)."""
    return replace(config, num_heads=s.local_heads, num_kv_heads=s.local_kv_heads,
                   intermediate_size=s.local_intermediate)


def apply_tp(target, draft, ctx: TpContext, *, loaded: bool = False) -> tuple[TpShape, TpShape]:
    """Shard a loaded target + EAGLE-3 draft in place for this rank, before their caches are
    set up: per-instance head counts (q_size/kv_size, local configs), sharded weights, and the
    collectives at the model's reduction points. Refuses an impossible split first (check_tp).
    loaded: the weights already are this rank's shards (load.py with shard_part)."""
    ts, ds = check_tp(target.config, draft.config, ctx.tp)
    if ctx.tp == 1:
        return ts, ds
    rank = ctx.tp_rank
    shard = (lambda module, names, s: None) if loaded else (lambda module, names, s: _shard_module(
        module, names, s, rank))
    vocab = (lambda w: w) if loaded else (lambda w: shard_vocab(w, rank, ctx.tp))
    shared = draft.embed_tokens is target.tok_embeddings
    target.tok_embeddings = VocabParallelEmbedding(vocab(target.tok_embeddings.weight.detach()), ctx)
    draft.embed_tokens = target.tok_embeddings if shared else VocabParallelEmbedding(
        vocab(draft.embed_tokens.weight.detach()), ctx)
    for blk in target.layers:
        shard(blk, ("wqkv", "w13", "wo", "w2"), ts)
        blk.c = _local_config(blk.c, ts)
        blk.q_size, blk.kv_size = ts.local_heads * ts.head_dim, ts.local_kv_heads * ts.head_dim
    if target.output is not None:
        shard(target, ("output",), ts)
    target.config = _local_config(target.config, ts)
    target.collectives = TpCollectives(ctx, ts.vocab)
    shard(draft, ("wqkv", "w13", "wo", "w2", "lm_head"), ds)
    draft.config = _local_config(draft.config, ds)
    draft.q_size, draft.kv_size = ds.local_heads * ds.head_dim, ds.local_kv_heads * ds.head_dim
    draft.collectives = TpCollectives(ctx, ds.vocab)
    return ts, ds


def load_tp_engine(target_dir: str, draft_dir: str, ctx: TpContext, *, dtype: str | torch.dtype = "float32",
                   fused_kernels: bool | None = None, **engine_args):
    """This rank's ReferenceEngine over its shard of the pair: configs checked against N first
    (no weight is read for an impossible split), then each model loads only this rank's shards
    (shard_part), and the engine is built (it sizes its caches by the local KV heads).
    engine_args: load_reference_engine's keywords. Peak host memory: this rank's shard of the
    pair in `dtype` plus one tensor (.bin checkpoints: plus the largest .bin file, which is
    loaded whole; docs/tensor_parallel.md)."""
    from functools import partial
    from pathlib import Path

    from dynspec.checkpoint.hf_config import read_config
    from dynspec.runtime.engines.reference.draft import Eagle3Config
    from dynspec.runtime.engines.reference.load import load_reference_engine
    from dynspec.runtime.engines.reference.model_config import TargetConfig

    twhere, dwhere = str(Path(target_dir) / "config.json"), str(Path(draft_dir) / "config.json")
    tc = TargetConfig.from_hf(read_config(target_dir, "target"), twhere)
    ts, ds = check_tp(tc, Eagle3Config.from_hf(read_config(draft_dir, "draft"), dwhere, tc), ctx.tp, twhere, dwhere)
    if ctx.tp == 1:
        return load_reference_engine(target_dir, draft_dir, device=str(ctx.device), dtype=dtype,
                                     fused_kernels=fused_kernels, **engine_args)
    return load_reference_engine(
        target_dir, draft_dir, device=str(ctx.device), dtype=dtype, fused_kernels=fused_kernels,
        target_part=partial(shard_part, s=ts, rank=ctx.tp_rank),
        draft_part=partial(shard_part, s=ds, rank=ctx.tp_rank),
        prepare=lambda target, draft: apply_tp(target, draft, ctx, loaded=True), **engine_args)