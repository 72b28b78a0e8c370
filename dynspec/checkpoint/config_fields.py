"""The type (and runnable value) of every config.json field a stage reads, checked once when
hf_config.read_config opens the file, so `dynspec convert` and the reference engine refuse the
same configs. A field that is absent or null is left to the stage (required or defaulted there).

    "tie_word_embeddings": "false"  -> field 'tie_word_embeddings' is 'false'; expected true or false
    "rope_theta": "abc"             -> field 'rope_theta' is 'abc'; expected a positive finite number
    "rope_scaling": {"rope_type": "yarn", ...}  -> field 'rope_scaling.rope_type' is 'yarn'; supported: ...
    "hidden_act": "gelu"            -> only 'silu' (SwiGLU) runs here
    "eos_token_id": [1.5]           -> field 'eos_token_id' is [1.5]; expected an int or a list of ints in [0, 256)

Bounds on values that type-check but no model has (each refused naming the field):
    rms_norm_eps                    RMS_NORM_EPS: 1e-12 .. 1e-2 (released models use 1e-6 .. 1e-5)
    rope scaling factor             ROPE_FACTOR: 1 .. 1024 (a context stretched up to 1024 times);
                                    low_freq_factor, high_freq_factor: > 0 and <= 1024
    max_position_embeddings         POSITIONS: 64 .. 2**31 - 1 (room for a prompt and the longest
                                    draft, MAX_DRAFT_LEN 32 plus one; positions are int32 on the GPU)
    eos_token_id                    each id in [0, vocab_size) when vocab_size is given
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
RMS_NORM_EPS = (1e-12, 1e-2)          # inclusive bounds
ROPE_FACTOR = (1.0, 1024.0)           # inclusive bounds of rope scaling 'factor'
ROPE_FREQ_FACTOR_MAX = 1024.0         # low_freq_factor, high_freq_factor: (0, this]
POSITIONS = (64, 2**31 - 1)           # inclusive bounds of max_position_embeddings


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
        if k == "factor" and not ROPE_FACTOR[0] <= v <= ROPE_FACTOR[1]:
            raise _refuse(where, f"{key}.{k}", v, f"a number in [{ROPE_FACTOR[0]:g}, {ROPE_FACTOR[1]:g}]")
        if k.endswith("_freq_factor") and v > ROPE_FREQ_FACTOR_MAX:
            raise _refuse(where, f"{key}.{k}", v, f"a number in (0, {ROPE_FREQ_FACTOR_MAX:g}]")
        if k == "original_max_position_embeddings" and v > POSITIONS[1]:
            raise _refuse(where, f"{key}.{k}", v, f"a number in (0, {POSITIONS[1]}]")
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise DynspecError(f"{where}: field '{key}.high_freq_factor' must exceed low_freq_factor")


def check_eos(v: Any, vocab: Any, where: str, key: str = "eos_token_id") -> None:
    """null, an int or a list of ints, each in [0, vocab) (any id >= 0 when vocab is not an int)."""
    if v is None:
        return
    ids = v if isinstance(v, list) else [v]
    top = vocab if is_int(vocab) and vocab > 0 else None
    if not all(is_int(i) and i >= 0 and (top is None or i < top) for i in ids):
        span = f"[0, {top})" if top is not None else "[0, vocab_size)"
        raise _refuse(where, key, v, f"an int or a list of ints in {span}")


def _check_bounds(cfg: Mapping[str, Any], where: str) -> None:
    """The bounds of the module docstring, on fields whose types were checked already."""
    eps = cfg.get("rms_norm_eps")
    if eps is not None and not RMS_NORM_EPS[0] <= eps <= RMS_NORM_EPS[1]:
        raise _refuse(where, "rms_norm_eps", eps, f"a number in [{RMS_NORM_EPS[0]:g}, {RMS_NORM_EPS[1]:g}]")
    n = cfg.get("max_position_embeddings")
    if n is not None and not POSITIONS[0] <= n <= POSITIONS[1]:
        raise _refuse(where, "max_position_embeddings", n, f"an integer in [{POSITIONS[0]}, {POSITIONS[1]}]")
    check_eos(cfg.get("eos_token_id"), cfg.get("vocab_size"), where)


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
    _check_bounds(cfg, where)
    check_rope_scaling(cfg.get("rope_scaling"), where)
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_scaling" not in cfg:
        theta = params.get("rope_theta")
        if theta is not None and (not is_number(theta) or theta <= 0):
            raise _refuse(where, "rope_parameters.rope_theta", theta, "a positive finite number")
        check_rope_scaling({k: v for k, v in params.items() if k != "rope_theta"}, where, "rope_parameters")
