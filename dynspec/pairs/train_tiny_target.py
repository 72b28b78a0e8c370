"""Train the tiny Llama target with transformers' own LlamaForCausalLM and save it as bf16
safetensors (the layout load_target reads)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from dynspec.pairs.tiny_config import TinySpec, lr_at, target_hf_config
from dynspec.pairs.tiny_tokenizer import windows


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
