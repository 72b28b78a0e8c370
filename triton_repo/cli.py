"""`dynspec triton`: write a Triton model repository for an engine dir."""
from __future__ import annotations

import argparse


def _cmd_triton(args: argparse.Namespace) -> int:
    from dynspec.triton_repo.generate import generate_repo

    repo = generate_repo(args.engine_dir, args.out, args.variant, device=args.device, force=args.force)
    print(f"wrote {args.variant} model repository {repo}")
    if args.variant == "reference":
        print(f"serve it: python -m dynspec.triton_repo.server {repo}")
    else:
        print(f"serve it in a TRT-LLM Triton container (options: header of launch_triton.sh): {repo}/launch_triton.sh")
    return 0


def register(sub) -> None:
    p = sub.add_parser("triton", help="write a Triton model repository (reference executor or TRT-LLM LLM API)")
    p.add_argument("--engine-dir", required=True, metavar="DIR", help="engine dir written by `dynspec build`")
    p.add_argument("--out", required=True, metavar="REPO", help="model repository folder to write")
    p.add_argument("--variant", choices=("reference", "trtllm-llmapi"), default="reference")
    p.add_argument("--device", default="cpu", help="reference variant: cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.set_defaults(func=_cmd_triton)
