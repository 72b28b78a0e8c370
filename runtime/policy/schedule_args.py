"""The --schedule SPEC | --threshold N --max-draft-len K flags of every command that takes a draft
schedule (`dynspec schedule`, `dynspec build`, `dynspec generate`), and the --ttft-weight W flag of
every command that builds a cost-model policy (`dynspec build`, `dynspec generate`, the sweep), added
and read in one place below the commands, so that the generate command in runtime/ needs nothing
from dynspec/cli.py:

    p = argparse.ArgumentParser(); add_schedule_args(p, required=False)
    schedule_of(p.parse_args([]))                                   -> None (not required, not given)
    schedule_of(p.parse_args(["--schedule", "4:4,8:2"]))            -> DraftSchedule "4:4,8:2"
    schedule_of(p.parse_args(["--threshold", "8", "--max-draft-len", "3"]))  -> DraftSchedule "8:3"
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule, schedule_from_args

MAX_SPEC_FILE_BYTES = 1 << 16


def spec_file(text: str, where: str, holds: str) -> str:
    """The text of '@FILE' (a flag's value naming a file: `dynspec tune --out`'s schedule.txt, a
    prefill cap), at most MAX_SPEC_FILE_BYTES and naming no further file; `where` (the flag) and
    `holds` (what the file must hold, 'tiers') name the value in each refusal."""
    path = Path(text[1:])
    if not text[1:]:
        raise DynspecError(f"{where} {text}: name a file after '@'")
    if path.is_dir():
        raise DynspecError(f"{where} {text}: {path} is a folder, not a file")
    if not path.is_file():
        raise DynspecError(f"{where} {text}: file {path} does not exist")
    if path.stat().st_size > MAX_SPEC_FILE_BYTES:
        raise DynspecError(f"{where} {text}: file {path} is larger than {MAX_SPEC_FILE_BYTES} bytes")
    body = path.read_text(encoding="utf-8", errors="replace").strip()
    if body.startswith("@"):
        raise DynspecError(f"{where} {text}: file {path} names another file; it must hold {holds}")
    return body


def add_schedule_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """--schedule SPEC | --threshold N --max-draft-len K, shared by every command that takes a policy."""
    p.add_argument("--schedule", "--spec", dest="schedule", metavar="SPEC",
                   help="tiers 'max_batch:K,...', e.g. '4:4,8:2,32:1' (K=0 above the last bound)")
    p.add_argument("--threshold", type=int, metavar="N", help="speculate for batch sizes 1..N, K=0 above")
    p.add_argument("--max-draft-len", type=int, metavar="K", help="K used with --threshold")
    p.set_defaults(_schedule_required=required)


def add_ttft_weight_arg(p, default: str) -> None:
    """--ttft-weight W on parser or group p; `default` says what applies without it."""
    p.add_argument("--ttft-weight", type=float, metavar="W",
                   help="cost-model policies: a prompt whose prefill a step ends weighs W decode rows that gain one "
                        f"token at any K (runtime/policy/prefill_price.py; 0: throughput alone; default: {default})")


def add_prefill_k_arg(p, default: str) -> None:
    """--prefill-k K|TIERS|@FILE on parser or group p; `default` says what applies without it."""
    p.add_argument("--prefill-k", metavar="K|TIERS|@FILE",
                   help="a schedule's K at most K (or the tiers' K at the batch size, e.g. 32:1; @FILE: a file"
                        " holding one) on an iteration that ends a prompt's prefill, for time to first "
                        f"token (runtime/policy/prefill_cap.py; reference engine only; default: {default})")


def schedule_of(args: argparse.Namespace) -> DraftSchedule | None:
    if args.schedule is None and args.threshold is None and not args._schedule_required:
        return None
    return schedule_from_args(args.schedule, args.threshold, args.max_draft_len)
