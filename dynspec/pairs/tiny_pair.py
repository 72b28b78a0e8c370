"""Build the tiny embedded target + EAGLE-3 draft pair from Python's own standard library.

    python -m dynspec.pairs.tiny_pair --out DIR [--seed 0] [--check]
    python -m dynspec.pairs.tiny_pair --check [DIR]   # default: the packaged pair

Every machine with Python has the text: the top-level `*.py` modules of the running
interpreter's standard library, sorted by name; every 8th one is held out for evaluation.
The split is recorded in build_info.json, and every measurement reads it from there (corpus.py).
The build (about 4 minutes on 2 CPU cores, fixed step counts, seeded):
1. a byte-level BPE tokenizer (`tokenizers`, vocab 1024), saved so that
   AutoTokenizer.from_pretrained(DIR/target) works;
2. a tiny Llama target (6 layers, hidden 128, GQA 4/2, llama3 RoPE scaling, untied head)
   trained with transformers' own LlamaForCausalLM, saved as bf16 safetensors;
3. self-distillation data: the bf16 target, loaded back through load_target, greedily
   continues prompts from the training text; every layer's output and its greedy tokens
   are kept;
4. an EAGLE-3 draft (capture layers (1, 3, 5), draft vocab = the 512 most frequent greedy
   tokens, so d2t matters) trained with a training-time-test unroll of K=4 chain steps:
   step 0 reads the target's fused capture, later steps read the draft's own previous
   output hidden, and the attention sees exactly what the cached chain sees at inference
   (see `_attend`). A second loss teaches it to abstain (uniform output) when it is fed the
   outputs of other layers or another order: a 6-layer toy's layers are far more alike
   than a real model's, and without it a wrongly wired capture would still be accepted.
`--check` runs a greedy K=4 chain-drafting loop with load_target/load_draft on held-out
prompts and prints the mean accepted draft tokens per step, also with wrong capture layers,
the right layers in the wrong order, and a scrambled d2t; it also checks that the output
equals plain greedy decoding. DIR/build_info.json records the spec, files and timing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dynspec.pairs.corpus import ASSET_DIR, BUILD_INFO, read_texts, split_stdlib, stdlib_files
from dynspec.runtime.engines.reference.draft import Eagle3Config, Eagle3Draft
from dynspec.runtime.engines.reference.load import load_draft, load_target
from dynspec.runtime.engines.reference.layer_ops import rope_tables
from dynspec.runtime.engines.reference.model import Target
from dynspec.runtime.engines.reference.model_config import TargetConfig

EOS = "<|endoftext|>"


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


# ----------------------------------------------------------------------------- corpus + tokenizer

def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, folder: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS)
    fast.save_pretrained(str(folder))


def encode_stream(tok, texts: list[str]) -> Tensor:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def windows(stream: Tensor, n: int, length: int, g: torch.Generator) -> Tensor:
    starts = torch.randint(0, stream.numel() - length, (n,), generator=g)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


# ----------------------------------------------------------------------------- target

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


def init_target(model, spec: TinySpec) -> None:
    """Unit-scale embeddings and residual writes (o_proj, down_proj) that grow with depth.

    With transformers' default init (std 0.02 everywhere) the briefly trained toy ends up with a
    residual stream made almost entirely by layer 0 (adjacent layers' outputs have cosine
    similarity 0.99), so no draft could tell which layers it was given. This init keeps the
    layers' outputs apart (adjacent cosine ~0.95, layer 1 vs 5 ~0.75) and trains to a lower
    loss in the same steps.
    """
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, spec.embed_init_std)
        for i, layer in enumerate(model.model.layers):
            layer.self_attn.o_proj.weight.normal_(0.0, 0.02 * (1 + i))
            layer.mlp.down_proj.weight.normal_(0.0, 0.02 * (1 + i))


def train_target(spec: TinySpec, stream: Tensor, vocab: int, progress: bool):
    from tqdm import tqdm
    from transformers import LlamaForCausalLM

    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM._from_config(target_hf_config(spec, vocab), attn_implementation="sdpa",
                                          dtype=torch.float32).train()
    init_target(model, spec)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.target_lr, betas=(0.9, 0.95), weight_decay=0.01)
    g = torch.Generator().manual_seed(spec.seed + 1)
    bar = tqdm(range(spec.target_steps), desc="target", disable=not progress, mininterval=2)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec.target_steps, spec.target_lr)
        x = windows(stream, spec.target_batch, spec.seq_len, g)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    return model.eval()


def save_hf_target(model, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(folder))
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})


@torch.no_grad()
def greedy_continue(target: Target, prompts: Tensor, new: int, batch: int = 64) -> Tensor:
    """Plain batched greedy decoding with the cache: [N, P] -> [N, P + new]."""
    outs = []
    for chunk in prompts.split(batch):
        B, P = chunk.shape
        target.setup_cache(B, P + new)
        pos = torch.arange(P).expand(B, P)
        logits, _ = target(chunk, pos, logits="last")
        seq = [chunk, logits[:, -1].argmax(-1, keepdim=True)]
        for i in range(new - 1):
            logits, _ = target(seq[-1], torch.full((B, 1), P + i), logits="last")
            seq.append(logits[:, -1].argmax(-1, keepdim=True))
        outs.append(torch.cat(seq, dim=1))
    return torch.cat(outs)


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


# ----------------------------------------------------------------------------- draft

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


# ----------------------------------------------------------------------------- build

def build(out: str | os.PathLike, spec: TinySpec = TinySpec(), progress: bool = True) -> dict:
    """Write OUT/target and OUT/draft (and OUT/build_info.json); returns the build info."""
    from dynspec.artifacts import atomic_dir

    t0 = time.time()
    torch.manual_seed(spec.seed)
    train_files, held_files = split_stdlib()
    texts = read_texts(train_files)
    tok = train_tokenizer(texts, spec.vocab)
    vocab = tok.get_vocab_size()
    stream = encode_stream(tok, texts)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if progress else (lambda *a: None)
    log(f"tokenizer: vocab {vocab}, {stream.numel()} training tokens from {len(train_files)} files "
        f"({time.time() - t0:.0f}s)")
    with atomic_dir(out, force=True) as tmp:
        hf_target = train_target(spec, stream, vocab, progress)
        save_hf_target(hf_target, tmp / "target")
        save_tokenizer(tok, tmp / "target")
        target = load_target(tmp / "target")                 # the bf16-rounded weights, as served
        g = torch.Generator().manual_seed(spec.seed + 3)
        prompts = windows(stream, spec.prompts, spec.prompt_len, g)
        seqs = greedy_continue(target, prompts, spec.seq_len - spec.prompt_len)
        L = target.config.num_layers
        captures, labels = capture_and_label(target, seqs, tuple(range(L)))
        captures = captures.unflatten(-1, (L, -1)).to(torch.bfloat16)             # [N, T, L, h]
        counts = torch.bincount(labels.flatten(), minlength=vocab).double()
        counts += torch.bincount(stream, minlength=vocab).double() / stream.numel()  # tie-break: corpus
        draft_ids = counts.argsort(descending=True, stable=True)[:spec.draft_vocab].sort().values
        coverage = float(torch.isin(labels, draft_ids).float().mean())
        log(f"distillation: {tuple(seqs.shape)} tokens, draft vocab {spec.draft_vocab} covers "
            f"{coverage:.1%} of greedy labels ({time.time() - t0:.0f}s)")
        draft = train_draft(spec, target, captures, seqs, labels, draft_ids, progress)
        save_hf_draft(draft, draft_hf_config(spec, target.config, spec.draft_vocab), tmp / "draft")
        info = {
            "built_by": "python -m dynspec.pairs.tiny_pair --out DIR",
            "spec": asdict(spec),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "train_files": [f.name for f in train_files],
            "held_out_files": [f.name for f in held_files],
            "train_tokens": int(stream.numel()),
            "draft_vocab_label_coverage": round(coverage, 4),
            "build_seconds": round(time.time() - t0, 1),
        }
        (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    log(f"built {out} in {info['build_seconds']}s")
    return info


# ----------------------------------------------------------------------------- check

@torch.no_grad()
def spec_decode(target: Target, draft: Eagle3Draft, prompt: list[int], new: int, k: int) -> tuple[list[int], list[int]]:
    """Greedy K-chain speculative decoding, batch 1 -> (generated tokens, accepted per step).

    Index convention as in draft.py: draft row @p pairs the capture at p with the token at p+1.
    """
    n = len(prompt)
    size = n + new + k + 2
    target.setup_cache(1, size)
    draft.setup_cache(1, size)
    cap = draft.capture_layers
    ar = lambda a, b: torch.arange(a, b).unsqueeze(0)  # noqa: E731
    logits, hid = target(torch.tensor([prompt]), ar(0, n), capture=cap)
    out = [int(logits[0, -1].argmax())]
    dl, dh = draft(torch.tensor([prompt[1:] + out]), hid, ar(0, n))
    pos, accepted = n, []                       # pos: position of the last emitted token
    while len(out) < new:
        logit, h = dl[0, -1], dh[:, -1:]
        drafts = []
        for s in range(k):
            d = draft.to_target_ids(logit.argmax())
            drafts.append(int(d))
            if s < k - 1:
                dl1, h = draft(d.view(1, 1), h, ar(pos + s, pos + s + 1))
                logit = dl1[0, -1]
        logits, hid = target(torch.tensor([[out[-1]] + drafts]), ar(pos, pos + k + 1), capture=cap)
        g = logits[0].argmax(-1).tolist()
        a = 0
        while a < k and drafts[a] == g[a]:
            a += 1
        emitted = drafts[:a] + [g[a]]
        out += emitted
        accepted.append(a)
        dl, dh = draft(torch.tensor([emitted]), hid[:, :a + 1], ar(pos, pos + a + 1))
        pos += a + 1
    return out[:new], accepted


@torch.no_grad()
def plain_greedy(target: Target, prompt: list[int], new: int) -> list[int]:
    return greedy_continue(target, torch.tensor([prompt]), new)[0, len(prompt):].tolist()


def check_prompts(folder: Path, n: int = 16, length: int = 48, seed: int = 0) -> list[list[int]]:
    """Held-out prompts: `length`-token windows from the held-out stdlib modules FOLDER's
    build_info.json records."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder / "target"))
    _, held = stdlib_files(folder)
    ids = torch.tensor([i for t in read_texts(held) for i in tok(t)["input_ids"] + [tok.eos_token_id]])
    g = torch.Generator().manual_seed(seed + 7)
    return windows(ids, n, length, g).tolist()


