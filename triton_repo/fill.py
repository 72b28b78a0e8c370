"""`${param}` templates in the spirit of tensorrtllm_backend's fill_template.py, but strict.

    ${name}   replaced by params["name"] (a str the caller already formatted for the file type)
    $$        a literal "$"  (so a shell script writes its own variables as $${VAR})

Every placeholder must get a value and every value must be used by some file of the tree:
an unfilled or unknown parameter is an error naming the file and the parameter.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from dynspec.errors import DynspecError

_TOKEN = re.compile(r"\$(?:\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<dollar>\$)|(?P<bad>\{[^}\n]*\}?))")


@dataclass(frozen=True)
class Template:
    path: str                      # relative to the template root, '/'-separated
    text: str
    params: frozenset[str]         # placeholder names it uses

    @classmethod
    def parse(cls, path: str, text: str) -> "Template":
        names = set()
        for m in _TOKEN.finditer(text):
            if m.group("bad") is not None:
                line = text.count("\n", 0, m.start()) + 1
                raise DynspecError(
                    f"template {path}:{line}: malformed placeholder '${m.group('bad')}'"
                    " (use ${name} with a Python identifier, or $$ for a literal '$')"
                )
            if m.group("name") is not None:
                names.add(m.group("name"))
        return cls(path, text, frozenset(names))

    def fill(self, params: Mapping[str, str]) -> str:
        missing = sorted(self.params - set(params))
        if missing:
            raise DynspecError(f"template {self.path}: no value for parameter(s) {missing}")

        def sub(m: re.Match) -> str:
            if m.group("dollar") is not None:
                return "$"
            value = params[m.group("name")]
            if not isinstance(value, str):
                raise DynspecError(
                    f"template {self.path}: parameter {m.group('name')!r} must be a formatted str,"
                    f" not {type(value).__name__} {value!r}"
                )
            return value

        return _TOKEN.sub(sub, self.text)


def load_tree(root: str | os.PathLike) -> tuple[Template, ...]:
    root = Path(root)
    if not root.is_dir():
        raise DynspecError(f"template folder {root} does not exist")
    out = []
    for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        out.append(Template.parse(f.relative_to(root).as_posix(), f.read_text()))
    if not out:
        raise DynspecError(f"template folder {root} holds no files")
    return tuple(out)


def fill_tree(root: str | os.PathLike, params: Mapping[str, str], dst: str | os.PathLike) -> tuple[Path, ...]:
    """Fill every file under `root` into the same relative path under `dst`; *.sh files are made
    executable (package data does not always keep file modes)."""
    templates = load_tree(root)
    used = set().union(*(t.params for t in templates))
    unknown = sorted(set(params) - used)
    if unknown:
        raise DynspecError(f"templates under {root}: unknown parameter(s) {unknown}; used are {sorted(used)}")
    filled = [(t, t.fill(params)) for t in templates]
    written = []
    for t, text in filled:
        out = Path(dst) / t.path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        if out.suffix == ".sh":
            out.chmod(0o755)
        written.append(out)
    return tuple(written)


def pbtxt_string(value: str) -> str:
    """Body of a protobuf text-format string literal (the template supplies the quotes)."""
    if any(ord(c) < 0x20 for c in value):
        raise DynspecError(f"value {value!r} has control characters; it cannot go into config.pbtxt")
    return value.replace("\\", "\\\\").replace('"', '\\"')
