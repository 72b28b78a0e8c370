"""What the benchmark suite (benchmarks/suite.py) checks of a config before anything runs, and of
what its stages write:

    names     a config's and a stage's name are plain names (letters, digits, '_', '-'): they become
              folders of OUT_ROOT, so 'name = "../victim"' is refused, naming the file and the stage;
    args      a stage's (and each case's) args are flags of the stage's tool, spelled in full as its
              own argparse parser knows them, with no abbreviation ('dtyp' is not --dtype) and no
              '=' inside a key ('"device=cpu" = true'); flags the suite sets itself (SUITE_SET, and
              any alias of one) are refused; the whole command line must then parse;
    paths     every output path of a stage resolves inside the config's results dir;
    installs  a file a stage installs outside OUT_ROOT (ENGINE_DIR/cost_model.json) is put back as
              it was when the config fails, so a failed config leaves nothing outside its
              OUT_ROOT/NAME.incomplete folder;
    logs      a failed stage is reported with the last error line of its log.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import types
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from dynspec.errors import DynspecError

PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]+")
FLAG_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")        # a flag as its tool spells it, without '--'
# where each tool's parser comes from: (module, subcommand of dynspec.cli or None)
TOOL_PARSERS = {"sweep": ("dynspec.benchmarks.sweep", None), "profile": ("dynspec.benchmarks.cli", "profile"),
                "tune": ("dynspec.benchmarks.cli", "tune"), "mixed_step": ("dynspec.benchmarks.mixed_step", None),
                "simulate": ("dynspec.benchmarks.simulate", None)}
# a tool that hands the flags it does not know to another's parser: simulate replays sweep flags
FORWARDS = {"simulate": ("sweep", ("--out", "-"))}
ERROR_LINE = re.compile(r"error|exception|traceback|killed|abort", re.IGNORECASE)
LOG_TAIL_BYTES = 64 * 1024
ERROR_LINE_CHARS = 400


def check_name(name: str, where: str, what: str = "stage") -> None:
    """'sweep_b', 'tune-015' pass; '../victim', 'a/b', '' are refused naming `where`."""
    if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name):
        raise DynspecError(f"{where}: {what} name {name!r} is not a plain name (letters, digits, '_', '-'); "
                           f"it becomes a folder of the results dir")


class _ParserBuilt(Exception):
    """Carries the parser a tool's main() built, out of main, before it parses anything."""


class _Grab(argparse.ArgumentParser):
    def parse_args(self, *a, **k):
        raise _ParserBuilt(self)


def _parser_built_by_main(mod: types.ModuleType) -> argparse.ArgumentParser:
    """The parser of a tool that builds it inside main(): main runs with argparse.ArgumentParser
    standing for a class that hands the parser back at its first parse_args, before any work."""
    if not isinstance(getattr(mod, "argparse", None), types.ModuleType):
        raise DynspecError(f"{mod.__name__}: its flags cannot be read (no make_parser() and no argparse import)")
    shim = types.SimpleNamespace(**{k: getattr(argparse, k) for k in dir(argparse) if not k.startswith("__")})
    shim.ArgumentParser = _Grab
    real, mod.argparse = mod.argparse, shim
    try:
        mod.main([])
    except _ParserBuilt as got:
        parser = got.args[0]
        parser.__class__ = argparse.ArgumentParser          # parses as any parser from here on
        return parser
    except SystemExit:
        pass
    finally:
        mod.argparse = real
    raise DynspecError(f"{mod.__name__}: its flags cannot be read (main() built no parser through "
                       f"argparse.ArgumentParser; give the module a make_parser())")


@lru_cache(maxsize=None)
def tool_parser(tool: str) -> argparse.ArgumentParser:
    """The tool's own parser, with abbreviations off and errors raised as DynspecError."""
    module, sub = TOOL_PARSERS[tool]
    mod = importlib.import_module(module)
    if sub is not None:
        top = argparse.ArgumentParser(prog="dynspec")
        subs = top.add_subparsers()
        mod.register(subs)
        parser = subs.choices[sub]
    elif hasattr(mod, "make_parser"):
        parser = mod.make_parser()
    else:
        parser = _parser_built_by_main(mod)
    parser.allow_abbrev = False

    def error(message: str):
        raise DynspecError(message)

    parser.error = error
    return parser


def check_tool_args(tool: str, args: Sequence[tuple[str, object]], argv: Sequence[str], suite_set: Iterable[str],
                    where: str) -> None:
    """Each key of `args` is one of the tool's flags, in full and not set by the suite; then the
    stage's whole command line `argv` (its flags after the module) parses. `where` names the
    config file and the stage: 'c.toml stages[0] (profile).args'."""
    parser = tool_parser(tool)
    actions = parser._option_string_actions
    ours = {actions[f"--{k}"].dest for k in suite_set if f"--{k}" in actions}
    for key, _ in args:
        if not FLAG_KEY.fullmatch(key):
            raise DynspecError(f"{where}: key {key!r} is not a flag name (letters, digits, '-', '_'; no '=')")
        action = actions.get(f"--{key}")
        if action is None and tool in FORWARDS:
            action = tool_parser(FORWARDS[tool][0])._option_string_actions.get(f"--{key}")
        if action is None:
            raise DynspecError(f"{where}: {tool} has no flag --{key} (flags are spelled in full, as in "
                               f"`{tool} --help`)")
        if action.dest in ours or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            raise DynspecError(f"{where}: {key!r} is set by the suite from [engine] and the results dir")
    try:
        if tool in FORWARDS:
            fwd, extra = FORWARDS[tool]
            tool_parser(fwd).parse_args(parser.parse_known_args(list(argv))[1] + list(extra))
        else:
            parser.parse_args(list(argv))
    except DynspecError as e:
        raise DynspecError(f"{where}: {tool} refuses the stage's flags: {e}") from None
    except SystemExit:
        raise DynspecError(f"{where}: {tool} exits while parsing the stage's flags") from None


def check_inside(paths: Iterable[str], root: Path, where: str) -> None:
    """Every path resolves inside `root` (links and '..' followed)."""
    home = Path(root).resolve()
    for p in paths:
        real = Path(p).resolve()
        if real != home and not real.is_relative_to(home):
            raise DynspecError(f"{where}: output {p} resolves to {real}, outside the results dir {home}")


def saved(path: str) -> tuple[str, bytes | None]:
    """(path, its bytes or None when absent): what restore() puts back."""
    try:
        return path, Path(path).read_bytes()
    except FileNotFoundError:
        return path, None


def restore(installed: Sequence[tuple[str, bytes | None]]) -> None:
    """Put installed files back as saved() found them, last first: absent ones removed."""
    for path, old in reversed(installed):
        p = Path(path)
        if old is None:
            p.unlink(missing_ok=True)
            continue
        tmp = p.with_name(f".{p.name}.restore-{os.getpid()}")
        tmp.write_bytes(old)
        os.replace(tmp, p)


def last_error_line(log: Path) -> str:
    """The last line of a stage's log that reads as an error ('ValueError: ...', 'error: ...'),
    else its last non-empty line; '' for an empty or unreadable log. Progress-bar carriage
    returns split lines; at most ERROR_LINE_CHARS characters."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip()]
    errors = [ln for ln in lines if ERROR_LINE.search(ln)]
    line = (errors or lines or [""])[-1]
    return line if len(line) <= ERROR_LINE_CHARS else line[:ERROR_LINE_CHARS] + "..."
