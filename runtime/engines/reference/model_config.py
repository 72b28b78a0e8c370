"""HF config.json reading for the reference engine: checked field access (`hf_field`), the
attention shape, RoPE and activation checks, and the target's `TargetConfig`. Shared with the
EAGLE-3 draft in draft.py.

Every error names the file and the field, e.g. hf_field({"hidden_size": 0}, "hidden_size",
"t/config.json") raises "t/config.json: field 'hidden_size' must be positive, got 0".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dynspec.errors import DynspecError

_REQUIRED = object()


def hf_field(cfg: dict, key: str, where: str, kind: type = int, default: Any = _REQUIRED, *,
             positive: bool = True) -> Any:
    """Read one field of an HF config dict; raise DynspecError naming `where` and `key`."""
    v = cfg.get(key)
    if v is None:
        if default is _REQUIRED:
            raise DynspecError(f"{where}: missing field '{key}'")
        return default
    if kind is bool:
        ok = isinstance(v, bool)
    elif kind is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    else:
        ok = isinstance(v, kind)
    if not ok:
        raise DynspecError(f"{where}: field '{key}' must be {kind.__name__}, got {v!r}")
    if positive and kind in (int, float) and v <= 0:
        raise DynspecError(f"{where}: field '{key}' must be positive, got {v!r}")
    return float(v) if kind is float else v


ROPE_TYPES = ("default", "linear", "llama3")


def attention_dims(cfg: dict, where: str) -> tuple[int, int, int, int]:
    """(hidden_size, heads, kv_heads, head_dim) of an HF config, checked for GQA and RoPE."""
    hidden = hf_field(cfg, "hidden_size", where)
    heads = hf_field(cfg, "num_attention_heads", where)
    kv_heads = hf_field(cfg, "num_key_value_heads", where, int, heads)
    if heads % kv_heads:
        raise DynspecError(f"{where}: field 'num_attention_heads' ({heads}) must be a multiple of "
                           f"'num_key_value_heads' ({kv_heads})")
    if cfg.get("head_dim") is None and hidden % heads:
        raise DynspecError(f"{where}: field 'hidden_size' ({hidden}) is not divisible by "
                           f"'num_attention_heads' ({heads}) and no 'head_dim' is given")
    head_dim = hf_field(cfg, "head_dim", where, int, hidden // heads)
    if head_dim % 2:
        raise DynspecError(f"{where}: field 'head_dim' ({head_dim}) must be even for RoPE")
    return hidden, heads, kv_heads, head_dim


def parse_rope(cfg: dict, where: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from an HF config; checks the scaling fields we use.

    Accepts the transformers<=4.x form (`rope_theta`, `rope_scaling`) and the newer
    `rope_parameters` dict. Returns rope_scaling None for plain RoPE.
    """
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "rope_scaling" not in cfg:
        theta = hf_field({**cfg, **params}, "rope_theta", where, float, 10000.0)
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = hf_field(cfg, "rope_theta", where, float, 10000.0)
        scaling = cfg.get("rope_scaling")
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise DynspecError(f"{where}: field 'rope_scaling' must be an object or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise DynspecError(f"{where}: field 'rope_scaling.rope_type' is {kind!r}; supported: {ROPE_TYPES}")
    if kind == "default":
        return theta, None
    need = ("factor",) if kind == "linear" else (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    out = {"rope_type": kind}
    for k in need:
        out[k] = hf_field(scaling, k, f"{where}: rope_scaling", float)
        if k == "original_max_position_embeddings":
            out[k] = int(out[k])
    if kind == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise DynspecError(f"{where}: field 'rope_scaling.high_freq_factor' must exceed low_freq_factor")
    return theta, out


def check_silu(cfg: dict, where: str) -> None:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise DynspecError(f"{where}: field 'hidden_act' is {act!r}; only 'silu' (SwiGLU) is supported")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise DynspecError(f"{where}: field '{key}' is true; biased projections are not supported")


@dataclass(frozen=True)
class TargetConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def from_hf(cls, cfg: dict, where: str) -> "TargetConfig":
        """From a transformers LlamaConfig dict (config.json); `where` names the file."""
        if not isinstance(cfg, dict):
            raise DynspecError(f"{where}: expected a JSON object")
        mt = cfg.get("model_type", "llama")
        if mt != "llama":
            raise DynspecError(f"{where}: field 'model_type' is {mt!r}; only 'llama' targets are supported")
        check_silu(cfg, where)
        hidden, heads, kv_heads, head_dim = attention_dims(cfg, where)
        theta, scaling = parse_rope(cfg, where)
        return cls(
            vocab_size=hf_field(cfg, "vocab_size", where),
            hidden_size=hidden,
            intermediate_size=hf_field(cfg, "intermediate_size", where),
            num_layers=hf_field(cfg, "num_hidden_layers", where),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=hf_field(cfg, "rms_norm_eps", where, float, 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=hf_field(cfg, "tie_word_embeddings", where, bool, False),
            max_position_embeddings=hf_field(cfg, "max_position_embeddings", where, int, 2048),
        )
