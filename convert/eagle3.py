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

Capture layers, name aliases and the d2t/t2d rules: dynspec.checkpoint.eagle3 (shared with
the reference engine).
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from dynspec.artifacts import atomic_dir, check_apart, write_json
from dynspec.checkpoint.eagle3 import check_vocab_maps, draft_keys, resolve_capture_layers, target_hidden_size
from dynspec.checkpoint.hf_config import read_config
from dynspec.checkpoint.shapes import (ModelShape, eagle3_weight_bytes_per_rank, kv_bytes_per_token_per_rank,
                                       shape_from_hf_config)
from dynspec.checkpoint.tensor_reader import TensorReader
from dynspec.checkpoint.tp_checks import require_tp
from dynspec.checkpoint.weight_index import weight_source
from dynspec.checkpoint.writer import ShardWriter
from dynspec.convert.hf import copy_tokenizer_files
from dynspec.convert.manifest import CHECKPOINT_FORMAT, MANIFEST, manifest_shape, read_manifest
from dynspec.convert.target import DTYPES
from dynspec.errors import DynspecError

ARCHITECTURE = "LlamaForCausalLMEagle3"
UNSUPPORTED_EAGLE_OPTIONS = ("eh_proj_before_attn", "norm_before_fc")
OUTPUT_MARK = (MANIFEST, {"format": CHECKPOINT_FORMAT, "kind": "eagle3-draft"})   # what --force may replace


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


def _read_draft_config(draft_dir: Path) -> tuple[dict, ModelShape, int, int]:
    where = str(draft_dir / "config.json")
    cfg = read_config(draft_dir, "--draft")
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
    th = target_hidden_size(cfg, where, shape.hidden)
    if dv > shape.vocab:
        raise DynspecError(f"{where}: draft_vocab_size={dv} exceeds vocab_size={shape.vocab}")
    return cfg, shape, dv, th


def convert_eagle3(draft_dir: str | os.PathLike, target_dir: str | os.PathLike, out: str | os.PathLike,
                   tp: int = 8, dtype: str | None = None, force: bool = False, progress: bool = True) -> dict:
    """Check the draft against the converted target and write it in TRT-LLM's layout."""
    import torch

    draft_dir, target_dir = Path(draft_dir), Path(target_dir)
    check_apart(out, {"--draft": draft_dir, "--target": target_dir})
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
    capture = resolve_capture_layers(cfg, where, ts.layers)
    dtype = dtype or tm["dtype"]
    if dtype not in DTYPES:
        raise DynspecError(f"--dtype {dtype!r} is not one of {list(DTYPES)}")

    src = weight_source(draft_dir, "--draft", allow_bin=True)
    tensors = _read_draft_tensors(src, draft_dir, expected_draft_tensors(ds, draft_vocab, target_hidden,
                                                                         len(capture.layers)),
                                  capture, target_hidden, progress)
    own_embed = "embed_tokens.weight" in tensors
    if not own_embed and ds.hidden != ts.hidden:
        raise DynspecError(
            f"{draft_dir}: no embed_tokens.weight, and the draft's hidden_size={ds.hidden} differs from the "
            f"target's {ts.hidden}, so it cannot share the target's embedding"
        )
    if "d2t" in tensors:
        check_vocab_maps(tensors["d2t"], tensors.get("t2d"), draft_vocab, ds.vocab, str(draft_dir))
    elif draft_vocab != ds.vocab:
        raise DynspecError(f"{draft_dir}: no d2t tensor, but draft_vocab_size={draft_vocab} != vocab_size={ds.vocab}")

    torch_dtype = getattr(torch, dtype)
    out_cfg = dict(cfg, architectures=[ARCHITECTURE], model_type="llama", draft_vocab_size=draft_vocab,
                   target_hidden_size=target_hidden, num_hidden_layers=1, dtype=dtype, torch_dtype=dtype)
    with atomic_dir(out, force=force, mark=OUTPUT_MARK, one_line=True) as tmp:
        writer = ShardWriter(tmp)
        for key in sorted(tensors):
            t = tensors[key]
            writer.add(key, t.to(torch_dtype) if t.is_floating_point() else t)
        shards = writer.close()
        write_json(tmp / "config.json", out_cfg)
        tokenizer = copy_tokenizer_files(draft_dir, tmp)
        manifest = _manifest(draft_dir, target_dir, tm, ts, ds, dtype, tp, draft_vocab, target_hidden, capture,
                             own_embed, tensors, report, shards, tokenizer)
        write_json(tmp / MANIFEST, manifest)
        src.check_unchanged()                   # before the rename: the output is what the source held
    return manifest


def _read_draft_tensors(src, draft_dir: Path, expected: dict, capture, target_hidden: int, progress: bool) -> dict:
    """Every tensor of the draft's checkpoint by canonical name, checked against the EAGLE-3 layout
    (`expected`: canonical name -> shape): no unexpected or missing tensor, shapes and dtypes."""
    from tqdm import tqdm

    names = draft_keys(src.key_to_file)                  # canonical -> name in the checkpoint
    unexpected = sorted(set(names) - set(expected))
    if unexpected:
        name = names[unexpected[0]]
        raise DynspecError(f"unexpected tensor {name!r} in {src.key_to_file[name].name}: not part of the EAGLE-3 layout")
    optional = {"embed_tokens.weight", "d2t", "t2d"}
    missing = sorted(set(expected) - optional - set(names))
    if missing:
        raise DynspecError(f"{draft_dir}: missing tensor {missing[0]!r}" +
                           (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    reader = TensorReader(src)
    tensors: dict = {}
    for key in tqdm(sorted(names), unit="tensor", desc="read eagle3", disable=None if progress else True):
        name = names[key]
        t = reader.get(name)
        file = src.key_to_file[name].name
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
    return tensors


def _manifest(draft_dir: Path, target_dir: Path, tm: dict, ts, ds, dtype: str, tp: int, draft_vocab: int,
              target_hidden: int, capture, own_embed: bool, tensors: dict, report, shards, tokenizer) -> dict:
    """The converted draft's dynspec.json."""
    return {
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
