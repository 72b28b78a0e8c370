"""How often outputs agree across batch sizes and draft lengths in a given dtype.

Speculation is lossless against the same engine's K=0 decode when arithmetic is exact enough
(float32, float64: tests/test_executor.py). In bf16 a row's logits depend on what it is batched
with (reduction order, padded shapes), so near-tied argmaxes can flip. This measures that rate
for three pairs of runs over the same prompts, greedy, the same engine:

    batch      K=0, one request at a time    vs  K=0, `concurrency` requests at once
    draft      K=0, one request at a time    vs  K=k, one request at a time
    both       K=0, `concurrency` at once    vs  K=k, `concurrency` at once

    python -m dynspec.benchmarks.numerics --dtype bfloat16 --out bf16_agreement.json
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from dynspec.errors import DynspecError


def agreement(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> dict:
    """Identical outputs and, for the others, the first token index where they part.
    agreement([(1, 2, 3)], [(1, 2, 4)]) -> {"identical": 0, "of": 1, "first_divergence": [2]}"""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} outputs against {len(b)}")
    firsts = []
    for x, y in zip(a, b):
        if x != y:
            firsts.append(next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y))))
    return {"identical": len(a) - len(firsts), "of": len(a), "first_divergence": firsts}


def _outputs(executor, prompts, max_new: int, concurrency: int) -> list[tuple[int, ...]]:
    from dynspec.runtime.serving.driver import run_closed_loop

    results = run_closed_loop(executor, prompts, max_new, concurrency)
    return [tuple(r.output_ids) for r in results]


def measure(dtype: str, num_prompts: int, max_new: int, concurrency: int, k: int, device: str = "cpu") -> dict:
    from dynspec.corpus import default_prompts
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.generate.session import engine_config_for, open_executor, tiny_pair_dirs
    from transformers import AutoTokenizer

    target, draft = tiny_pair_dirs()
    cfg = engine_config_for(target, draft, DraftSchedule.static(k, concurrency))
    cfg = replace(cfg, reference=replace(cfg.reference, dtype=dtype, max_batch_size=concurrency))
    prompts = default_prompts(AutoTokenizer.from_pretrained(target), n=num_prompts)
    runs = {}
    for name, kk, c in (("k0_b1", 0, 1), ("k0_bC", 0, concurrency), ("kK_b1", k, 1), ("kK_bC", k, concurrency)):
        ex = open_executor(cfg, device=device, policy=DraftSchedule.static(kk, concurrency) if kk else DraftSchedule())
        runs[name] = _outputs(ex, prompts, max_new, c)
    return {
        "dtype": dtype, "device": device, "prompts": num_prompts, "max_new_tokens": max_new,
        "concurrency": concurrency, "k": k, "pair": "embedded tiny pair, held-out prompts",
        "batch": agreement(runs["k0_b1"], runs["k0_bC"]),
        "draft": agreement(runs["k0_b1"], runs["kK_b1"]),
        "both": agreement(runs["k0_bC"], runs["kK_bC"]),
        "command": "python -m dynspec.benchmarks.numerics " + " ".join(sys.argv[1:]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.numerics", description=__doc__.split("\n")[0],
                                allow_abbrev=False)
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-prompts", type=int, default=30)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--out", help="JSON file")
    args = p.parse_args(argv)
    try:
        for flag in ("num_prompts", "max_new_tokens", "concurrency", "k"):
            if getattr(args, flag) < 1:
                raise DynspecError(f"--{flag.replace('_', '-')} {getattr(args, flag)} must be at least 1")
        from dynspec.runtime.generate.session import check_device

        check_device(args.device)
        doc = measure(args.dtype, args.num_prompts, args.max_new_tokens, args.concurrency, args.k, args.device)
        if args.out:
            from dynspec.artifacts import write_json

            write_json(args.out, doc)
    except DynspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for what in ("batch", "draft", "both"):
        a = doc[what]
        print(f"{what:>6}: {a['identical']}/{a['of']} identical; first divergence at tokens {a['first_divergence']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
