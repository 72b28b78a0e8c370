"""Greedy decoding of a target + EAGLE-3 draft pair on the reference engine: plain
(greedy_continue, plain_greedy), greedy K-chain speculative (spec_decode, whose output equals
plain greedy decoding's), and the held-out prompts the measurements decode (check_prompts)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from dynspec.corpus import read_texts, stdlib_files
from dynspec.pairs.tiny_tokenizer import windows
from dynspec.runtime.engines.reference.draft import Eagle3Draft
from dynspec.runtime.engines.reference.model import Target


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
