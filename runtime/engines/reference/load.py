"""Load HF folders into the reference models, checking every input on the way.

A target folder is a transformers Llama checkpoint, a draft folder a public EAGLE-3 checkpoint
(config.json with `draft_vocab_size`, weights `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`,
`t2d`, optional `embed_tokens`). Files, layouts and the rules every tensor passes (no float8,
no NaN/Inf, one file per tensor name, `.bin` only through torch.load(weights_only=True)) are
dynspec.checkpoint's, the same reader `dynspec convert` uses.

Every bad input raises DynspecError naming the file and the field or tensor at fault.
q/k/v and gate/up weights are fused while loading; tensors are converted to the requested
dtype on the way in, so bf16 files load fine as float32 and the other way round.

`part` (tensor parallelism: tp_shard.shard_part) loads one rank's shard only: the model is built on
the meta device, and each tensor is read through `part(rule, full_shape) -> (index, pad_rows)`,
rule one of "q" "kv" "column" "row" "vocab" (anything else is read whole), so a rank's peak
host memory is its shard plus one tensor (docs/tensor_parallel.md).
"""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor, nn

from dynspec.checkpoint.eagle3 import check_vocab_maps, draft_keys, resolve_capture_layers
from dynspec.checkpoint.hf_config import read_config
from dynspec.checkpoint.tensor_reader import TensorReader
from dynspec.checkpoint.weight_index import weight_source
from dynspec.errors import DynspecError

from dynspec.runtime.engines.reference.draft import Eagle3Config, Eagle3Draft
from dynspec.runtime.engines.reference.layer_ops import Kernels
from dynspec.runtime.engines.reference.model import Target
from dynspec.runtime.engines.reference.model_config import TargetConfig

if TYPE_CHECKING:
    from dynspec.runtime.engines.reference.engine import ReferenceEngine


# part(rule, full_shape) -> (index into the full tensor, zero rows to append): one rank's shard
Part = Callable[[str, tuple[int, ...]], tuple[tuple[slice, ...], int]]


class WeightFiles:
    """The tensors of one HF folder by name (`names` maps the names asked for to the names in
    the files: the draft's aliases), loaded on demand and checked for shape; with `part`, a
    tensor given a sharding rule is read as this rank's part of it."""

    def __init__(self, model_dir: str | os.PathLike, what: str, names: bool = False, part: Part | None = None):
        self.dir, self.what, self.part = Path(model_dir), what, part
        self.src = weight_source(model_dir, what, allow_bin=True)
        self.names = draft_keys(self.src.key_to_file) if names else {k: k for k in self.src.key_to_file}
        self.reader = TensorReader(self.src)

    def has(self, name: str) -> bool:
        return name in self.names

    def file(self, name: str) -> Path:
        return self.src.key_to_file[self.names[name]]

    def get(self, name: str, shape: tuple[int, ...] | None = None, why: str = "", rule: str = "") -> Tensor:
        """Load a tensor on the CPU (with `part` and a rule: this rank's part); check the full
        tensor's shape, from the file header, when given."""
        if name not in self.names:
            raise DynspecError(f"{self.what} folder {self.dir}: missing tensor '{name}'"
                               f"{' (' + why + ')' if why else ''}")
        real = self.names[name]
        full = self.reader.shape(real)
        if shape is not None and full != tuple(shape):
            raise DynspecError(f"{self.file(name)}: tensor '{real}' has shape {list(full)}, expected "
                               f"{list(shape)}{' (' + why + ')' if why else ''}")
        if self.part is None or not rule:
            return self.reader.get(real)
        index, pad = self.part(rule, full)
        t = self.reader.get(real, index)
        return torch.cat((t, t.new_zeros(pad, *t.shape[1:]))) if pad else t


def _device(device) -> torch.device:
    return torch.empty(0, device=device).device


def _copy(dst: Tensor, src: Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src)


def _fill(module: nn.Module, attr: str, *rows: Tensor, to: tuple) -> None:
    """module.attr <- `rows` stacked ([q; k; v], [gate; up]), copied into the allocated parameter;
    on a model built on the meta device (a TP shard) the parameter is first allocated at the
    stack's shape on `to` = (device, dtype). Always a copy: a part read from a memory-mapped
    safetensors file does not keep the file's pages mapped."""
    p = getattr(module, attr)
    if p.is_meta:
        p = nn.Parameter(torch.empty(sum(len(t) for t in rows), *rows[0].shape[1:], device=to[0], dtype=to[1]),
                         requires_grad=False)
        del module._parameters[attr]
        module.register_parameter(attr, p)
    at = 0
    for t in rows:
        _copy(p[at:at + len(t)], t)
        at += len(t)


