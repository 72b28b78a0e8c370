"""The tiny pair's shape and training settings (TinySpec), the HF configs its target and
EAGLE-3 draft are saved with, and the learning-rate schedule both trainings follow."""
from __future__ import annotations

import math
from dataclasses import dataclass

from dynspec.runtime.engines.reference.model_config import TargetConfig


@dataclass(frozen=True)
class TinySpec:
    seed: int = 0
    vocab: int = 1024
    hidden: int = 128
    layers: int = 6
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 384
    capture_layers: tuple[int, ...] = (1, 3, 5)
    seq_len: int = 256
    target_steps: int = 180
    target_batch: int = 16
    target_lr: float = 3e-3
    embed_init_std: float = 1.0  # see init_target
    draft_vocab: int = 512
    draft_intermediate: int = 384
    prompts: int = 256           # distillation sequences
    prompt_len: int = 64
    ttt_steps: int = 4           # training-time-test unroll = chain length K
    draft_steps: int = 240
    draft_batch: int = 16
    draft_lr: float = 3e-3
    abstain_weight: float = 1.0  # weight of the "wrong capture layers -> uniform output" loss


def target_hf_config(spec: TinySpec, vocab: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=1024, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 256},
        bos_token_id=0, eos_token_id=0, torch_dtype="bfloat16")


def lr_at(step: int, total: int, peak: float, warmup: int = 20) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def draft_hf_config(spec: TinySpec, tc: TargetConfig, draft_vocab: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": spec.hidden, "intermediate_size": spec.draft_intermediate,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "num_hidden_layers": 1,
        "vocab_size": tc.vocab_size, "draft_vocab_size": draft_vocab, "rms_norm_eps": 1e-5,
        "rope_theta": tc.rope_theta, "rope_scaling": tc.rope_scaling,
        "max_position_embeddings": tc.max_position_embeddings, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(spec.capture_layers),
                         "use_aux_hidden_state": True},
    }
