"""EAGLE-3 draft model for the reference engine (the public `LlamaForCausalLMEagle3` format).

One decoder layer whose attention reads [input_layernorm(embed(token)); hidden_norm(hidden)]
(width 2h), a final norm and an lm_head over a smaller draft vocabulary whose ids map to
target ids through `d2t` (target_id = draft_id + d2t[draft_id]).

    fused = cat(target layer outputs at capture_layers)       # [B, T, n*h_t]
    hidden = fc(fused)                  (first chain step)    # [B, T, h]
           | previous draft output      (later chain steps)   # [B, T, h]
    residual = hidden
    x = cat(input_layernorm(embed(token)), hidden_norm(hidden))  # [B, T, 2h]
    x = residual + o_proj(attn(x))
    out = x + mlp(post_attention_layernorm(x))                # fed back as the next `hidden`
    logits = lm_head(norm(out))                               # [B, T, draft_vocab]

Index convention (the same as vLLM and TRT-LLM): the draft row at position p pairs the
target's capture at position p with the token at position p+1, and predicts the token at
position p+2. Worked example, prompt t0..t4 (n=5), K=3:
  target prefill  tokens t0..t4 @ 0..4 -> captures H0..H4 and the greedy next token t5
  draft prefill   rows @ 0..4 take (t1,H0)..(t5,H4); row @4 predicts d1, the guess for t6
  chain           row @5 takes (d1, out of row @4) -> d2 (guess for t7);
                  row @6 takes (d2, out of row @5) -> d3 (guess for t8)
  verify          target tokens t5,d1,d2,d3 @ 5..8 -> greedy g0..g3 and captures H5..H8;
                  accept a = number of leading d_i == g_(i-1); emit d1..da and g_a
  next draft      rows @ 5..5+a take (d1,H5)..(g_a,H5+a): the tokens at positions 6..6+a
                  with the captures one position earlier. They overwrite the chain's draft
                  cache entries at the same positions, so nothing needs clearing.

Capture layers are in the "outputs of decoder layer i" convention (TRT-LLM's
`eagle3_layers_to_capture`). Draft configs name them in one of two public conventions:
- `eagle_config.eagle_aux_hidden_state_layer_ids` (SpecForge, SGLang):
  outputs of layer i, taken as is;
- top-level `eagle_aux_hidden_state_layer_ids` (vLLM/speculators): id i is the INPUT of
  layer i, i.e. the output of layer i-1, so we subtract one (vLLM's default (2, L//2, L-3)
  is TRT-LLM's default (1, L//2-1, L-4)).
With neither, the TRT-LLM default (1, L//2-1, L-4) is used.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dynspec.checkpoint.eagle3 import resolve_capture_layers
from dynspec.errors import DynspecError

from dynspec.runtime.engines.reference.attention import RaggedBatch, SdpaAttention
from dynspec.runtime.engines.reference.layer_ops import apply_rope, Kernels
from dynspec.runtime.engines.reference.model import _empty, Collectives, row_batch, setup_paged_cache, setup_row_cache
from dynspec.runtime.engines.reference.model_config import attention_dims, check_silu, hf_field, parse_rope, TargetConfig


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    capture_layers: tuple[int, ...]
    norm_before_residual: bool = False   # speculators/vLLM option: residual = hidden_norm(hidden)

    @property
    def fused_width(self) -> int:
        return len(self.capture_layers) * self.target_hidden_size

    @classmethod
    def from_hf(cls, cfg: dict, where: str, target: TargetConfig, *,
                capture_layers: tuple[int, ...] | None = None) -> "Eagle3Config":
        """From an EAGLE-3 draft config.json dict, validated against the target's config."""
        if not isinstance(cfg, dict):
            raise DynspecError(f"{where}: expected a JSON object")
        if isinstance(cfg.get("transformer_layer_config"), dict):   # speculators format
            cfg = {**cfg, **cfg["transformer_layer_config"]}
        archs = cfg.get("architectures")
        if isinstance(archs, list) and archs and not any("eagle" in str(a).lower() for a in archs):
            raise DynspecError(f"{where}: field 'architectures' is {archs}; expected an EAGLE-3 draft "
                               "such as 'LlamaForCausalLMEagle3'")
        check_silu(cfg, where)
        layers = hf_field(cfg, "num_hidden_layers", where, int, 1)
        if layers != 1:
            raise DynspecError(f"{where}: field 'num_hidden_layers' is {layers}; only one-layer EAGLE-3 drafts "
                               "are supported")
        hidden, heads, kv_heads, head_dim = attention_dims(cfg, where)
        target_hidden = hf_field(cfg, "target_hidden_size", where, int, hidden)
        if target_hidden != target.hidden_size:
            field = "target_hidden_size" if "target_hidden_size" in cfg else "hidden_size"
            raise DynspecError(f"{where}: draft/target hidden-size mismatch: field '{field}' is {target_hidden} "
                               f"but the target's hidden_size is {target.hidden_size}")
        vocab = hf_field(cfg, "vocab_size", where, int, target.vocab_size)
        if vocab != target.vocab_size:
            raise DynspecError(f"{where}: field 'vocab_size' is {vocab} but the target's vocab_size is "
                               f"{target.vocab_size} (vocab mismatch)")
        draft_vocab = hf_field(cfg, "draft_vocab_size", where, int, vocab)
        if draft_vocab > vocab:
            raise DynspecError(f"{where}: field 'draft_vocab_size' ({draft_vocab}) exceeds 'vocab_size' ({vocab})")
        theta, scaling = parse_rope(cfg, where)
        capture = resolve_capture_layers(cfg, where, target.num_layers, capture_layers).layers
        if len(capture) * target_hidden == hidden:
            raise DynspecError(f"{where}: fused width {len(capture)}x{target_hidden} equals hidden_size {hidden}; "
                               "the draft could not tell a fused capture from its own hidden state")
        return cls(
            hidden_size=hidden, target_hidden_size=target_hidden, num_heads=heads, num_kv_heads=kv_heads,
            head_dim=head_dim, intermediate_size=hf_field(cfg, "intermediate_size", where),
            draft_vocab_size=draft_vocab, vocab_size=vocab,
            rms_norm_eps=hf_field(cfg, "rms_norm_eps", where, float, 1e-6),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=hf_field(cfg, "max_position_embeddings", where, int, 2048),
            capture_layers=capture,
            norm_before_residual=hf_field(cfg, "norm_before_residual", where, bool, False),
        )


