"""`--check`: mean accepted draft tokens per step of greedy K-chain drafting on held-out
prompts, for the correct wiring and for wrong capture layers, the right layers in the wrong
order and a scrambled d2t; also whether the output equals plain greedy decoding."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from dynspec.corpus import ASSET_DIR
from dynspec.pairs.decode import check_prompts, plain_greedy, spec_decode
from dynspec.runtime.engines.reference.draft import Eagle3Draft
from dynspec.runtime.engines.reference.load import load_draft, load_target


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
