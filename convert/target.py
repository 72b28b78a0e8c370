"""`dynspec convert target`: an HF Llama-family folder -> a checked, normalized HF checkpoint
(config.json, safetensors shards + index, tokenizer files) and its dynspec.json manifest.

Every tensor the config implies must be present with the implied shape:
    num_hidden_layers=4 -> model.layers.{0..3}.self_attn.q_proj.weight [heads*head_dim, hidden], ...
A tied model (tie_word_embeddings) writes no lm_head.weight; TRT-LLM ties it again on load.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from dynspec.artifacts import atomic_dir, check_apart, write_json
from dynspec.checkpoint.hf_config import read_config
from dynspec.checkpoint.shapes import (ModelShape, kv_bytes_per_token_per_rank, param_count,
                                       shape_from_hf_config, weight_bytes_per_rank)
from dynspec.checkpoint.tensor_reader import iter_tensors
from dynspec.checkpoint.tp_checks import require_tp
from dynspec.checkpoint.weight_index import weight_source
from dynspec.checkpoint.writer import DEFAULT_SHARD_BYTES, ShardWriter
from dynspec.convert.hf import check_generation_config, copy_tokenizer_files
from dynspec.convert.manifest import CHECKPOINT_FORMAT, MANIFEST
from dynspec.errors import DynspecError

MODEL_TYPES = ("llama", "mistral")
DTYPES = ("bfloat16", "float16", "float32")
OUTPUT_MARK = (MANIFEST, {"format": CHECKPOINT_FORMAT, "kind": "target"})   # what --force may replace
QUANTS = ("fp8",)
DROPPED_SUFFIXES = ("rotary_emb.inv_freq",)   # buffers some old exports saved
LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class TargetOptions:
    tp: int = 8
    dtype: str = "bfloat16"
    quant: str | None = None
    max_shard_bytes: int = DEFAULT_SHARD_BYTES
    progress: bool = True


def expected_tensors(s: ModelShape) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a Llama-layout checkpoint of shape s holds."""
    h, q, kv, i = s.hidden, s.q_size, s.kv_size, s.intermediate
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab, h), "model.norm.weight": (h,)}
    if not s.tied:
        out["lm_head.weight"] = (s.vocab, h)
    for n in range(s.layers):
        p = f"model.layers.{n}."
        out.update({
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
        if s.attention_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,), p + "self_attn.o_proj.bias": (h,)})
        if s.mlp_bias:
            out.update({p + "mlp.gate_proj.bias": (i,), p + "mlp.up_proj.bias": (i,), p + "mlp.down_proj.bias": (h,)})
    return out


def _check_layers_present(shape: ModelShape, names, hf_dir: Path) -> None:
    """The weights must hold every layer config.json declares; checked on the names alone, before
    expected_tensors builds ~9 names a layer (num_hidden_layers=10**7 on 2 layers of weights
    -> missing tensor 'model.layers.2.self_attn.q_proj.weight', at once)."""
    present = {int(m.group(1)) for n in names if (m := LAYER_NAME.match(n))}
    if shape.layers <= len(present) and shape.layers - 1 in present:
        return
    first = next(i for i in range(len(present) + 1) if i not in present)
    raise DynspecError(f"{hf_dir}: missing tensor 'model.layers.{first}.self_attn.q_proj.weight' (and more); "
                       f"config.json declares {shape.layers} layers, the weights hold {len(present)}")


def _check_model_type(cfg: dict, where: str) -> str:
    mt = cfg.get("model_type")
    if mt not in MODEL_TYPES:
        raise DynspecError(f"{where}: field 'model_type' is {mt!r}; convert target supports {list(MODEL_TYPES)}")
    archs = cfg.get("architectures") or []
    return archs[0] if archs else ("MistralForCausalLM" if mt == "mistral" else "LlamaForCausalLM")


def _normalized_config(cfg: dict, dtype: str) -> dict:
    out = dict(cfg)
    out["dtype"] = dtype
    out["torch_dtype"] = dtype
    return out


def check_tensor(name: str, tensor, want: tuple[int, ...] | None, file: Path) -> None:
    if want is None:
        raise DynspecError(f"unexpected tensor {name!r} in {file.name}: not part of the layout config.json implies")
    if tuple(tensor.shape) != want:
        raise DynspecError(
            f"shape mismatch: tensor {name!r} in {file.name} is {list(tensor.shape)}; config.json implies {list(want)}"
        )
    if not tensor.is_floating_point():
        raise DynspecError(f"dtype mismatch: tensor {name!r} in {file.name} is {tensor.dtype}; expected floating point")


