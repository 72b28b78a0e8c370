"""The one `dynspec` command. Thin: parse flags, call a function, print. Heavy imports
(torch, transformers, tensorrt_llm) happen inside the subcommand that needs them."""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from dynspec.errors import DynspecError
from dynspec.parsers import Parser
from dynspec.runtime.policy import MAX_BATCH_SIZE
from dynspec.runtime.policy.schedule_args import add_schedule_args, schedule_of

# Modules that add subcommands: each has `register(subparsers)`.
SUBCOMMAND_MODULES = (
    "dynspec.convert.cli",        # convert target | convert eagle3
    "dynspec.build.cli",          # build
    "dynspec.runtime.generate.generate_cli",  # generate
    "dynspec.benchmarks.cli",     # profile, tune
    "dynspec.triton_repo.cli",    # triton
)


def version() -> str:
    """The installed dynspec's version, '0.1.0' (from its package metadata)."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("dynspec")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _cmd_schedule(args: argparse.Namespace) -> int:
    if not 1 <= args.max_batch_size <= MAX_BATCH_SIZE:
        raise DynspecError(f"--max-batch-size {args.max_batch_size} is outside 1..{MAX_BATCH_SIZE}")
    sched = schedule_of(args)
    rendered = sched.to_trtllm(args.trtllm_version)
    runs = sched.ranges(args.max_batch_size)          # O(tiers): ((1, 4, 4), (5, 8, 2), (9, 40, 0))
    if args.json:
        print(json.dumps({
            "tiers": [list(t) for t in sched.tiers],
            "trtllm_version": args.trtllm_version,
            "trtllm": {str(k): v for k, v in rendered.items()},
            "max_batch_size": args.max_batch_size,
            "draft_len_by_batch_range": [list(r) for r in runs],
            "vllm": sched.to_vllm(),
        }))
        return 0
    print(f"schedule {sched}   (max_draft_len={sched.max_draft_len})")
    print(f"{'batch size':>14}  K")
    for first, last, k in runs:
        print(f"{f'{first}..{last}':>14}  {k}")
    print(f"TRT-LLM {args.trtllm_version} draft_len_schedule: {json.dumps({str(k): v for k, v in rendered.items()})}")
    print(f"vLLM speculative_token_schedule (num_speculative_tokens={sched.max_draft_len}): {json.dumps(sched.to_vllm())}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dynspec",
        description="TensorRT-LLM + EAGLE-3 deployment kit whose draft length K follows the batch size.")
    parser.add_argument("--version", action="version", version=f"dynspec {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("schedule", help="show a draft-length schedule and its TRT-LLM rendering")
    add_schedule_args(p)
    p.add_argument("--trtllm-version", default="1.2.1", help="TRT-LLM release the schedule is rendered for")
    p.add_argument("--max-batch-size", type=int, default=256, help="largest batch size shown")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_schedule)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _name(args) -> str:
    """'dynspec generate' once the flags are parsed, else 'dynspec'."""
    return f"dynspec {args.command}" if args is not None else "dynspec"


def main(argv: list[str] | None = None) -> int:
    """Parse, run the subcommand, return its exit status: 2 on a DynspecError (one line), 130 on
    Ctrl-C (one line, the shell's status for SIGINT), wherever it lands: while the subcommands
    load, while torch imports, or in the work itself."""
    args = None
    try:
        args = make_parser().parse_args(argv)
        code = int(args.func(args) or 0)
    except DynspecError as e:
        print(f"{_name(args)}: error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"{_name(args)}: interrupted", file=sys.stderr, flush=True)
        code = 130
    life = sys.modules.get("dynspec.runtime.tp.tp_lifecycle")     # loaded: a TP run may exit hard (shutdown)
    return life.exit_status(code) if life is not None else code


if __name__ == "__main__":
    sys.exit(main())
