"""CLI conventions of `dynspec` and the benchmark suite: `--version`, flags only as spelled in full
(no argparse prefix matching), and every option's default shown in --help."""
import argparse
import contextlib
import io
import subprocess
import sys
from importlib.metadata import version

import pytest

from dynspec.benchmarks import suite
from dynspec.cli import main, make_parser

OURS = ("schedule", "convert", "build", "generate")      # the subcommands whose parsers live in this kit's core


def run_main(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_version_prints_the_installed_version():
    r = subprocess.run([sys.executable, "-m", "dynspec.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"dynspec {version('dynspec')}", (r.stdout, r.stderr)


@pytest.mark.parametrize("argv", [
    ["schedule", "--sched", "4:4"],
    ["schedule", "--schedule", "4:4", "--max-batch", "8"],
    ["schedule", "--schedule", "4:4", "--js"],
])
def test_an_abbreviated_flag_is_an_error(argv):
    code, out, err = run_main(argv)
    assert code == 2 and out == "" and ("unrecognized arguments" in err or "required" in err), (code, out, err)


def test_the_suite_takes_no_abbreviation():
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        suite.make_parser().parse_args(["cpu_tiny", "--dry"])


def subparsers(parser: argparse.ArgumentParser, path: str = "dynspec"):
    """(path, parser) of every parser under `parser`, itself included."""
    yield path, parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from subparsers(sub, f"{path} {name}")


def test_every_default_is_in_the_help():
    seen = 0
    for path, p in subparsers(make_parser()):
        if path.split()[1:2] and path.split()[1] not in OURS:
            continue
        text = " ".join(p.format_help().split())
        for a in p._actions:
            d = a.default
            if not a.option_strings or d is None or d is False or d is argparse.SUPPRESS:
                continue
            seen += 1
            assert f"(default: {d})" in text or "default" in (a.help or "").lower(), (path, a.option_strings)
    assert seen >= 15
    build = " ".join(make_parser()._subparsers._group_actions[0].choices["build"].format_help().split())
    assert "--tp TP tensor parallel ranks, as converted (default: 8)" in build
