"""The tiny pair's text: the top-level `*.py` modules of Python's standard library. Below runtime/ and
pairs/ alike: the pair's build (pairs/), `dynspec generate`'s built-in prompts (runtime/) and the
benchmarks read it from here.

The build splits them (sorted by name, every 8th held out) and records both lists in
build_info.json. Everything that measures the pair reads the RECORDED held-out list, never a
split recomputed from the running interpreter, whose module list differs between versions and
would move training files into the "held-out" set:
    build_info.json {"held_out_files": ["_markupbase.py", "_threading_local.py", ...]}
    -> stdlib_files()[1] == [<stdlib>/_markupbase.py, <stdlib>/_threading_local.py, ...]
A recorded file this interpreter lacks (asyncore.py left in 3.12) is skipped.
"""
from __future__ import annotations

import json
import sysconfig
from importlib import resources
from pathlib import Path

from dynspec.errors import DynspecError

ASSET_DIR = Path(str(resources.files("dynspec") / "assets" / "tiny"))   # the committed pair
BUILD_INFO = "build_info.json"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_stdlib() -> tuple[list[Path], list[Path]]:
    """(train, held-out) of this interpreter's stdlib, for a new build only; every 8th is held out."""
    root = stdlib_root()
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if len(files) < 16:
        raise DynspecError(f"too few standard-library sources under {root}")
    return [f for i, f in enumerate(files) if i % 8 != 7], [f for i, f in enumerate(files) if i % 8 == 7]


def recorded_split(folder: str | Path = ASSET_DIR) -> tuple[list[str], list[str]]:
    """(train_files, held_out_files) names from FOLDER/build_info.json."""
    path = Path(folder) / BUILD_INFO
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DynspecError(f"{path}: cannot read the tiny pair's build info: {e}") from None
    out = []
    for field in ("train_files", "held_out_files"):
        names = info.get(field) if isinstance(info, dict) else None
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise DynspecError(f"{path}: field {field!r} must be a non-empty list of file names")
        out.append(names)
    if set(out[0]) & set(out[1]):
        raise DynspecError(f"{path}: {sorted(set(out[0]) & set(out[1]))[:3]} are both train and held-out files")
    return out[0], out[1]


def stdlib_files(folder: str | Path = ASSET_DIR) -> tuple[list[Path], list[Path]]:
    """The recorded (train, held-out) files found in this interpreter's stdlib."""
    root = stdlib_root()
    train, held = ([root / n for n in names if (root / n).is_file()] for names in recorded_split(folder))
    if not held:
        raise DynspecError(f"none of the held-out files in {Path(folder) / BUILD_INFO} exist under {root}")
    return train, held


def read_texts(files: list[Path]) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def default_prompts(tokenizer, n: int = 16, length: int = 48) -> list[tuple[int, ...]]:
    """n windows of `length` tokens, evenly spaced over the held-out text (bytes without a
    tokenizer); each window lies inside one file. Deterministic for a given Python."""
    if n < 1 or length < 1:
        raise DynspecError(f"prompts: n={n} and length={length} must be at least 1")
    texts = read_texts(stdlib_files()[1])
    docs = [tokenizer(t)["input_ids"] if tokenizer is not None else list(t.encode()) for t in texts]
    starts = [(d, i) for d, ids in enumerate(docs) for i in range(0, len(ids) - length + 1, length)]
    if len(starts) < n:
        raise DynspecError(f"the held-out text holds {len(starts)} windows of {length} tokens; asked for {n}")
    step = len(starts) / n
    picks = [starts[int(k * step)] for k in range(n)]
    return [tuple(docs[d][i:i + length]) for d, i in picks]