def _check_filled(m: nn.Module, what: str, model_dir) -> None:
    left = [n for n, t in list(m.named_parameters()) + list(m.named_buffers()) if t.is_meta]
    if left:
        raise DynspecError(f"{what} folder {model_dir}: tensors {left} were never loaded (a bug in load.py)")


def load_target(model_dir: str | os.PathLike, *, device="cpu", dtype: torch.dtype = torch.float32,
                part: Part | None = None) -> Target:
    """A Target (weights fused, in `dtype` on `device`, eval mode) from an HF Llama folder; with
    `part`, only this rank's shard of each sharded weight (tp.apply_tp(..., loaded=True) then
    sets the head counts and collectives)."""
    cfg, where = read_config(model_dir, "target"), str(Path(model_dir) / "config.json")
    c = TargetConfig.from_hf(cfg, where)
    w = WeightFiles(model_dir, "target", part=part)
    m = Target(c, device="meta" if part else device, dtype=dtype)
    fill = partial(_fill, to=(device, dtype))
    h, q, kv, inter = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    fill(m.tok_embeddings, "weight", w.get("model.embed_tokens.weight", shape=(c.vocab_size, h), rule="vocab"))
    for i, blk in enumerate(m.layers):
        p = f"model.layers.{i}."
        fill(blk, "attention_norm", w.get(p + "input_layernorm.weight", shape=(h,)))
        fill(blk, "wqkv", w.get(p + "self_attn.q_proj.weight", shape=(q, h), rule="q"),
              w.get(p + "self_attn.k_proj.weight", shape=(kv, h), rule="kv"),
              w.get(p + "self_attn.v_proj.weight", shape=(kv, h), rule="kv"))
        fill(blk, "wo", w.get(p + "self_attn.o_proj.weight", shape=(h, q), rule="row"))
        fill(blk, "ffn_norm", w.get(p + "post_attention_layernorm.weight", shape=(h,)))
        fill(blk, "w13", w.get(p + "mlp.gate_proj.weight", shape=(inter, h), rule="column"),
              w.get(p + "mlp.up_proj.weight", shape=(inter, h), rule="column"))
        fill(blk, "w2", w.get(p + "mlp.down_proj.weight", shape=(h, inter), rule="row"))
    fill(m, "norm", w.get("model.norm.weight", shape=(h,)))
    if m.output is not None:
        fill(m, "output", w.get("lm_head.weight", shape=(c.vocab_size, h), rule="vocab",
                                 why="config.json has tie_word_embeddings=false"))
    _check_filled(m, "target", model_dir)
    return m.eval()


