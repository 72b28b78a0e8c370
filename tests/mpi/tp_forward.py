"""Target + draft forward of one batch under TP, for tests/test_tp.py (no engine, no executor):

    mpirun -n N python tests/mpi/tp_forward.py --tp N --target T --draft D --out OUT.pt

OUT.pt (world rank 0): {"target_logits": [B, T, V], "hidden": [B, T, n*h], "draft_logits": [B, T, dv]}
in float64, from the sharded models with their collectives.
"""
import argparse

import torch

from dynspec.runtime.engines.reference.load import load_draft, load_target
from dynspec.runtime.engines.reference.tp import apply_tp
from dynspec.runtime.tp.tp_groups import abort_on_error, init_tp
from dynspec.runtime.tp.tp_lifecycle import shutdown


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 161, (3, 7), generator=g)
    tokens[0, 0], tokens[1, 0], tokens[2, 0] = 0, 160, 80          # first and last vocab rows, a shard edge
    return tokens, torch.arange(7).expand(3, 7)


def forward(target, draft) -> dict:
    tokens, positions = batch()
    target.setup_cache(3, 16)
    draft.setup_cache(3, 16)
    with torch.inference_mode():
        logits, hidden = target(tokens, positions, capture=draft.capture_layers)
        dlogits, _ = draft(tokens, hidden, positions)
    return {"target_logits": logits.double(), "hidden": hidden, "draft_logits": dlogits.double()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ctx = init_tp(a.tp)
    with abort_on_error(ctx):
        target = load_target(a.target, dtype=torch.float64)
        draft = load_draft(a.draft, target, dtype=torch.float64)
        apply_tp(target, draft, ctx)
        out = forward(target, draft)
        if ctx.layout.rank == 0:
            torch.save(out, a.out)
        shutdown(ctx)


if __name__ == "__main__":
    main()
