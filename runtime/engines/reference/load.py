"""Load HF folders into the reference models, checking every input on the way.

A target folder is a transformers Llama checkpoint: config.json plus model.safetensors,
sharded safetensors with model.safetensors.index.json, or pytorch_model.bin (optionally
sharded with pytorch_model.bin.index.json). A draft folder is a public EAGLE-3 checkpoint
(config.json with `draft_vocab_size`, weights `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`,
`t2d`, optional `embed_tokens`). `.bin` files are read only with torch.load(weights_only=True).

Every bad input raises DynspecError naming the file and the field or tensor at fault.
q/k/v and gate/up weights are fused while loading; tensors are converted to the requested
dtype on the way in, so bf16 files load fine as float32 and the other way round.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from dynspec.errors import DynspecError

from .draft import Eagle3Config, Eagle3Draft
from .model import Target, TargetConfig

ST_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


def read_config(model_dir: str | os.PathLike, what: str) -> tuple[dict, str]:
    """(config dict, path string) of MODEL_DIR/config.json."""
    d = Path(model_dir)
    if not d.is_dir():
        raise DynspecError(f"{what} folder {d} does not exist")
    path = d / "config.json"
    if not path.is_file():
        raise DynspecError(f"{what} folder {d} has no config.json")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DynspecError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise DynspecError(f"{path}: must hold a JSON object")
    return cfg, str(path)


class WeightFiles:
    """The tensors of one HF folder: which file holds which name, loaded on demand."""

    def __init__(self, model_dir: str | os.PathLike, what: str):
        d = self.dir = Path(model_dir)
        self.what = what
        self.where: dict[str, Path] = {}      # tensor name -> file
        self._open: dict[Path, object] = {}   # file -> safe_open handle or loaded dict
        if (d / ST_INDEX).is_file():
            self._from_index(d / ST_INDEX)
        elif sorted(d.glob("*.safetensors")):
            for f in sorted(d.glob("*.safetensors")):
                for name in self._handle(f).keys():
                    self.where.setdefault(name, f)
        elif (d / BIN_INDEX).is_file():
            self._from_index(d / BIN_INDEX)
        elif (d / "pytorch_model.bin").is_file():
            f = d / "pytorch_model.bin"
            for name in self._handle(f).keys():
                self.where[name] = f
        else:
            raise DynspecError(f"{what} folder {d} has no weight files (*.safetensors, {ST_INDEX}, "
                               f"pytorch_model.bin or {BIN_INDEX})")

    def _from_index(self, index: Path) -> None:
        try:
            obj = json.loads(index.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DynspecError(f"{index}: not valid JSON: {e}") from e
        wm = obj.get("weight_map") if isinstance(obj, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise DynspecError(f"{index}: missing or empty field 'weight_map'")
        for name, shard in wm.items():
            f = self.dir / str(shard)
            if not f.is_file():
                raise DynspecError(f"{index}: shard '{shard}' named for tensor '{name}' does not exist in {self.dir}")
            self.where[name] = f

    def _handle(self, f: Path):
        if f not in self._open:
            try:
                if f.suffix == ".safetensors":
                    self._open[f] = safe_open(str(f), framework="pt", device="cpu")
                else:
                    sd = torch.load(str(f), map_location="cpu", weights_only=True)
                    if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
                        raise DynspecError(f"{f}: expected a dict of tensors (a state dict)")
                    self._open[f] = sd
            except DynspecError:
                raise
            except Exception as e:  # safetensors/pickle/zip errors all mean a corrupt file
                raise DynspecError(f"{f}: cannot read weights (corrupt or not a "
                                   f"{'safetensors' if f.suffix == '.safetensors' else 'torch'} file): "
                                   f"{type(e).__name__}: {e}") from e
        return self._open[f]

    def find(self, *names: str) -> str | None:
        """The first of `names` that some file holds (aliases for one tensor), else None."""
        for n in names:
            if n in self.where:
                return n
        return None

    def get(self, *names: str, shape: tuple[int, ...] | None = None, why: str = "") -> Tensor:
        """Load a tensor (first matching alias) on the CPU; check its shape when given."""
        name = self.find(*names)
        if name is None:
            raise DynspecError(f"{self.what} folder {self.dir}: missing tensor '{names[0]}'"
                               f"{' (' + why + ')' if why else ''}")
        f = self.where[name]
        h = self._handle(f)
        try:
            t = h[name] if isinstance(h, dict) else h.get_tensor(name)
        except Exception as e:
            raise DynspecError(f"{f}: cannot read tensor '{name}' (corrupt file?): {type(e).__name__}: {e}") from e
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise DynspecError(f"{f}: tensor '{name}' has shape {list(t.shape)}, expected {list(shape)}"
                               f"{' (' + why + ')' if why else ''}")
        return t


def _device(device) -> torch.device:
    return torch.empty(0, device=device).device


def _copy(dst: Tensor, src: Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src)


def load_target(model_dir: str | os.PathLike, *, device="cpu", dtype: torch.dtype = torch.float32) -> Target:
    """A Target (weights fused, in `dtype` on `device`, eval mode) from an HF Llama folder."""
    cfg, where = read_config(model_dir, "target")
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


def _draft_names(name: str) -> tuple[str, ...]:
    """Aliases: EAGLE-3 `midlayer.*` is `layers.0.*` in speculators checkpoints; some add `model.`."""
    names = [name]
    if name.startswith("midlayer."):
        names.append("layers.0." + name[len("midlayer."):])
    return tuple(names) + tuple("model." + n for n in names)


def check_vocab_maps(d2t: Tensor, t2d: Tensor, where: str) -> None:
    """d2t [draft_vocab] int offsets and t2d [vocab] bool must describe the same id set."""
    dv, v = d2t.shape[0], t2d.shape[0]
    mapped = torch.arange(dv) + d2t
    if mapped.min() < 0 or mapped.max() >= v:
        raise DynspecError(f"{where}: tensor 'd2t' maps draft ids outside the target vocab 0..{v - 1}")
    if int(t2d.sum()) != dv:
        raise DynspecError(f"{where}: tensor 't2d' marks {int(t2d.sum())} target ids but draft_vocab_size is {dv}")
    if not bool(t2d[mapped].all()) or mapped.unique().numel() != dv:
        raise DynspecError(f"{where}: tensors 'd2t' and 't2d' disagree (d2t must map the draft vocab one-to-one "
                           "onto the ids t2d marks)")


def load_draft(model_dir: str | os.PathLike, target: Target, *, device="cpu", dtype: torch.dtype = torch.float32,
               capture_layers: tuple[int, ...] | None = None) -> Eagle3Draft:
    """An Eagle3Draft from a public EAGLE-3 folder, validated against `target`.

    `capture_layers` (outputs-of-layer convention) overrides what the draft config names.
    """
    cfg, where = read_config(model_dir, "draft")
    c = Eagle3Config.from_hf(cfg, where, target.config, capture_layers=capture_layers)
    w = WeightFiles(model_dir, "draft")
    h, q, kv, inter = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    own_embed = w.find(*_draft_names("embed_tokens.weight"))
    embed = None
    if own_embed is None:
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
    if own_embed is not None:
        _copy(m.embed_tokens.weight, w.get(own_embed, shape=(c.vocab_size, h)))
    n = len(c.capture_layers)
    _copy(m.fc, w.get("fc.weight", *_draft_names("fc.weight")[1:], shape=(h, c.fused_width),
                      why=f"fc takes {n} captured layers {c.capture_layers} x target hidden {c.target_hidden_size}"))
    p = "midlayer."
    get = lambda name, shape: w.get(*_draft_names(p + name), shape=shape)  # noqa: E731
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
    _copy(m.norm, w.get(*_draft_names("norm.weight"), shape=(h,)))
    _copy(m.lm_head, w.get(*_draft_names("lm_head.weight"), shape=(c.draft_vocab_size, h)))
    has_maps = w.find(*_draft_names("d2t")) is not None or w.find(*_draft_names("t2d")) is not None
    if has_maps or c.draft_vocab_size != c.vocab_size:
        why = f"draft_vocab_size {c.draft_vocab_size} < vocab_size {c.vocab_size}"
        d2t = w.get(*_draft_names("d2t"), shape=(c.draft_vocab_size,), why=why)
        t2d = w.get(*_draft_names("t2d"), shape=(c.vocab_size,), why=why)
        if d2t.is_floating_point() or d2t.dtype == torch.bool:
            raise DynspecError(f"{w.where[w.find(*_draft_names('d2t'))]}: tensor 'd2t' must hold integers, "
                               f"not {d2t.dtype}")
        t2d = t2d.bool() if t2d.dtype != torch.bool else t2d
        check_vocab_maps(d2t.long(), t2d, str(w.where[w.find(*_draft_names('d2t'))]))
        m.d2t.copy_(d2t.long())
        m.t2d.copy_(t2d)
    return m.eval()
