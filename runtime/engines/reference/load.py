"""Load HF folders into the reference models, checking every input on the way.

A target folder is a transformers Llama checkpoint, a draft folder a public EAGLE-3 checkpoint
(config.json with `draft_vocab_size`, weights `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`,
`t2d`, optional `embed_tokens`). Files, layouts and the rules every tensor passes (no float8,
no NaN/Inf, one file per tensor name, `.bin` only through torch.load(weights_only=True)) are
dynspec.checkpoint's, the same reader `dynspec convert` uses.

Every bad input raises DynspecError naming the file and the field or tensor at fault.
q/k/v and gate/up weights are fused while loading; tensors are converted to the requested
dtype on the way in, so bf16 files load fine as float32 and the other way round.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn

from dynspec.checkpoint.eagle3 import check_vocab_maps, draft_keys, resolve_capture_layers
from dynspec.checkpoint.reader import TensorReader, read_config, weight_source
from dynspec.errors import DynspecError

from .draft import Eagle3Config, Eagle3Draft
from .model import Target, TargetConfig


class WeightFiles:
    """The tensors of one HF folder by name (`names` maps the names asked for to the names in
    the files: the draft's aliases), loaded on demand and checked for shape."""

    def __init__(self, model_dir: str | os.PathLike, what: str, names: bool = False):
        self.dir, self.what = Path(model_dir), what
        self.src = weight_source(model_dir, what, allow_bin=True)
        self.names = draft_keys(self.src.key_to_file) if names else {k: k for k in self.src.key_to_file}
        self.reader = TensorReader(self.src)

    def has(self, name: str) -> bool:
        return name in self.names

    def file(self, name: str) -> Path:
        return self.src.key_to_file[self.names[name]]

    def get(self, name: str, shape: tuple[int, ...] | None = None, why: str = "") -> Tensor:
        """Load a tensor on the CPU; check its shape when given."""
        if name not in self.names:
            raise DynspecError(f"{self.what} folder {self.dir}: missing tensor '{name}'"
                               f"{' (' + why + ')' if why else ''}")
        real = self.names[name]
        t = self.reader.get(real)
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise DynspecError(f"{self.file(name)}: tensor '{real}' has shape {list(t.shape)}, expected "
                               f"{list(shape)}{' (' + why + ')' if why else ''}")
        return t


def _device(device) -> torch.device:
    return torch.empty(0, device=device).device


def _copy(dst: Tensor, src: Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src)


def load_target(model_dir: str | os.PathLike, *, device="cpu", dtype: torch.dtype = torch.float32) -> Target:
    """A Target (weights fused, in `dtype` on `device`, eval mode) from an HF Llama folder."""
    cfg, where = read_config(model_dir, "target"), str(Path(model_dir) / "config.json")
    c = TargetConfig.from_hf(cfg, where)
    w = WeightFiles(model_dir, "target")
    m = Target(c, device=device, dtype=dtype)
    h, q, kv, inter = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    _copy(m.tok_embeddings.weight, w.get("model.embed_tokens.weight", shape=(c.vocab_size, h)))
    for i, blk in enumerate(m.layers):
        p = f"model.layers.{i}."
        _copy(blk.attention_norm, w.get(p + "input_layernorm.weight", shape=(h,)))
        _copy(blk.wqkv[:q], w.get(p + "self_attn.q_proj.weight", shape=(q, h)))
        _copy(blk.wqkv[q:q + kv], w.get(p + "self_attn.k_proj.weight", shape=(kv, h)))
        _copy(blk.wqkv[q + kv:], w.get(p + "self_attn.v_proj.weight", shape=(kv, h)))
        _copy(blk.wo, w.get(p + "self_attn.o_proj.weight", shape=(h, q)))
        _copy(blk.ffn_norm, w.get(p + "post_attention_layernorm.weight", shape=(h,)))
        _copy(blk.w13[:inter], w.get(p + "mlp.gate_proj.weight", shape=(inter, h)))
        _copy(blk.w13[inter:], w.get(p + "mlp.up_proj.weight", shape=(inter, h)))
        _copy(blk.w2, w.get(p + "mlp.down_proj.weight", shape=(h, inter)))
    _copy(m.norm, w.get("model.norm.weight", shape=(h,)))
    if m.output is not None:
        _copy(m.output, w.get("lm_head.weight", shape=(c.vocab_size, h),
                              why="config.json has tie_word_embeddings=false"))
    return m.eval()


def load_draft(model_dir: str | os.PathLike, target: Target, *, device="cpu", dtype: torch.dtype = torch.float32,
               capture_layers: tuple[int, ...] | None = None) -> Eagle3Draft:
    """An Eagle3Draft from a public EAGLE-3 folder, validated against `target`.

    `capture_layers` (outputs-of-layer convention) overrides what the draft config names.
    """
    cfg, where = read_config(model_dir, "draft"), str(Path(model_dir) / "config.json")
    capture = resolve_capture_layers(cfg, where, target.config.num_layers, capture_layers).layers
    c = Eagle3Config.from_hf(cfg, where, target.config, capture_layers=capture)
    w = WeightFiles(model_dir, "draft", names=True)
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
    m = Eagle3Draft(c, embed=embed, device=device, dtype=dtype)
    if own_embed:
        _copy(m.embed_tokens.weight, w.get("embed_tokens.weight", shape=(c.vocab_size, h)))
    n = len(c.capture_layers)
    _copy(m.fc, w.get("fc.weight", shape=(h, c.fused_width),
                      why=f"fc takes {n} captured layers {c.capture_layers} x target hidden {c.target_hidden_size}"))
    get = lambda name, shape: w.get("midlayer." + name, shape=shape)  # noqa: E731
    _copy(m.hidden_norm, get("hidden_norm.weight", (h,)))
    _copy(m.input_layernorm, get("input_layernorm.weight", (h,)))
    _copy(m.wqkv[:q], get("self_attn.q_proj.weight", (q, 2 * h)))
    _copy(m.wqkv[q:q + kv], get("self_attn.k_proj.weight", (kv, 2 * h)))
    _copy(m.wqkv[q + kv:], get("self_attn.v_proj.weight", (kv, 2 * h)))
    _copy(m.wo, get("self_attn.o_proj.weight", (h, q)))
    _copy(m.post_attention_layernorm, get("post_attention_layernorm.weight", (h,)))
    _copy(m.w13[:inter], get("mlp.gate_proj.weight", (inter, h)))
    _copy(m.w13[inter:], get("mlp.up_proj.weight", (inter, h)))
    _copy(m.w2, get("mlp.down_proj.weight", (h, inter)))
    _copy(m.norm, w.get("norm.weight", shape=(h,)))
    _copy(m.lm_head, w.get("lm_head.weight", shape=(c.draft_vocab_size, h)))
    if w.has("d2t") or w.has("t2d") or c.draft_vocab_size != c.vocab_size:
        why = f"draft_vocab_size {c.draft_vocab_size} < vocab_size {c.vocab_size}"
        d2t = w.get("d2t", shape=(c.draft_vocab_size,), why=why)
        t2d = w.get("t2d", shape=(c.vocab_size,), why=why)
        check_vocab_maps(d2t, t2d, c.draft_vocab_size, c.vocab_size, str(w.file("d2t")))
        m.d2t.copy_(d2t.long())
        m.t2d.copy_(t2d.bool())
    return m.eval()
