"""Concurrency sweep: baseline (K=0), static (fixed K) and dynamic (the schedule), side by side.

    python -m dynspec.benchmarks.sweep --help     (usage and flags: benchmarks/sweep_args.py)

The modules, in import order: sweep_args (flags), sweep_modes (policies), sweep_plan (SweepSpec),
sweep_rows (result rows), sweep_loop (the measurement), sweep_run (the process), sweep_cases
(several sweeps on one engine).
"""
from __future__ import annotations

import sys

from dynspec.benchmarks.mpi import log
from dynspec.benchmarks.sweep_args import make_parser
from dynspec.benchmarks.sweep_run import run
from dynspec.errors import DynspecError

__all__ = ["main", "make_parser", "run"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    try:
        code = run(args, argv)
    except DynspecError as e:
        log(f"error: {e}", all_ranks=True)
        code = 2
    from dynspec.runtime.tp.tp_lifecycle import exit_status

    return exit_status(code)


if __name__ == "__main__":
    sys.exit(main())
