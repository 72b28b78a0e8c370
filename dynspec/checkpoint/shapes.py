"""The shape of a Llama-family decoder, read from its HF config.json, and the arithmetic that
every later stage uses: parameter count, weight bytes per tensor-parallel rank, KV bytes per
token per rank.

How TP splits a layer (Megatron-style, as TRT-LLM's PyTorch backend does):
    q_proj, k_proj, v_proj, gate_proj, up_proj   column-parallel: output rows / tp
    o_proj, down_proj                            row-parallel:    input cols / tp
    embed_tokens, lm_head                        vocab padded to a multiple of tp, then / tp
    norms                                        replicated on every rank
KV heads fewer than tp are replicated: 4 KV heads at tp 8 -> each rank holds 1 head, each
head lives on 2 ranks (replication factor 2).

Worked example, a 70B shape (80 layers, hidden 8192, 64 heads, 8 KV heads, head_dim 128,
intermediate 28672, vocab 128256, untied) at tp 8, bf16:
    per layer, per rank: q 8192*1024 + k,v 2*(8192*128) + o 1024*8192
                         + mlp 3*(8192*3584) + norms 2*8192       = 106,971,136 params
    embed + lm_head per rank: 2 * (128256/8)*8192                  = 262,668,288 params
    -> (80*106,971,136 + 262,668,288 + 8192) * 2 bytes            = 17,640,734,720 bytes
    KV per token per rank: 2 (K,V) * 80 layers * 1 head * 128 * 2  = 40,960 bytes
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from dynspec.errors import DynspecError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "float8_e4m3fn": 1}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise DynspecError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 4096

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> "ModelShape":
        try:
            return cls(**d)
        except TypeError as e:
            raise DynspecError(f"{where}: field 'shape': {e}") from e


def _int_field(cfg: Mapping[str, Any], name: str, where: str) -> int:
    v = cfg.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise DynspecError(f"{where}: field {name!r} is {v!r}; expected a positive integer")
    return v


def shape_from_hf_config(cfg: Mapping[str, Any], where: str = "config.json") -> ModelShape:
    """Read the decoder shape from a Llama-family HF config (Llama, Mistral-style layouts); field
    types were checked by dynspec.checkpoint.hf_config.read_config."""
    hidden = _int_field(cfg, "hidden_size", where)
    heads = _int_field(cfg, "num_attention_heads", where)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (hidden // heads)
    if cfg.get("head_dim") is None and hidden % heads:
        raise DynspecError(
            f"{where}: hidden_size={hidden} is not divisible by num_attention_heads={heads} and no head_dim is given"
        )
    kv_heads = _int_field({"num_key_value_heads": kv_heads}, "num_key_value_heads", where)
    if heads % kv_heads:
        raise DynspecError(f"{where}: field 'num_attention_heads' ({heads}) must be a multiple of "
                           f"'num_key_value_heads' ({kv_heads})")
    head_dim = _int_field({"head_dim": head_dim}, "head_dim", where)
    if head_dim % 2:
        raise DynspecError(f"{where}: field 'head_dim' ({head_dim}) must be even for RoPE")
    return ModelShape(
        layers=_int_field(cfg, "num_hidden_layers", where),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=_int_field(cfg, "intermediate_size", where),
        vocab=_int_field(cfg, "vocab_size", where),
        tied=cfg.get("tie_word_embeddings") is True,
        attention_bias=cfg.get("attention_bias") is True,
        mlp_bias=cfg.get("mlp_bias") is True,
        max_position_embeddings=_int_field({"max_position_embeddings": cfg.get("max_position_embeddings") or 4096},
                                           "max_position_embeddings", where),
    )


# ---- TP arithmetic (pure) -------------------------------------------------------------------
def padded_vocab(vocab: int, tp: int) -> int:
    """Vocabulary rows after padding to a multiple of tp: 32001 at tp 8 -> 32008."""
    return math.ceil(vocab / tp) * tp


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """8 KV heads at tp 8 -> 1; 4 at tp 8 -> 1 (replicated twice); 16 at tp 8 -> 2."""
    return max(1, kv_heads // tp)


def kv_replication(kv_heads: int, tp: int) -> int:
    """How many ranks hold each KV head: 4 KV heads at tp 8 -> 2; 8 or more -> 1."""
    return max(1, tp // kv_heads)


def layer_params(s: ModelShape) -> int:
    """Parameters of one decoder layer (unsharded)."""
    attn = s.hidden * s.q_size + 2 * s.hidden * s.kv_size + s.q_size * s.hidden
    if s.attention_bias:
        attn += s.q_size + 2 * s.kv_size + s.hidden
    mlp = 3 * s.hidden * s.intermediate
    if s.mlp_bias:
        mlp += 2 * s.intermediate + s.hidden
    return attn + mlp + 2 * s.hidden  # + input/post-attention norms


def param_count(s: ModelShape) -> int:
    """Unique parameters: a tied lm_head shares the embedding and is counted once."""
    embed = s.vocab * s.hidden
    return s.layers * layer_params(s) + embed * (1 if s.tied else 2) + s.hidden


def linear_params_per_rank(s: ModelShape, tp: int) -> int:
    """Matrix weights of one layer on one rank (the part FP8 quantisation shrinks)."""
    q = s.q_size // tp
    kv = kv_heads_per_rank(s.kv_heads, tp) * s.head_dim
    return s.hidden * q + 2 * s.hidden * kv + q * s.hidden + 3 * s.hidden * (s.intermediate // tp)


def small_params_per_rank(s: ModelShape, tp: int) -> int:
    """Norms and biases of one layer on one rank (row-parallel biases are replicated)."""
    n = 2 * s.hidden
    if s.attention_bias:
        n += (s.q_size // tp) + 2 * kv_heads_per_rank(s.kv_heads, tp) * s.head_dim + s.hidden
    if s.mlp_bias:
        n += 2 * (s.intermediate // tp) + s.hidden
    return n


def layer_params_per_rank(s: ModelShape, tp: int) -> int:
    return linear_params_per_rank(s, tp) + small_params_per_rank(s, tp)


def weight_bytes_per_rank(s: ModelShape, tp: int, dtype: str, linear_dtype: str | None = None) -> int:
    """Bytes of weights each rank holds. A tied lm_head is still materialised per rank.
    linear_dtype (e.g. "fp8") applies to the layers' matrices; embeddings, lm_head and norms
    stay in dtype."""
    vocab_rows = padded_vocab(s.vocab, tp) // tp
    b, lb = dtype_bytes(dtype), dtype_bytes(linear_dtype or dtype)
    linear = s.layers * linear_params_per_rank(s, tp)
    rest = s.layers * small_params_per_rank(s, tp) + 2 * vocab_rows * s.hidden + s.hidden
    return linear * lb + rest * b


def kv_bytes_per_token_per_rank(s: ModelShape, tp: int, kv_dtype: str) -> int:
    """K and V of every layer for one token on one rank."""
    return 2 * s.layers * kv_heads_per_rank(s.kv_heads, tp) * s.head_dim * dtype_bytes(kv_dtype)


def eagle3_weight_bytes_per_rank(d: ModelShape, draft_vocab: int, target_hidden: int, n_capture: int,
                                 own_embed: bool, tp: int, dtype: str) -> int:
    """Bytes of an EAGLE-3 draft on one rank, laid out as TRT-LLM's Eagle3 draft model:
        midlayer q/k/v read [embed; fused hidden] (2 * hidden inputs), sharded like any layer
        fc [hidden, n_capture * target_hidden]   replicated (no TP mode)
        lm_head over the draft vocabulary, padded and sharded; embed_tokens only if the
        draft has its own (else it shares the target's); d2t int32 [draft_vocab] replicated.
    """
    q = d.q_size // tp
    kv = kv_heads_per_rank(d.kv_heads, tp) * d.head_dim
    attn = 2 * d.hidden * (q + 2 * kv) + q * d.hidden
    mlp = 3 * d.hidden * (d.intermediate // tp)
    norms = 4 * d.hidden                      # input_layernorm, hidden_norm, post_attention, final norm
    fc = n_capture * target_hidden * d.hidden
    head = padded_vocab(draft_vocab, tp) // tp * d.hidden
    embed = padded_vocab(d.vocab, tp) // tp * d.hidden if own_embed else 0
    d2t = draft_vocab * 4 if draft_vocab != d.vocab else 0
    return (attn + mlp + norms + fc + head + embed) * dtype_bytes(dtype) + d2t