class Eagle3Draft(nn.Module):
    """EAGLE-3 draft. `embed` shares the target's embedding when the checkpoint has none."""

    def __init__(self, config: Eagle3Config, *, embed: nn.Embedding | None = None, device=None, dtype=None):
        super().__init__()
        c = self.config = config
        self.capture_layers = c.capture_layers
        h = c.hidden_size
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.embed_tokens = embed if embed is not None else nn.Embedding(
            c.vocab_size, h, _weight=torch.empty(c.vocab_size, h, device=device, dtype=dtype), _freeze=True)
        self.fc = _empty(h, c.fused_width, device=device, dtype=dtype)
        self.hidden_norm = _empty(h, device=device, dtype=dtype)
        self.input_layernorm = _empty(h, device=device, dtype=dtype)
        self.wqkv = _empty(self.q_size + 2 * self.kv_size, 2 * h, device=device, dtype=dtype)
        self.wo = _empty(h, self.q_size, device=device, dtype=dtype)
        self.post_attention_layernorm = _empty(h, device=device, dtype=dtype)
        self.w13 = _empty(2 * c.intermediate_size, h, device=device, dtype=dtype)   # [gate; up]
        self.w2 = _empty(h, c.intermediate_size, device=device, dtype=dtype)
        self.norm = _empty(h, device=device, dtype=dtype)
        self.lm_head = _empty(c.draft_vocab_size, h, device=device, dtype=dtype)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long, device=device))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool, device=device))
        self.attention = SdpaAttention()
        self.collectives = Collectives()
        self.kernels = Kernels()                  # ReferenceEngine gives it the target's (compiled on CUDA)
        self.max_batch = self.max_seq_len = self.block_size = 0
        self.row_tables: Tensor | None = None
        self.register_buffer("k_cache", None, persistent=False)   # [kvh, blocks*block_size, hd]
        self.register_buffer("v_cache", None, persistent=False)
        self.register_buffer("rope_cos", None, persistent=False)
        self.register_buffer("rope_sin", None, persistent=False)

    def setup_cache(self, max_batch: int, max_seq_len: int) -> None:
        """Rows 0..max_batch-1 of max_seq_len positions each, for the row-major `forward`."""
        setup_row_cache(self, self.config, self.fc, None, max_batch, max_seq_len)

    def setup_pool(self, num_blocks: int, block_size: int, max_seq_len: int) -> None:
        """A pool laid out like the target's: the engine uses one block table for both."""
        setup_paged_cache(self, self.config, self.fc, None, num_blocks, block_size, max_seq_len)

    # The pieces below are also used by dynspec/pairs/train_tiny_draft.py's training-time-test loop.
    def fuse(self, hidden: Tensor) -> Tensor:
        """[B, T, n*h_t] fused target capture -> fc -> [B, T, h]; [B, T, h] passes through."""
        width = hidden.shape[-1]
        if width == self.config.fused_width:
            return F.linear(hidden, self.fc)
        if width != self.config.hidden_size:
            raise DynspecError(
                f"draft hidden input has width {width}; expected {self.config.fused_width} (fused capture of "
                f"layers {self.capture_layers} x target hidden {self.config.target_hidden_size}) or "
                f"{self.config.hidden_size} (the draft's own output)")
        return hidden

    def layer_input(self, tokens: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """(attention input [B, T, 2h], residual [B, T, h]) from tokens and an h-wide hidden."""
        eps, f = self.config.rms_norm_eps, self.kernels
        h = f.rms_norm(hidden, self.hidden_norm, eps)
        e = f.rms_norm(self.embed_tokens(tokens), self.input_layernorm, eps)
        return torch.cat((e, h), dim=-1), (h if self.config.norm_before_residual else hidden)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, 2h] -> q [B, nh, T, hd], k, v [B, kvh, T, hd] (RoPE applied)."""
        hd = self.config.head_dim
        nh, kvh = self.q_size // hd, self.kv_size // hd                      # this instance's heads
        B, T, _ = x.shape
        q, k, v = F.linear(x, self.wqkv).split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = apply_rope(q.view(B, T, nh, hd).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(B, T, kvh, hd).transpose(1, 2), cos, sin)
        return q, k, v.view(B, T, kvh, hd).transpose(1, 2)

    def finish(self, attn: Tensor, residual: Tensor, greedy: bool = False) -> tuple[Tensor, Tensor]:
        """attn [B, T, nh*hd] -> (draft logits [B, T, dv], output hidden [B, T, h] pre-norm);
        greedy: the draft-vocab argmax ids [B, T] instead of the logits."""
        eps, f, comm = self.config.rms_norm_eps, self.kernels, self.collectives
        x, h = f.add_rms_norm(residual, comm.all_reduce(F.linear(attn, self.wo)), self.post_attention_layernorm, eps)
        out, h = f.add_rms_norm(x, comm.all_reduce(F.linear(f.silu_mul(F.linear(h, self.w13)), self.w2)), self.norm, eps)
        logits = F.linear(h, self.lm_head)                                    # [B, T, dv | dv_pad/N]
        if greedy:
            return self.collectives.argmax(logits), out
        return self.collectives.gather_vocab(logits), out

    def run(self, tokens: Tensor, hidden: Tensor, batch: RaggedBatch, attention=None,
            greedy: bool = False, rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """tokens [N] (target ids), hidden [N, n*h_t | h] packed
        -> (draft-vocab logits [N, dv], output hidden [N, h] pre-norm, to feed back);
        greedy: the draft-vocab argmax ids [N] instead of the logits. rows [M]: every token's
        K/V is written, but only these tokens' outputs are made ([M, dv], [M, h]): a prompt
        chunk's draft pass needs its last token's alone."""
        if self.k_cache is None:
            raise RuntimeError("Eagle3Draft.setup_cache or setup_pool must be called before forward")
        N = tokens.shape[0]
        if hidden.shape[0] != N:
            raise DynspecError(f"draft hidden input has shape {tuple(hidden.shape)}; tokens are {(N,)}")
        x, residual = self.layer_input(tokens, self.fuse(hidden))            # [N, 2h], [N, h]
        cos = self.rope_cos[batch.positions].unsqueeze(1)                    # [N, 1, hd/2]
        sin = self.rope_sin[batch.positions].unsqueeze(1)
        hd = self.config.head_dim                                            # q [N, nh, hd]; K/V written
        q = self.kernels.rope_write(F.linear(x, self.wqkv), cos, sin, self.k_cache, self.v_cache, batch.write_index,
                                    self.q_size // hd, self.kv_size // hd)
        attn = (attention or self.attention)(q, self.k_cache, self.v_cache, batch)      # [N, nh*hd]
        if rows is not None:
            attn, residual = attn[rows], residual[rows]
        logits, out = self.finish(attn, residual, greedy)
        if greedy:
            return logits, out
        if logits.device.type == "cpu":
            logits = logits.float()
        return logits, out

    def forward(self, tokens: Tensor, hidden: Tensor, positions: Tensor, *, row0: int = 0,
                kv_len: int | None = None) -> tuple[Tensor, Tensor]:
        """Row-major use on a `setup_cache` pool: tokens [B, T], hidden [B, T, n*h_t | h],
        positions [B, T] in rows row0.. -> (logits [B, T, dv], output hidden [B, T, h])."""
        B, T = tokens.shape
        if hidden.shape[:2] != (B, T):
            raise DynspecError(f"draft hidden input has shape {tuple(hidden.shape)}; tokens are {(B, T)}")
        batch = row_batch(self, positions, row0, kv_len)
        logits, out = self.run(tokens.reshape(B * T), hidden.reshape(B * T, -1), batch)
        return logits.view(B, T, -1), out.view(B, T, -1)

    def extend_kv(self, tokens: Tensor, hidden: Tensor, batch: RaggedBatch) -> None:
        """Keep-warm while K=0: write only the K/V of entries (tokens [N], fused hidden [N, w])
        at the batch's positions; no attention, MLP or lm_head."""
        x, _ = self.layer_input(tokens, self.fuse(hidden))                   # [N, 2h]
        cos = self.rope_cos[batch.positions].unsqueeze(1)                    # [N, 1, hd/2]
        sin = self.rope_sin[batch.positions].unsqueeze(1)
        kv = F.linear(x, self.wqkv[self.q_size:])                            # [N, 2 kvh hd]: no q heads
        self.kernels.rope_write(kv, cos, sin, self.k_cache, self.v_cache, batch.write_index, 0,
                                self.kv_size // self.config.head_dim)

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocab ids -> target-vocab ids: target_id = draft_id + d2t[draft_id]."""
        return draft_ids + self.d2t[draft_ids]
