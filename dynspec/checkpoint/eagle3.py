"""What a public EAGLE-3 draft checkpoint's config and tensors mean, for convert and the engine.

Capture layers use TRT-LLM's convention (eagle3_layers_to_capture): the OUTPUT of layer i,
default (1, L//2-1, L-4). Draft configs name them in one of two public conventions:
    eagle_config.eagle_aux_hidden_state_layer_ids   SpecForge/SGLang: outputs of layer i, as is
    eagle_aux_hidden_state_layer_ids (top level)    vLLM/speculators: id j is the INPUT of layer j,
                                                    i.e. the output of layer j-1: subtract 1
    L=80: vLLM (2, 40, 77)  ==  TRT-LLM / SGLang config (1, 39, 76)
Names: speculators checkpoints call the layer "layers.0." and some prefix "model.":
    "model.layers.0.mlp.up_proj.weight" -> "midlayer.mlp.up_proj.weight"
Vocabulary maps: d2t [draft_vocab] integer offsets, target_id = draft_id + d2t[draft_id];
t2d [vocab] bool, the target ids the draft vocabulary covers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from dynspec.errors import DynspecError

if TYPE_CHECKING:
    import torch

KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class CaptureLayers:
    layers: tuple[int, ...]   # TRT-LLM convention: outputs of these target layers
    source: str               # where they came from, for messages and the manifest


def default_capture_layers(num_layers: int) -> tuple[int, ...]:
    """TRT-LLM's default eagle3_layers_to_capture: (1, L//2-1, L-4). L=32 -> (1, 15, 28)."""
    return (1, num_layers // 2 - 1, num_layers - 4)


def _check_layers(ids, field: str, where: str, num_layers: int, shift: int = 0) -> tuple[int, ...]:
    if not isinstance(ids, (list, tuple)) or not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DynspecError(f"{where}: field '{field}' must be a non-empty list of integers, got {ids!r}")
    out = tuple(i - shift for i in ids)
    bad = [i + shift for i in out if not 0 <= i < num_layers]
    if bad:
        what = (f"(vLLM convention: id i is the input of layer i, so ids must be 1..{num_layers})" if shift
                else f"(outputs of layers 0..{num_layers - 1})")
        raise DynspecError(f"{where}: field '{field}' has ids {bad} out of range for a target with "
                           f"{num_layers} layers {what}")
    if len(set(out)) != len(out):
        raise DynspecError(f"{where}: field '{field}' = {list(ids)} repeats a layer; capture layers must be distinct")
    return out


def resolve_capture_layers(cfg: dict, where: str, num_layers: int,
                           override: tuple[int, ...] | None = None) -> CaptureLayers:
    """Capture layers (outputs-of-layer convention) from an override, the config, or the default."""
    if override is not None:
        layers = _check_layers(list(override), "capture_layers (override)", where, num_layers)
        return CaptureLayers(layers, f"override {list(layers)}")
    eagle_cfg = cfg.get("eagle_config")
    outs = eagle_cfg.get(KEY) if isinstance(eagle_cfg, dict) else None
    ins = cfg.get(KEY)
    from_outs = _check_layers(outs, f"eagle_config.{KEY}", where, num_layers) if outs is not None else None
    from_ins = _check_layers(ins, KEY, where, num_layers, shift=1) if ins is not None else None
    if from_outs is not None and from_ins is not None and from_outs != from_ins:
        raise DynspecError(f"{where}: 'eagle_config.{KEY}' {list(outs)} (outputs of layers) and '{KEY}' "
                           f"{list(ins)} (vLLM: inputs of layers) disagree")
    if from_outs is not None:
        return CaptureLayers(from_outs, f"eagle_config.{KEY} {list(outs)} (outputs of layers)")
    if from_ins is not None:
        return CaptureLayers(from_ins, f"{KEY} {list(ins)} (vLLM input-of-layer ids, minus 1)")
    default = default_capture_layers(num_layers)
    if min(default) < 0 or len(set(default)) != len(default):
        raise DynspecError(f"{where}: the default EAGLE-3 capture layers {default} do not fit a target with "
                           f"{num_layers} layers; name them in field 'eagle_config.{KEY}'")
    return CaptureLayers(default, f"default (1, L//2-1, L-4) for L={num_layers}")


def target_hidden_size(cfg: dict, where: str, default: int) -> int:
    """Field 'target_hidden_size' (absent: `default`, the draft's own hidden_size): a positive int.
    128.7, "128", true and 0 are refused, never rounded or cast."""
    v = cfg.get("target_hidden_size")
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise DynspecError(f"{where}: field 'target_hidden_size' is {v!r}; expected a positive integer")
    return v


def draft_key(name: str) -> str:
    """'model.layers.0.mlp.up_proj.weight' -> 'midlayer.mlp.up_proj.weight'; 'lm_head.weight' kept."""
    name = name.removeprefix("model.")
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def draft_keys(key_to_file: Mapping[str, object]) -> dict[str, str]:
    """canonical name -> name in the checkpoint; two names for one tensor are refused."""
    out: dict[str, str] = {}
    for name in key_to_file:
        key = draft_key(name)
        if key in out:
            raise DynspecError(f"tensors {out[key]!r} ({key_to_file[out[key]]}) and {name!r} ({key_to_file[name]}) "
                               f"are both {key!r}")
        out[key] = name
    return out


def check_vocab_maps(d2t: "torch.Tensor", t2d: "torch.Tensor | None", draft_vocab: int, vocab: int,
                     where: str) -> None:
    """d2t [draft_vocab] integers and t2d [vocab] bool (or 0/1) must map the draft vocabulary
    one-to-one onto the target ids t2d marks, all inside the target vocabulary."""
    import torch

    if d2t.is_floating_point() or d2t.is_complex() or d2t.dtype == torch.bool:
        raise DynspecError(f"{where}: tensor 'd2t' has dtype {d2t.dtype}; it must hold integer offsets")
    if tuple(d2t.shape) != (draft_vocab,):
        raise DynspecError(f"{where}: tensor 'd2t' has shape {list(d2t.shape)}, expected [{draft_vocab}]")
    targets = torch.arange(draft_vocab, dtype=torch.int64) + d2t.to(torch.int64)   # [draft_vocab]
    lo, hi = int(targets.min()), int(targets.max())
    if lo < 0 or hi >= vocab:
        raise DynspecError(f"{where}: tensor 'd2t' maps draft ids to target ids {lo}..{hi}, outside the target "
                           f"vocabulary 0..{vocab - 1}")
    if targets.unique().numel() != draft_vocab:
        raise DynspecError(f"{where}: tensor 'd2t' maps two draft ids to the same target id")
    if t2d is None:
        return
    if tuple(t2d.shape) != (vocab,):
        raise DynspecError(f"{where}: tensor 't2d' has shape {list(t2d.shape)}, expected [{vocab}]")
    if t2d.dtype != torch.bool and (t2d.is_floating_point() or not bool(((t2d == 0) | (t2d == 1)).all())):
        raise DynspecError(f"{where}: tensor 't2d' has dtype {t2d.dtype}; it must hold bool (or 0/1) marks")
    marks = t2d.bool()
    if int(marks.sum()) != draft_vocab:
        raise DynspecError(f"{where}: tensor 't2d' marks {int(marks.sum())} target ids but draft_vocab_size is "
                           f"{draft_vocab}")
    if not bool(marks[targets].all()):
        raise DynspecError(f"{where}: tensors 'd2t' and 't2d' disagree: some target ids d2t maps to are not "
                           "marked in t2d")
