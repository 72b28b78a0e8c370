"""Train the tiny pair's EAGLE-3 draft on the target's self-distillation data and save it in
the HF EAGLE-3 layout (the one load_draft reads).

The data: every target layer's output and the target's greedy label at each position
(capture_and_label). The loss: a training-time-test unroll of K chain steps (ttt_loss, whose
attention `_attend` sees exactly what the cached chain sees at inference), plus an abstain loss
(uniform output) for captures of the wrong layers or order (abstain_loss, wrong_layers).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dynspec.pairs.tiny_config import TinySpec, draft_hf_config, lr_at
from dynspec.runtime.engines.reference.draft import Eagle3Config, Eagle3Draft
from dynspec.runtime.engines.reference.layer_ops import rope_tables
from dynspec.runtime.engines.reference.model import Target


@torch.no_grad()
def capture_and_label(target: Target, seqs: Tensor, capture: tuple[int, ...], batch: int = 64):
    """(fused captures [N, T, n*h], greedy labels [N, T]: argmax of the target at each position)."""
    hs, ys = [], []
    for chunk in seqs.split(batch):
        B, T = chunk.shape
        target.setup_cache(B, T)
        logits, h = target(chunk, torch.arange(T).expand(B, T), capture=capture)
        hs.append(h)
        ys.append(logits.argmax(-1))
    return torch.cat(hs), torch.cat(ys)


def init_draft(draft: Eagle3Draft, g: torch.Generator) -> None:
    for name, p in draft.named_parameters():
        if name.startswith("embed_tokens"):
            continue
        with torch.no_grad():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=g)
        p.requires_grad_(True)


def _attend(q: Tensor, k0: Tensor, v0: Tensor, chain_k: list[Tensor], chain_v: list[Tensor]) -> Tensor:
    """Training-time-test attention for one unroll step s = len(chain_k).

    Chain i (started at position i) is now at position i+s. At inference its cache holds
    the step-0 rows of positions 0..i (computed from the target's captures), then its own
    chain rows at i+1..i+s; step-0 rows at i+1.. were overwritten by the chain, so they are
    hidden. q [B, nh, T, hd]; k0, v0 [B, kvh, T, hd]; chain_k[j], chain_v[j]: the step-(j+1)
    rows of every chain, [B, kvh, T, hd]. Returns [B, T, nh*hd].
    """
    B, nh, T, hd = q.shape
    g = nh // k0.shape[1]
    k0, v0 = k0.repeat_interleave(g, 1), v0.repeat_interleave(g, 1)
    scale = hd ** -0.5
    s0 = (q @ k0.transpose(-1, -2)) * scale                                    # [B, nh, T, T]
    s0 = s0.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    ks = [k.repeat_interleave(g, 1) for k in chain_k]
    vs = [v.repeat_interleave(g, 1) for v in chain_v]
    sd = [((q * k).sum(-1, keepdim=True)) * scale for k in ks]                 # [B, nh, T, 1] each
    w = torch.cat([s0, *sd], dim=-1).softmax(-1)
    o = w[..., :T] @ v0
    for j, v in enumerate(vs):
        o = o + w[..., T + j:T + j + 1] * v
    return o.transpose(1, 2).reshape(B, T, nh * hd)


def ttt_loss(draft: Eagle3Draft, tokens: Tensor, fused: Tensor, labels: Tensor, t2d_index: Tensor,
             steps: int, cos: Tensor, sin: Tensor) -> tuple[Tensor, list[float]]:
    """Unrolled chain loss. Row i at step s sits at position i+s, reads token x[i+s+1] and
    predicts the target's greedy label y[i+s+1] (the token at position i+s+2)."""
    B, T = tokens.shape
    pad = steps + 1
    x = F.pad(tokens, (0, pad))
    y = F.pad(t2d_index[labels], (0, pad), value=-100)                         # draft-vocab labels
    hidden = draft.fuse(fused)                                                 # [B, T, h]
    chain_k: list[Tensor] = []
    chain_v: list[Tensor] = []
    total, accs = 0.0, []
    for s in range(steps):
        inp, residual = draft.layer_input(x[:, s + 1:s + 1 + T], hidden)
        q, k, v = draft.qkv(inp, cos[s:s + T].unsqueeze(0).unsqueeze(0), sin[s:s + T].unsqueeze(0).unsqueeze(0))
        if s == 0:
            k0, v0 = k, v
            attn = _attend(q, k0, v0, [], [])
        else:
            chain_k.append(k)
            chain_v.append(v)
            attn = _attend(q, k0, v0, chain_k, chain_v)
        logits, hidden = draft.finish(attn, residual)
        tgt = y[:, s + 1:s + 1 + T]
        total = total + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
        ok = tgt != -100
        accs.append(float((logits.argmax(-1)[ok] == tgt[ok]).float().mean()))
    return total / steps, accs


def abstain_loss(draft: Eagle3Draft, tokens: Tensor, fused: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Cross-entropy to the uniform distribution for a capture of the WRONG layers (step 0)."""
    T = tokens.shape[1]
    inp, residual = draft.layer_input(F.pad(tokens, (0, 1))[:, 1:T + 1], draft.fuse(fused))
    q, k, v = draft.qkv(inp, cos[:T].unsqueeze(0).unsqueeze(0), sin[:T].unsqueeze(0).unsqueeze(0))
    logits, _ = draft.finish(_attend(q, k, v, [], []), residual)
    return -logits.log_softmax(-1).mean()


def wrong_layers(layers: int, right: tuple[int, ...], g: torch.Generator) -> list[int]:
    """A wrong ordered choice of distinct layers: half the time a near miss (each layer moved by
    -1, 0 or +1, e.g. the inputs-instead-of-outputs bug), else any other choice or order."""
    while True:
        if torch.rand((), generator=g) < 0.5:
            pick = [i + int(d) for i, d in zip(right, torch.randint(-1, 2, (len(right),), generator=g))]
        else:
            pick = torch.randperm(layers, generator=g)[:len(right)].tolist()
        if tuple(pick) != right and len(set(pick)) == len(pick) and all(0 <= i < layers for i in pick):
            return pick


def train_draft(spec: TinySpec, target: Target, captures: Tensor, seqs: Tensor, labels: Tensor,
                draft_ids: Tensor, progress: bool) -> Eagle3Draft:
    """captures [N, T, L, h]: every target layer's output, so wrong wirings can be shown too."""
    from tqdm import tqdm

    tc = target.config
    cfg = Eagle3Config.from_hf(draft_hf_config(spec, tc, draft_ids.numel()), "tiny draft config", tc)
    draft = Eagle3Draft(cfg, embed=target.tok_embeddings)
    g = torch.Generator().manual_seed(spec.seed + 2)
    init_draft(draft, g)
    with torch.no_grad():
        draft.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
        draft.t2d.zero_()
        draft.t2d[draft_ids] = True
    t2d_index = torch.full((tc.vocab_size,), -100, dtype=torch.long)
    t2d_index[draft_ids] = torch.arange(draft_ids.numel())
    cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, spec.seq_len + spec.ttt_steps + 1,
                           "cpu", torch.float32)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.draft_lr, betas=(0.9, 0.95), weight_decay=0.0)
    bar = tqdm(range(spec.draft_steps), desc="draft", disable=not progress, mininterval=2)
    N, T, L, _ = captures.shape
    right = list(spec.capture_layers)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec.draft_steps, spec.draft_lr)
        idx = torch.randint(0, N, (spec.draft_batch,), generator=g)
        cap = captures[idx].float()                                              # [b, T, L, h]
        fused = cap[:, :, right].flatten(2)                                      # [b, T, 3h]
        loss, accs = ttt_loss(draft, seqs[idx], fused, labels[idx], t2d_index, spec.ttt_steps, cos, sin)
        if spec.abstain_weight:
            wrong = cap[:, :, wrong_layers(L, spec.capture_layers, g)].flatten(2)
            loss = loss + spec.abstain_weight * abstain_loss(draft, seqs[idx], wrong, cos, sin)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", acc="/".join(f"{a:.2f}" for a in accs), refresh=False)
    for p in params:
        p.requires_grad_(False)
    return draft.eval()


