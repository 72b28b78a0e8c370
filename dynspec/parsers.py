"""The argparse classes of every dynspec parser: the `dynspec` command and its subcommands
(dynspec/cli.py), the Triton launchers (triton_repo/server.py) and the benchmark scripts. Below
everything that builds a parser, so none of them imports the `dynspec` command itself:

    p = Parser(prog="demo"); p.add_argument("--dtype", default="bfloat16", help="weights' dtype")
    p.parse_args(["--dtyp", "x"])   -> error: unrecognized arguments (no abbreviations)
    p.format_help()                 -> "... --dtype DTYPE  weights' dtype (default: bfloat16)"
"""
from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends each option's text with its default, "--tp N ... (default: 8)", unless the
    default is None or a flag's False, or the text already speaks of its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (not action.option_strings or d is None or d is False or d is argparse.SUPPRESS
                or "default" in text.lower()):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """Every dynspec parser and subcommand parser: flags only as spelled in full (--dtyp is an
    error, not --dtype) and defaults shown in --help (DefaultsFormatter). Subparsers made from one
    are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