def load_draft(model_dir: str | os.PathLike, target: Target, *, device="cpu", dtype: torch.dtype = torch.float32,
               capture_layers: tuple[int, ...] | None = None, part: Part | None = None) -> Eagle3Draft:
    """An Eagle3Draft from a public EAGLE-3 folder, validated against `target`.

    `capture_layers` (outputs-of-layer convention) overrides what the draft config names.
    `part`: only this rank's shard of each sharded weight, as in load_target (the target's own
    embedding, when shared, is already its shard).
    """
    cfg, where = read_config(model_dir, "draft"), str(Path(model_dir) / "config.json")
    capture = resolve_capture_layers(cfg, where, target.config.num_layers, capture_layers).layers
    c = Eagle3Config.from_hf(cfg, where, target.config, capture_layers=capture)
    w = WeightFiles(model_dir, "draft", names=True, part=part)
    h, q, kv, inter = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    own_embed = w.has("embed_tokens.weight")
    embed = None
    if not own_embed:
        if h != target.config.hidden_size:
            raise DynspecError(f"draft folder {model_dir}: no tensor 'embed_tokens.weight', and the draft hidden_size "
                               f"({h}) differs from the target's ({target.config.hidden_size}), so the target's "
                               "embeddings cannot be shared")
        te = target.tok_embeddings
        if te.weight.device == _device(device) and te.weight.dtype == dtype:
            embed = te
        else:
            embed = nn.Embedding(c.vocab_size, h, _weight=te.weight.detach().to(device, dtype), _freeze=True)
    m = Eagle3Draft(c, embed=embed, device="meta" if part else device, dtype=dtype)
    fill = partial(_fill, to=(device, dtype))
    if part:                                   # the vocab maps are replicated: real, at their defaults
        m.d2t, m.t2d = torch.zeros_like(m.d2t, device=device), torch.ones_like(m.t2d, device=device)
    if own_embed:
        fill(m.embed_tokens, "weight", w.get("embed_tokens.weight", shape=(c.vocab_size, h), rule="vocab"))
    n = len(c.capture_layers)
    fill(m, "fc", w.get("fc.weight", shape=(h, c.fused_width),
                        why=f"fc takes {n} captured layers {c.capture_layers} x target hidden {c.target_hidden_size}"))
    get = lambda name, shape, rule="": w.get("midlayer." + name, shape=shape, rule=rule)  # noqa: E731
    fill(m, "hidden_norm", get("hidden_norm.weight", (h,)))
    fill(m, "input_layernorm", get("input_layernorm.weight", (h,)))
    fill(m, "wqkv", get("self_attn.q_proj.weight", (q, 2 * h), "q"), get("self_attn.k_proj.weight", (kv, 2 * h), "kv"),
         get("self_attn.v_proj.weight", (kv, 2 * h), "kv"))
    fill(m, "wo", get("self_attn.o_proj.weight", (h, q), "row"))
    fill(m, "post_attention_layernorm", get("post_attention_layernorm.weight", (h,)))
    fill(m, "w13", get("mlp.gate_proj.weight", (inter, h), "column"), get("mlp.up_proj.weight", (inter, h), "column"))
    fill(m, "w2", get("mlp.down_proj.weight", (h, inter), "row"))
    fill(m, "norm", w.get("norm.weight", shape=(h,)))
    fill(m, "lm_head", w.get("lm_head.weight", shape=(c.draft_vocab_size, h), rule="vocab"))
    if w.has("d2t") or w.has("t2d") or c.draft_vocab_size != c.vocab_size:
        why = f"draft_vocab_size {c.draft_vocab_size} < vocab_size {c.vocab_size}"
        d2t = w.get("d2t", shape=(c.draft_vocab_size,), why=why)
        t2d = w.get("t2d", shape=(c.vocab_size,), why=why)
        check_vocab_maps(d2t, t2d, c.draft_vocab_size, c.vocab_size, str(w.file("d2t")))
        m.d2t.copy_(d2t.long())
        m.t2d.copy_(t2d.bool())
    _check_filled(m, "draft", model_dir)
    return m.eval()


def load_reference_engine(
    target_dir: str,
    draft_dir: str,
    *,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    max_batch_size: int = 64,
    max_seq_len: int = 1024,
    max_draft_len: int = 8,
    max_num_tokens: int = 8192,
    fused_kernels: bool | None = None,
    prepare=None,
    target_part=None,
    draft_part=None,
    **cache,
) -> "ReferenceEngine":
    """fused_kernels: the per-layer elementwise glue compiled, with Triton's rope_write and norms
    on CUDA (layer_ops.Kernels; default: on CUDA only).
    target_part / draft_part: read only this rank's part of each tensor (load.py's `part`;
    tp.load_tp_engine passes tp_shard.shard_part). prepare(target, draft): runs on the loaded models
    before the caches are sized (tp.apply_tp sets the local heads and collectives there).
    cache: block_size, num_blocks, attention ("auto", "triton", "sdpa"), passed to ReferenceEngine."""
    from dynspec.runtime.engines.reference.engine import ReferenceEngine

    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    target = load_target(target_dir, device=device, dtype=dt, part=target_part)
    if fused_kernels if fused_kernels is not None else str(device).startswith("cuda"):
        target.kernels = Kernels(compiled=True)
    draft = load_draft(draft_dir, target, device=device, dtype=dt, part=draft_part)
    if prepare is not None:
        prepare(target, draft)
    return ReferenceEngine(target, draft, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                           max_draft_len=max_draft_len, max_num_tokens=max_num_tokens, **cache)