def scramble_d2t(draft: Eagle3Draft, seed: int = 0) -> None:
    """Permute which target id each draft id maps to (t2d stays the same set)."""
    ids = draft.to_target_ids(torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device))
    perm = torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(seed)).to(ids.device)
    draft.d2t.copy_(ids[perm] - torch.arange(ids.numel(), device=ids.device))


def check(folder: str | os.PathLike = ASSET_DIR, *, k: int = 4, prompts: int = 16, new: int = 64,
          progress: bool = True) -> dict:
    """Mean accepted draft tokens per step (K-chain, greedy) for correct and broken wiring."""
    folder = Path(folder)
    target = load_target(folder / "target")
    prompt_ids = check_prompts(folder, prompts)
    good = load_draft(folder / "draft", target).capture_layers
    L = target.config.num_layers
    wrong = tuple(i for i in range(L) if i not in good)[:len(good)]
    variants = {"correct": dict(), f"wrong_capture_{list(wrong)}": dict(capture_layers=wrong),
                f"wrong_order_{list(good[::-1])}": dict(capture_layers=good[::-1]), "scrambled_d2t": dict()}
    result = {"k": k, "prompts": prompts, "new_tokens": new, "capture_layers": list(good)}
    for name, kw in variants.items():
        draft = load_draft(folder / "draft", target, **kw)
        if name == "scrambled_d2t":
            scramble_d2t(draft)
        acc, lossless = [], True
        for p in prompt_ids:
            out, a = spec_decode(target, draft, p, new, k)
            acc += a
            if name == "correct":
                lossless &= out == plain_greedy(target, p, new)
        result[name] = round(sum(acc) / len(acc), 3)
        if name == "correct":
            result["lossless"] = lossless
        if progress:
            print(f"{name}: mean accepted per step {result[name]:.3f} over {len(acc)} steps", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dynspec.pairs.tiny_pair", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="build the pair into this folder (replaced if it exists)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", nargs="?", const="", default=None, metavar="DIR",
                    help="measure acceptance of DIR (default: --out, else the packaged pair)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.out is None and args.check is None:
        ap.error("nothing to do: pass --out DIR and/or --check [DIR]")
    if args.out:
        build(args.out, replace(TinySpec(), seed=args.seed), progress=not args.quiet)
    if args.check is not None:
        folder = args.check or args.out or ASSET_DIR
        print(json.dumps(check(folder, progress=not args.quiet), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
