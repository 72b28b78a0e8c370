"""The type (and runnable value) of every config.json field a stage reads, checked once when
reader.read_config opens the file, so `dynspec convert` and the reference engine refuse the
same configs. A field that is absent or null is left to the stage (required or defaulted there).

    "tie_word_embeddings": "false"  -> field 'tie_word_embeddings' is 'false'; expected true or false
    "rope_theta": "abc"             -> field 'rope_theta' is 'abc'; expected a positive finite number
    "rope_scaling": {"rope_type": "yarn", ...}  -> field 'rope_scaling.rope_type' is 'yarn'; supported: ...
    "hidden_act": "gelu"            -> only 'silu' (SwiGLU) runs here
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from dynspec.errors import DynspecError

POSITIVE_INTS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                 "vocab_size", "num_hidden_layers", "max_position_embeddings", "draft_vocab_size",
                 "target_hidden_size")
BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "norm_before_residual")
POSITIVE_NUMBERS = ("rms_norm_eps", "rope_theta")
OBJECTS = ("eagle_config", "rope_parameters")
ROPE_TYPES = ("default", "linear", "llama3")
ROPE_FIELDS = {"default": (), "linear": ("factor",),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
ACTIVATIONS = ("silu",)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _refuse(where: str, key: str, v: Any, expected: str) -> DynspecError:
    return DynspecError(f"{where}: field '{key}' is {v!r}; expected {expected}")


def check_rope_scaling(scaling: Any, where: str, key: str = "rope_scaling") -> None:
    """null, or {"rope_type" (or "type"): one of ROPE_TYPES, plus that type's positive numbers}."""
    if scaling is None:
        return
    if not isinstance(scaling, Mapping):
        raise _refuse(where, key, scaling, "an object or null")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise DynspecError(f"{where}: field '{key}.rope_type' is {kind!r}; supported: {ROPE_TYPES}")
    for k in ROPE_FIELDS[kind]:
        v = scaling.get(k)
        if v is None:
            raise DynspecError(f"{where}: {key}: missing field '{k}' (needed by rope_type {kind!r})")
        if not is_number(v) or v <= 0:
            raise _refuse(where, f"{key}.{k}", v, "a positive finite number")
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise DynspecError(f"{where}: field '{key}.high_freq_factor' must exceed low_freq_factor")


def check_config(cfg: Mapping[str, Any], where: str) -> None:
    """Every field above that is present (not null) has its type and a value a stage can run."""
    for key in POSITIVE_INTS:
        v = cfg.get(key)
        if v is not None and (not is_int(v) or v < 1):
            raise _refuse(where, key, v, "a positive integer")
    for key in BOOLS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, bool):
            raise _refuse(where, key, v, "true or false")
    for key in POSITIVE_NUMBERS:
        v = cfg.get(key)
        if v is not None and (not is_number(v) or v <= 0):
            raise _refuse(where, key, v, "a positive finite number")
    for key in OBJECTS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, Mapping):
            raise _refuse(where, key, v, "an object or null")
    for key in ("model_type", "hidden_act"):
        v = cfg.get(key)
        if v is not None and not isinstance(v, str):
            raise _refuse(where, key, v, "a string")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise _refuse(where, "architectures", archs, "a list of strings")
    act = cfg.get("hidden_act")
    if act is not None and act not in ACTIVATIONS:
        raise DynspecError(f"{where}: field 'hidden_act' is {act!r}; only 'silu' (SwiGLU) is supported")
    check_rope_scaling(cfg.get("rope_scaling"), where)
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_scaling" not in cfg:
        theta = params.get("rope_theta")
        if theta is not None and (not is_number(theta) or theta <= 0):
            raise _refuse(where, "rope_parameters.rope_theta", theta, "a positive finite number")
        check_rope_scaling({k: v for k, v in params.items() if k != "rope_theta"}, where, "rope_parameters")
