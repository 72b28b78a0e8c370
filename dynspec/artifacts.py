"""Write artifacts all-or-nothing: build in a temporary sibling folder, rename into place."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from dynspec.errors import DynspecError


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces `out`, on error it is removed.

    A non-empty `out` is refused unless force=True, so nothing is overwritten by accident.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise DynspecError(f"output folder {out} exists and is not empty; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON next to its final name, then rename (atomic on one filesystem)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def read_json(path: str | os.PathLike, what: str = "file") -> dict:
    path = Path(path)
    if not path.is_file():
        raise DynspecError(f"{what} {path} does not exist")
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DynspecError(f"{what} {path} is not valid JSON: {e}") from e
    if not isinstance(obj, dict):
        raise DynspecError(f"{what} {path} must hold a JSON object, not {type(obj).__name__}")
    return obj


def iter_jsonl(path: str | os.PathLike, what: str = "file"):
    """Yield (line number, 'FILE:LINE', object) for each non-blank line of a JSONL file;
    a bad line raises DynspecError naming FILE:LINE."""
    path = Path(path)
    if not path.is_file():
        raise DynspecError(f"{what} {path} does not exist")
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DynspecError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from e
            yield lineno, where, obj
