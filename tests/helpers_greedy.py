"""transformers greedy as the oracle in float32, where a near-tie may flip an argmax.

Two correct float32 implementations can pick different tokens where the reference's top two
logits lie within rounding of each other; past that token the sequences differ for good. So
each output is compared with transformers' greedy tokens, and at the first difference the
reference's own logits there decide: a margin (its token's logit minus ours) within `tie` of
the logits' scale is a near-tie and ends that row's comparison; anything larger fails, naming
the request, the position, both tokens and the margin. A wrong kernel shows as large margins.
"""
from __future__ import annotations

import torch

TIE = 1e-4            # x max(1, max |logit|): float32 rounding over a layer stack is ~1e-6 of it


def greedy_margin(hf, prompt, ref, out) -> tuple[int, float, float] | None:
    """None where out == ref; else (t, margin, scale) at the first t with out[t] != ref[t]:
    margin = logit(ref[t]) - logit(out[t]) of the reference after prompt + ref[:t]."""
    t = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), None)
    if t is None:
        assert len(out) == len(ref), f"{len(out)} tokens, transformers gives {len(ref)}"
        return None
    device = next(hf.parameters()).device
    ids = torch.tensor([list(prompt) + list(ref[:t])], device=device)
    with torch.no_grad():
        logits = hf(ids).logits[0, -1].double()
    return t, float(logits[ref[t]] - logits[out[t]]), max(1.0, float(logits.abs().max()))


def assert_greedy_up_to_ties(hf, prompts, lens, outputs, tie: float = TIE) -> int:
    """Each output equals hf's greedy generation, up to a near-tie (module docstring); returns
    how many rows ended at one."""
    device = next(hf.parameters()).device
    ties = 0
    for i, (p, n, out) in enumerate(zip(prompts, lens, outputs)):
        ids = torch.tensor([list(p)], device=device)
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0, eos_token_id=None)[0, len(p):].tolist()
        hit = greedy_margin(hf, p, ref, list(out))
        if hit is None:
            continue
        t, margin, scale = hit
        assert margin <= tie * scale, (f"request {i}: token {t} is {out[t]}, transformers greedy gives {ref[t]} "
                                       f"(its logit higher by {margin:.3g}, beyond a near-tie: {tie:g} x {scale:.3g})")
        ties += 1
    return ties
