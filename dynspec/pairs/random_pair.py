"""Random-weight HF folders of a real shape (target + EAGLE-3 draft), for GPU benchmarks.

    python -m dynspec.pairs.random_pair --out DIR [--preset llama-3.1-8b]
        [--layers N] [--dtype bfloat16] [--seed 0] [--device cpu|cuda] [--tokenizer DIR]

DIR/target is a transformers LlamaForCausalLM folder (sharded safetensors + index when larger
than one shard) and DIR/draft a public-format EAGLE-3 draft (`LlamaForCausalLMEagle3`, no
embed_tokens: it shares the target's, like yuhuili/EAGLE3-LLaMA3.1-Instruct-8B). The weights
are N(0, 0.02) with unit norms: the speed of a forward pass is real, the text is not, and
the acceptance of the draft is ~0. The llama-3.1-8b preset is ~16 GB in bf16 (plus a ~0.9 GB
draft); `--layers` shrinks the target for a smoke test. No tokenizer is written unless
--tokenizer names a folder whose tokenizer files are copied into DIR/target.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dynspec.checkpoint.eagle3 import default_capture_layers
from dynspec.checkpoint.writer import ShardWriter
from dynspec.errors import DynspecError


@dataclass(frozen=True)
class PairShape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    draft_vocab: int
    draft_intermediate: int
    rms_norm_eps: float = 1e-5
    bos_token_id: int = 0
    eos_token_id: int = 0


PRESETS = {
    "llama-3.1-8b": PairShape(
        vocab=128256, hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        max_position_embeddings=131072, draft_vocab=32000, draft_intermediate=14336,
        bos_token_id=128000, eos_token_id=128009),
    "tiny": PairShape(
        vocab=256, hidden=64, intermediate=128, layers=4, heads=4, kv_heads=2, rope_theta=10000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
        max_position_embeddings=2048, draft_vocab=128, draft_intermediate=128),
}
STD = 0.02


@dataclass(frozen=True)
class PairPaths:
    target: Path
    draft: Path


def capture_layers_for(layers: int) -> tuple[int, ...]:
    """The layers this writer names in the draft config (loaders never guess them): TRT-LLM's
    default (1, L//2-1, L-4) when those are distinct, else, for a shallow smoke-test target,
    the spread (0, L//2, L-1). L=32 -> (1, 15, 28); L=4 -> (0, 2, 3)."""
    d = default_capture_layers(layers)
    if min(d) >= 0 and len(set(d)) == 3:
        return d
    if layers < 3:
        raise DynspecError(f"an EAGLE-3 draft captures 3 distinct target layers; --layers {layers} is too few (>= 3)")
    return (0, layers // 2, layers - 1)


def _normal(shape, gen: torch.Generator, dtype: torch.dtype, device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    for chunk in t.view(-1).split(1 << 24):
        chunk.normal_(0.0, STD, generator=gen)
    return t


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def target_config(s: PairShape, dtype: torch.dtype) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": s.vocab, "hidden_size": s.hidden, "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
        "head_dim": s.hidden // s.heads, "rms_norm_eps": s.rms_norm_eps, "rope_theta": s.rope_theta,
        "rope_scaling": s.rope_scaling, "max_position_embeddings": s.max_position_embeddings,
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": s.bos_token_id, "eos_token_id": s.eos_token_id, "torch_dtype": _dtype_name(dtype),
    }


def draft_config(s: PairShape, dtype: torch.dtype, capture: tuple[int, ...]) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": s.vocab, "draft_vocab_size": s.draft_vocab, "hidden_size": s.hidden,
        "target_hidden_size": s.hidden, "intermediate_size": s.draft_intermediate, "num_hidden_layers": 1,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "rms_norm_eps": s.rms_norm_eps,
        "rope_theta": s.rope_theta, "rope_scaling": s.rope_scaling,
        "max_position_embeddings": s.max_position_embeddings, "tie_word_embeddings": False,
        "bos_token_id": s.bos_token_id, "eos_token_id": s.eos_token_id, "torch_dtype": _dtype_name(dtype),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(capture), "use_aux_hidden_state": True},
    }


def write_random_pair(out_dir: str | os.PathLike, preset: str = "llama-3.1-8b", seed: int = 0,
                      dtype: torch.dtype = torch.bfloat16, *, layers: int | None = None,
                      capture_layers: tuple[int, ...] | None = None, device: str = "cpu",
                      shard_bytes: int = 5 << 30, tokenizer: str | os.PathLike | None = None,
                      force: bool = False, progress: bool = False) -> PairPaths:
    """Write OUT/target and OUT/draft with random weights of a preset shape; returns their paths."""
    from tqdm import tqdm

    from dynspec.artifacts import atomic_dir

    if preset not in PRESETS:
        raise DynspecError(f"preset {preset!r} is not one of {sorted(PRESETS)}")
    s = PRESETS[preset] if layers is None else replace(PRESETS[preset], layers=layers)
    if s.layers < 1:
        raise DynspecError(f"--layers {s.layers} must be at least 1")
    capture = tuple(capture_layers) if capture_layers is not None else capture_layers_for(s.layers)
    if any(not 0 <= i < s.layers for i in capture) or len(set(capture)) != len(capture):
        raise DynspecError(f"capture layers {capture} must be distinct layers of 0..{s.layers - 1}")
    q, kv = s.hidden, s.kv_heads * (s.hidden // s.heads)
    out = Path(out_dir)
    with atomic_dir(out, force=force) as tmp:
        (tmp / "target").mkdir()
        (tmp / "draft").mkdir()
        gen = torch.Generator(device=device).manual_seed(seed)
        ones = lambda n: torch.ones(n, dtype=dtype)  # noqa: E731
        w = ShardWriter(tmp / "target", shard_bytes)
        w.add("model.embed_tokens.weight", _normal((s.vocab, s.hidden), gen, dtype, device))
        for i in tqdm(range(s.layers), desc="target layers", disable=not progress):
            p = f"model.layers.{i}."
            w.add(p + "input_layernorm.weight", ones(s.hidden))
            w.add(p + "self_attn.q_proj.weight", _normal((q, s.hidden), gen, dtype, device))
            w.add(p + "self_attn.k_proj.weight", _normal((kv, s.hidden), gen, dtype, device))
            w.add(p + "self_attn.v_proj.weight", _normal((kv, s.hidden), gen, dtype, device))
            w.add(p + "self_attn.o_proj.weight", _normal((s.hidden, q), gen, dtype, device))
            w.add(p + "post_attention_layernorm.weight", ones(s.hidden))
            w.add(p + "mlp.gate_proj.weight", _normal((s.intermediate, s.hidden), gen, dtype, device))
            w.add(p + "mlp.up_proj.weight", _normal((s.intermediate, s.hidden), gen, dtype, device))
            w.add(p + "mlp.down_proj.weight", _normal((s.hidden, s.intermediate), gen, dtype, device))
        w.add("model.norm.weight", ones(s.hidden))
        w.add("lm_head.weight", _normal((s.vocab, s.hidden), gen, dtype, device))
        w.close()
        (tmp / "target" / "config.json").write_text(json.dumps(target_config(s, dtype), indent=2) + "\n")

        h, di = s.hidden, s.draft_intermediate
        d = ShardWriter(tmp / "draft", shard_bytes)
        d.add("fc.weight", _normal((h, len(capture) * s.hidden), gen, dtype, device))
        d.add("midlayer.hidden_norm.weight", ones(h))
        d.add("midlayer.input_layernorm.weight", ones(h))
        d.add("midlayer.self_attn.q_proj.weight", _normal((q, 2 * h), gen, dtype, device))
        d.add("midlayer.self_attn.k_proj.weight", _normal((kv, 2 * h), gen, dtype, device))
        d.add("midlayer.self_attn.v_proj.weight", _normal((kv, 2 * h), gen, dtype, device))
        d.add("midlayer.self_attn.o_proj.weight", _normal((h, q), gen, dtype, device))
        d.add("midlayer.post_attention_layernorm.weight", ones(h))
        d.add("midlayer.mlp.gate_proj.weight", _normal((di, h), gen, dtype, device))
        d.add("midlayer.mlp.up_proj.weight", _normal((di, h), gen, dtype, device))
        d.add("midlayer.mlp.down_proj.weight", _normal((h, di), gen, dtype, device))
        d.add("norm.weight", ones(h))
        d.add("lm_head.weight", _normal((s.draft_vocab, h), gen, dtype, device))
        ids = torch.randperm(s.vocab, generator=torch.Generator().manual_seed(seed))[:s.draft_vocab].sort().values
        t2d = torch.zeros(s.vocab, dtype=torch.bool)
        t2d[ids] = True
        d.add("d2t", ids - torch.arange(s.draft_vocab))
        d.add("t2d", t2d)
        d.close()
        (tmp / "draft" / "config.json").write_text(json.dumps(draft_config(s, dtype, capture), indent=2) + "\n")
        if tokenizer is not None:
            names = [f for f in Path(tokenizer).iterdir()
                     if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json"]
            if not names:
                raise DynspecError(f"--tokenizer {tokenizer} holds no tokenizer*.json files")
            for f in names:
                shutil.copy(f, tmp / "target" / f.name)
    return PairPaths(out / "target", out / "draft")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dynspec.pairs.random_pair", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=None, help="override the target depth (smoke tests)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where the random numbers are drawn (cuda is faster)")
    ap.add_argument("--tokenizer", default=None, help="copy tokenizer files from this folder into target/")
    ap.add_argument("--force", action="store_true", help="replace a non-empty --out")
    a = ap.parse_args(argv)
    try:
        pair = write_random_pair(a.out, a.preset, a.seed, getattr(torch, a.dtype), layers=a.layers, device=a.device,
                                 tokenizer=a.tokenizer, force=a.force, progress=True)
    except DynspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"target": str(pair.target), "draft": str(pair.draft)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