def convert_target(hf_dir: str | os.PathLike, out: str | os.PathLike, opts: TargetOptions = TargetOptions(),
                   force: bool = False) -> dict:
    """Check, cast and rewrite the checkpoint into `out` (all or nothing). Returns the manifest."""
    import torch
    from tqdm import tqdm

    hf_dir = Path(hf_dir)
    check_apart(out, {"--hf": hf_dir})         # --force must never replace the source weights
    where = str(hf_dir / "config.json")
    cfg = read_config(hf_dir, "--hf")
    arch = _check_model_type(cfg, where)
    shape = shape_from_hf_config(cfg, where)
    report = require_tp(shape, opts.tp, where)
    check_generation_config(hf_dir, shape.vocab)
    if opts.dtype not in DTYPES:
        raise DynspecError(f"--dtype {opts.dtype!r} is not one of {list(DTYPES)}")
    if opts.quant is not None and opts.quant not in QUANTS:
        raise DynspecError(f"--quant {opts.quant!r} is not one of {list(QUANTS)}")
    if opts.quant == "fp8":
        from dynspec.convert.quant import require_modelopt

        require_modelopt()  # fail before any work
    src = weight_source(hf_dir, "--hf")
    _check_layers_present(shape, src.key_to_file, hf_dir)
    expected = expected_tensors(shape)
    missing = sorted(set(expected) - set(src.key_to_file))
    if missing:
        raise DynspecError(
            f"{hf_dir}: missing tensor {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + f"; config.json declares {shape.layers} layers" + (", untied lm_head" if not shape.tied else "")
        )
    torch_dtype = getattr(torch, opts.dtype)
    n_params = 0
    with atomic_dir(out, force=force, mark=OUTPUT_MARK, one_line=True) as tmp:
        writer = ShardWriter(tmp, opts.max_shard_bytes)
        # disable=None: no bar when stderr is not a terminal (logs, CI, pipes)
        with tqdm(total=len(src), unit="tensor", desc="convert target", disable=None if opts.progress else True) as bar:
            for name, t in iter_tensors(src):
                bar.update(1)
                if name.endswith(DROPPED_SUFFIXES) or (shape.tied and name == "lm_head.weight"):
                    continue
                check_tensor(name, t, expected.get(name), src.key_to_file[name])
                writer.add(name, t.to(torch_dtype))
                n_params += t.numel()
        shards = writer.close()
        write_json(tmp / "config.json", _normalized_config(cfg, opts.dtype))
        tokenizer = copy_tokenizer_files(hf_dir, tmp)
        if opts.quant == "fp8":
            shards = _quantize_in_place(tmp)
        manifest = {
            "format": CHECKPOINT_FORMAT,
            "kind": "target",
            "architecture": arch,
            "model_type": cfg["model_type"],
            "source": str(hf_dir.resolve()),
            "dtype": opts.dtype,
            "quant": opts.quant,
            "tp": opts.tp,
            "shape": shape.to_json(),
            "parameter_count": n_params,
            "weight_bytes_per_rank": weight_bytes_per_rank(
                shape, opts.tp, opts.dtype, "fp8" if opts.quant == "fp8" else None),
            "kv_bytes_per_token_per_rank": kv_bytes_per_token_per_rank(shape, opts.tp, opts.dtype),
            "kv_replication": report.kv_replication,
            "vocab_padded": report.vocab_padded,
            "checks": report.passed(),
            "files": {"weights": shards, "tokenizer": tokenizer},
        }
        if n_params != param_count(shape):
            raise DynspecError(f"internal: wrote {n_params} parameters, the shape implies {param_count(shape)}")
        write_json(tmp / MANIFEST, manifest)
        src.check_unchanged()                   # before the rename: the output is what the source held
    return manifest


def _quantize_in_place(folder: Path) -> list[str]:
    """Replace folder's weights and config with ModelOpt's FP8 export of them."""
    from dynspec.convert.quant import quantize_fp8

    export = folder / ".fp8-export"
    quantize_fp8(folder, export)
    for p in folder.glob("*.safetensors"):
        p.unlink()
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    shards = []
    for p in sorted(export.iterdir()):
        if p.suffix in (".safetensors", ".json"):
            shutil.move(str(p), folder / p.name)
            if p.suffix == ".safetensors":
                shards.append(p.name)
    shutil.rmtree(export)
    return shards