def save_hf_draft(draft: Eagle3Draft, hf_cfg: dict, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    q, kv, inter = draft.q_size, draft.kv_size, draft.config.intermediate_size
    bf = lambda t: t.detach().to(torch.bfloat16).contiguous()  # noqa: E731
    sd = {
        "fc.weight": bf(draft.fc),
        "midlayer.hidden_norm.weight": bf(draft.hidden_norm),
        "midlayer.input_layernorm.weight": bf(draft.input_layernorm),
        "midlayer.self_attn.q_proj.weight": bf(draft.wqkv[:q]),
        "midlayer.self_attn.k_proj.weight": bf(draft.wqkv[q:q + kv]),
        "midlayer.self_attn.v_proj.weight": bf(draft.wqkv[q + kv:]),
        "midlayer.self_attn.o_proj.weight": bf(draft.wo),
        "midlayer.post_attention_layernorm.weight": bf(draft.post_attention_layernorm),
        "midlayer.mlp.gate_proj.weight": bf(draft.w13[:inter]),
        "midlayer.mlp.up_proj.weight": bf(draft.w13[inter:]),
        "midlayer.mlp.down_proj.weight": bf(draft.w2),
        "norm.weight": bf(draft.norm),
        "lm_head.weight": bf(draft.lm_head),
        "d2t": draft.d2t.clone(),
        "t2d": draft.t2d.clone(),
    }
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
