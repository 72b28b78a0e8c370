"""`dynspec convert eagle3`: a public-format EAGLE-3 draft -> the layout TRT-LLM's PyTorch
backend loads as a two-model EAGLE-3 draft, checked against the converted target.

Public format in (pytorch_model.bin or safetensors), TRT-LLM layout out (model.safetensors):
    config.json   architectures ["LlamaForCausalLMEagle3"], model_type "llama", num_hidden_layers 1,
                  draft_vocab_size, target_hidden_size; TRT-LLM's AutoModelForCausalLM maps this
                  architecture (with draft_vocab_size present) to EAGLE3LlamaForCausalLM.
    fc.weight                       [h, n_capture * h_target]   fuses the captured target layers
    midlayer.self_attn.{q,k,v}_proj [*, 2h]                     attention reads [embed; fused]
    midlayer.self_attn.o_proj, midlayer.mlp.{gate,up,down}_proj
    midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight, norm.weight
    lm_head.weight                  [draft_vocab, h]
    d2t   [draft_vocab] int  offsets: target_id = draft_id + d2t[draft_id]
    t2d   [vocab] bool       which target ids the draft vocabulary covers (optional)
    embed_tokens.weight      optional; without it the draft shares the target's embedding
Checkpoints that name the layer "layers.0." or prefix names with "model." are normalized.

Capture layers use TRT-LLM's convention (eagle3_layers_to_capture): the OUTPUT of layer i,
default (1, L//2-1, L-4). Draft configs name them in one of two public conventions:
    eagle_config.eagle_aux_hidden_state_layer_ids   SpecForge/SGLang: outputs of layer i, as is
                                                    (SGLang adds 1 to turn them into its inputs)
    eagle_aux_hidden_state_layer_ids (top level)    vLLM/speculators: id j is the INPUT of layer j,
                                                    i.e. the output of layer j-1: subtract 1
    L=80: vLLM (2, 40, 77)  ==  TRT-LLM / SGLang config (1, 39, 76)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from dynspec.artifacts import atomic_dir, write_json
from dynspec.convert.checks import require_tp
from dynspec.convert.hf import copy_tokenizer_files, iter_tensors, read_config, weight_source
from dynspec.convert.manifest import CHECKPOINT_FORMAT, MANIFEST, manifest_shape, read_manifest
from dynspec.convert.shapes import (ModelShape, eagle3_weight_bytes_per_rank, kv_bytes_per_token_per_rank,
                                    shape_from_hf_config)
from dynspec.convert.target import DTYPES
from dynspec.convert.writer import ShardWriter
from dynspec.errors import DynspecError

ARCHITECTURE = "LlamaForCausalLMEagle3"
UNSUPPORTED_EAGLE_OPTIONS = ("eh_proj_before_attn", "norm_before_fc")


@dataclass(frozen=True)
class CaptureLayers:
    layers: tuple[int, ...]   # TRT-LLM convention: outputs of these target layers
    source: str


def default_capture_layers(n_layers: int) -> tuple[int, ...]:
    """TRT-LLM's default eagle3_layers_to_capture: {1, L//2-1, L-4}. L=32 -> (1, 15, 28)."""
    return (1, n_layers // 2 - 1, n_layers - 4)


def _layer_ids(ids, field: str, where: str) -> list[int]:
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DynspecError(f"{where}: field {field!r} is {ids!r}; expected a non-empty list of layer ids")
    return ids


def capture_layers_from_config(cfg: dict, target_layers: int, where: str) -> CaptureLayers:
    key = "eagle_aux_hidden_state_layer_ids"
    eagle_cfg = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    outs = eagle_cfg.get(key)
    ins = cfg.get(key)
    from_outs = from_ins = None
    if outs is not None:
        from_outs = tuple(_layer_ids(outs, "eagle_config." + key, where))
    if ins is not None:
        from_ins = tuple(i - 1 for i in _layer_ids(ins, key, where))
    if from_outs is not None and from_ins is not None and from_outs != from_ins:
        raise DynspecError(
            f"{where}: eagle_config.{key} {list(outs)} (outputs of layers) and top-level {key} {list(ins)} "
            "(vLLM: inputs of layers) name different capture layers"
        )
    if from_outs is not None:
        layers, source = from_outs, f"eagle_config.{key} {list(outs)} (outputs of layers)"
    elif from_ins is not None:
        layers, source = from_ins, f"{key} {list(ins)} (vLLM input-of-layer ids, minus 1)"
    else:
        layers, source = default_capture_layers(target_layers), f"default (1, L//2-1, L-4) for L={target_layers}"
    for i in layers:
        if not 0 <= i < target_layers:
            raise DynspecError(
                f"capture layer {i} ({source}) is outside the target's layers 0..{target_layers - 1}"
            )
    if len(set(layers)) != len(layers):
        raise DynspecError(f"capture layers {list(layers)} ({source}) repeat a layer; the target has {target_layers}")
    return CaptureLayers(layers, source)


def normalize_name(name: str) -> str:
    """'model.layers.0.mlp.up_proj.weight' -> 'midlayer.mlp.up_proj.weight'; lm_head kept."""
    if name.startswith("model."):
        name = name[len("model."):]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def expected_draft_tensors(d: ModelShape, draft_vocab: int, target_hidden: int, n_capture: int) -> dict:
    h, q, kv, i = d.hidden, d.q_size, d.kv_size, d.intermediate
    m = "midlayer."
    return {
        "fc.weight": (h, n_capture * target_hidden),
        m + "self_attn.q_proj.weight": (q, 2 * h), m + "self_attn.k_proj.weight": (kv, 2 * h),
        m + "self_attn.v_proj.weight": (kv, 2 * h), m + "self_attn.o_proj.weight": (h, q),
        m + "mlp.gate_proj.weight": (i, h), m + "mlp.up_proj.weight": (i, h), m + "mlp.down_proj.weight": (h, i),
        m + "input_layernorm.weight": (h,), m + "hidden_norm.weight": (h,),
        m + "post_attention_layernorm.weight": (h,),
        "norm.weight": (h,), "lm_head.weight": (draft_vocab, h),
        "embed_tokens.weight": (d.vocab, h),
        "d2t": (draft_vocab,), "t2d": (d.vocab,),
    }


def check_vocab_maps(tensors: dict, draft_vocab: int, vocab: int, where: str) -> None:
    """d2t/t2d must describe the same draft_vocab target ids, all inside the target vocabulary."""
    import torch

    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is None:
        if draft_vocab != vocab:
            raise DynspecError(f"{where}: no d2t tensor, but draft_vocab_size={draft_vocab} != vocab_size={vocab}")
        return
    if d2t.dtype not in (torch.int64, torch.int32):
        raise DynspecError(f"{where}: d2t has dtype {d2t.dtype}; expected int64 or int32 offsets")
    targets = torch.arange(draft_vocab, dtype=torch.int64) + d2t.to(torch.int64)   # [draft_vocab]
    lo, hi = int(targets.min()), int(targets.max())
    if lo < 0 or hi >= vocab:
        raise DynspecError(
            f"{where}: d2t maps draft ids to target ids {lo}..{hi}, outside the target vocabulary 0..{vocab - 1}"
        )
    if targets.unique().numel() != draft_vocab:
        raise DynspecError(f"{where}: d2t maps two draft ids to the same target id")
    if t2d is not None:
        if t2d.dtype != torch.bool:
            raise DynspecError(f"{where}: t2d has dtype {t2d.dtype}; expected bool")
        if int(t2d.sum()) != draft_vocab:
            raise DynspecError(f"{where}: t2d marks {int(t2d.sum())} target ids; draft_vocab_size is {draft_vocab}")
        if not bool(t2d[targets].all()):
            raise DynspecError(f"{where}: d2t and t2d disagree: some d2t targets are not marked in t2d")


def _read_draft_config(draft_dir: Path) -> tuple[dict, ModelShape, int, int]:
    where = str(draft_dir / "config.json")
    cfg = read_config(draft_dir)
    archs = cfg.get("architectures") or []
    if ARCHITECTURE not in archs:
        raise DynspecError(f"{where}: field 'architectures' is {archs!r}; an EAGLE-3 draft has [{ARCHITECTURE!r}]")
    dv = cfg.get("draft_vocab_size")
    if not isinstance(dv, int) or dv < 1:
        raise DynspecError(f"{where}: field 'draft_vocab_size' is {dv!r}; expected a positive integer")
    eagle_cfg = cfg.get("eagle_config") or {}
    for opt in UNSUPPORTED_EAGLE_OPTIONS:
        if isinstance(eagle_cfg, dict) and eagle_cfg.get(opt):
            raise DynspecError(f"{where}: eagle_config.{opt} is set; only the standard EAGLE-3 layout is supported")
    shape = shape_from_hf_config(cfg, where)
    if shape.layers != 1:
        raise DynspecError(f"{where}: num_hidden_layers={shape.layers}; EAGLE-3 drafts here have exactly 1 layer")
    th = cfg.get("target_hidden_size") or shape.hidden
    if dv > shape.vocab:
        raise DynspecError(f"{where}: draft_vocab_size={dv} exceeds vocab_size={shape.vocab}")
    return cfg, shape, dv, int(th)


def convert_eagle3(draft_dir: str | os.PathLike, target_dir: str | os.PathLike, out: str | os.PathLike,
                   tp: int = 8, dtype: str | None = None, force: bool = False, progress: bool = True) -> dict:
    """Check the draft against the converted target and write it in TRT-LLM's layout."""
    import torch
    from tqdm import tqdm

    draft_dir, target_dir = Path(draft_dir), Path(target_dir)
    where = str(draft_dir / "config.json")
    tm = read_manifest(target_dir, "target")
    ts = manifest_shape(tm, str(target_dir / MANIFEST))
    if tm["tp"] != tp:
        raise DynspecError(f"the target in {target_dir} was converted for tp={tm['tp']}; this draft asks for tp={tp}")
    cfg, ds, draft_vocab, target_hidden = _read_draft_config(draft_dir)
    if target_hidden != ts.hidden:
        raise DynspecError(
            f"{where}: target_hidden_size={target_hidden}, but the target's hidden_size is {ts.hidden}"
        )
    if ds.vocab != ts.vocab:
        raise DynspecError(
            f"{where}: vocab_size={ds.vocab} (the vocabulary behind d2t/t2d), but the target's vocab_size is {ts.vocab}"
        )
    report = require_tp(replace(ds, vocab=draft_vocab), tp, f"the draft ({where})", "draft_vocab_size")
    capture = capture_layers_from_config(cfg, ts.layers, where)
    dtype = dtype or tm["dtype"]
    if dtype not in DTYPES:
        raise DynspecError(f"--dtype {dtype!r} is not one of {list(DTYPES)}")

    src = weight_source(draft_dir, allow_bin=True)
    expected = expected_draft_tensors(ds, draft_vocab, target_hidden, len(capture.layers))
    tensors: dict = {}
    for name, t in tqdm(iter_tensors(src), total=len(src), unit="tensor", desc="read eagle3", disable=not progress):
        key = normalize_name(name)
        file = src.key_to_file[name].name
        if key not in expected:
            raise DynspecError(f"unexpected tensor {name!r} in {file}: not part of the EAGLE-3 layout")
        if key in tensors:
            raise DynspecError(f"tensor {name!r} in {file} duplicates {key!r}")
        want = expected[key]
        if key == "fc.weight" and tuple(t.shape) != want and t.dim() == 2 and t.shape[0] == want[0]:
            raise DynspecError(
                f"shape mismatch: fc.weight in {file} is {list(t.shape)}: it fuses {t.shape[1] / target_hidden:g} "
                f"target layers of hidden {target_hidden}, but {len(capture.layers)} capture layers "
                f"{list(capture.layers)} were chosen ({capture.source})"
            )
        if tuple(t.shape) != want:
            raise DynspecError(f"shape mismatch: tensor {name!r} in {file} is {list(t.shape)}; expected {list(want)}")
        if key not in ("d2t", "t2d") and not t.is_floating_point():
            raise DynspecError(f"dtype mismatch: tensor {name!r} in {file} is {t.dtype}; expected floating point")
        tensors[key] = t
    optional = {"embed_tokens.weight", "d2t", "t2d"}
    missing = sorted(set(expected) - optional - set(tensors))
    if missing:
        raise DynspecError(f"{draft_dir}: missing tensor {missing[0]!r}" +
                           (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    own_embed = "embed_tokens.weight" in tensors
    if not own_embed and ds.hidden != ts.hidden:
        raise DynspecError(
            f"{draft_dir}: no embed_tokens.weight, and the draft's hidden_size={ds.hidden} differs from the "
            f"target's {ts.hidden}, so it cannot share the target's embedding"
        )
    check_vocab_maps(tensors, draft_vocab, ds.vocab, str(draft_dir))

    torch_dtype = getattr(torch, dtype)
    out_cfg = dict(cfg, architectures=[ARCHITECTURE], model_type="llama", draft_vocab_size=draft_vocab,
                   target_hidden_size=target_hidden, num_hidden_layers=1, dtype=dtype, torch_dtype=dtype)
    with atomic_dir(out, force=force) as tmp:
        writer = ShardWriter(tmp)
        for key in sorted(tensors):
            t = tensors[key]
            writer.add(key, t.to(torch_dtype) if t.is_floating_point() else t)
        shards = writer.close()
        write_json(tmp / "config.json", out_cfg)
        tokenizer = copy_tokenizer_files(draft_dir, tmp)
        manifest = {
            "format": CHECKPOINT_FORMAT,
            "kind": "eagle3-draft",
            "architecture": ARCHITECTURE,
            "source": str(draft_dir.resolve()),
            "dtype": dtype,
            "tp": tp,
            "shape": ds.to_json(),
            "draft_vocab_size": draft_vocab,
            "target_hidden_size": target_hidden,
            "capture_layers": list(capture.layers),
            "capture_layers_convention": "output of target layer i (TRT-LLM eagle3_layers_to_capture)",
            "capture_layers_source": capture.source,
            "shares_target_embedding": not own_embed,
            "target": {"dir": str(target_dir.resolve()), "architecture": tm["architecture"],
                       "layers": ts.layers, "hidden_size": ts.hidden, "vocab_size": ts.vocab},
            "parameter_count": sum(t.numel() for k, t in tensors.items() if k not in ("d2t", "t2d")),
            "weight_bytes_per_rank": eagle3_weight_bytes_per_rank(
                ds, draft_vocab, target_hidden, len(capture.layers), own_embed, tp, dtype),
            "kv_bytes_per_token_per_rank": kv_bytes_per_token_per_rank(ds, tp, dtype),
            "checks": report.passed() + [
                {"name": "target_hidden_size", "detail": f"{target_hidden} == target hidden_size"},
                {"name": "vocab_size", "detail": f"{ds.vocab} == target vocab_size; d2t/t2d consistent"},
                {"name": "capture_layers", "detail": f"{list(capture.layers)} within target layers 0..{ts.layers - 1}"},
            ],
            "files": {"weights": shards, "tokenizer": tokenizer},
        }
        write_json(tmp / MANIFEST, manifest)
    return manifest
