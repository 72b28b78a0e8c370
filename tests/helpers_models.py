"""Tiny random HF checkpoints for tests: a Llama target (written by transformers' own model,
so transformers is the oracle) and a public-format EAGLE-3 draft that fits it.

    target = make_tiny_target(tmp_path / "target")
    draft = make_tiny_draft(tmp_path / "draft", target)

Weights are random but not transformers' default init: matrices get a larger std and the
norm weights are perturbed away from 1, so a swapped or missing tensor changes the logits.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from dynspec.pairs.random_pair import capture_layers_for

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}


def _randomize(named: dict[str, torch.Tensor], g: torch.Generator, std: float) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in named.items():
        if t.dim() == 1:   # norm weights
            out[name] = 1.0 + 0.2 * torch.randn(t.shape, generator=g)
        else:
            out[name] = std * torch.randn(t.shape, generator=g)
    return out


def write_weights(folder: Path, sd: dict[str, torch.Tensor], *, fmt: str = "safetensors", shards: int = 1) -> None:
    """Write a state dict as model.safetensors, N shards + index, or pytorch_model.bin."""
    sd = {k: v.contiguous() for k, v in sd.items()}
    if fmt == "bin":
        torch.save(sd, folder / "pytorch_model.bin")
        return
    if shards == 1:
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(sd)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: sd[k] for k in part}, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def make_tiny_target(folder, *, vocab: int = 160, hidden: int = 64, layers: int = 4, heads: int = 4,
                     kv_heads: int = 2, tie: bool = False, rope_scaling: dict | None = None, seed: int = 0,
                     intermediate: int | None = None, head_dim: int | None = None, std: float = 0.08,
                     fmt: str = "safetensors", shards: int = 1, dtype: torch.dtype = torch.float32) -> Path:
    """Write a random transformers LlamaForCausalLM folder; returns its path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=head_dim or hidden // heads, rms_norm_eps=1e-5, rope_theta=10000.0,
                      rope_scaling=dict(rope_scaling) if rope_scaling else None, tie_word_embeddings=tie,
                      max_position_embeddings=256, torch_dtype=str(dtype).removeprefix("torch."),
                      bos_token_id=0, eos_token_id=1)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    sd = _randomize({k: v for k, v in model.state_dict().items()}, g, std)
    if tie:
        sd.pop("lm_head.weight", None)
    cfg.save_pretrained(folder)
    write_weights(folder, {k: v.to(dtype) for k, v in sd.items()}, fmt=fmt, shards=shards)
    return folder


def make_tiny_draft(folder, target_dir, *, draft_vocab: int | None = None, capture_layers=None, seed: int = 0,
                    hidden: int | None = None, intermediate: int | None = None, heads: int | None = None,
                    kv_heads: int | None = None, embed: bool = False, fmt: str = "safetensors",
                    capture_key: str | None = "eagle_config", std: float = 0.08,
                    dtype: torch.dtype = torch.float32) -> Path:
    """Write a random public-format EAGLE-3 draft folder that fits the target at `target_dir`.

    capture_key: "eagle_config" names the layers as `eagle_config.eagle_aux_hidden_state_layer_ids`
    (outputs of layers), "vllm" as top-level `eagle_aux_hidden_state_layer_ids` (inputs: id+1),
    None leaves them out (the loader then uses TRT-LLM's default).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tc = json.loads((Path(target_dir) / "config.json").read_text())
    vocab, th, L = tc["vocab_size"], tc["hidden_size"], tc["num_hidden_layers"]
    h = hidden or th
    nh = heads or tc["num_attention_heads"]
    kvh = kv_heads or tc["num_key_value_heads"]
    hd = h // nh
    inter = intermediate or 2 * h
    dv = draft_vocab or vocab // 2
    capture = tuple(capture_layers) if capture_layers is not None else capture_layers_for(L)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": h, "intermediate_size": inter, "num_attention_heads": nh, "num_key_value_heads": kvh,
        "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": dv, "rms_norm_eps": 1e-5,
        "rope_theta": tc.get("rope_theta", 10000.0), "rope_scaling": tc.get("rope_scaling"),
        "max_position_embeddings": tc.get("max_position_embeddings", 256), "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if h != th:
        cfg["target_hidden_size"] = th
    if capture_key == "eagle_config":
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(capture), "use_aux_hidden_state": True}
    elif capture_key == "vllm":
        cfg["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in capture]
    elif capture_key is not None:
        raise ValueError(f"capture_key {capture_key!r}")
    g = torch.Generator().manual_seed(1000 + seed)
    shapes = {
        "fc.weight": (h, len(capture) * th),
        "midlayer.hidden_norm.weight": (h,), "midlayer.input_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (nh * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kvh * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kvh * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, nh * hd),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (inter, h), "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,), "lm_head.weight": (dv, h),
    }
    if embed:
        shapes["embed_tokens.weight"] = (vocab, h)
    sd = _randomize({k: torch.empty(s) for k, s in shapes.items()}, g, std)
    sd = {k: v.to(dtype) for k, v in sd.items()}
    ids = torch.randperm(vocab, generator=g)[:dv].sort().values       # target ids in the draft vocab
    sd["d2t"] = ids - torch.arange(dv)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    sd["t2d"] = t2d
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_weights(folder, sd, fmt=fmt)
    return folder


def make_tiny_pair(root, *, draft_vocab: int, draft_seed: int, **target) -> tuple[str, str]:
    """make_tiny_target(root / "target", **target) and its draft at root / "draft" (draft_vocab,
    draft_seed) -> (target folder, draft folder), as the engine loaders take them."""
    t = make_tiny_target(Path(root) / "target", **target)
    d = make_tiny_draft(Path(root) / "draft", t, draft_vocab=draft_vocab, seed=draft_seed)
    return str(t), str(d)
