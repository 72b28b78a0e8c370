"""The files of a Hugging Face checkpoint folder: where they lie, their JSON, and whether a weight
file is still the one seen when the folder was opened.

- every file read lies inside the folder: a weight_map entry "../x.safetensors" or "/abs/x", or a
  symbolic link resolving outside the folder, is refused (links inside it are followed);
- each weight file's size, mtime and inode are recorded when the folder is opened (stamp); a file
  opened again later must still match (open_weights), else the error names it as changed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from dynspec.errors import DynspecError


def source_folder(folder: str | Path, what: str) -> Path:
    folder = Path(folder)
    if folder.is_symlink() and not folder.exists():
        raise DynspecError(f"{what} folder {folder} is a symbolic link that leads nowhere (a loop or a missing target)")
    if not folder.is_dir():
        raise DynspecError(f"{what} folder {folder} does not exist")
    return folder


def source_file(folder: Path, rel: str, where: str) -> Path:
    """FOLDER/rel, which must be a regular file inside FOLDER once links are resolved.
    source_file(hf, "../x.safetensors", idx) -> DynspecError: ... '../x.safetensors' leaves ..."""
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise DynspecError(f"{where}: file {rel!r} leaves the folder {folder}; files must lie inside it")
    path = folder / rel
    try:
        real, home = path.resolve(strict=True), folder.resolve(strict=True)
    except FileNotFoundError:
        raise DynspecError(f"{where}: file {rel!r} does not exist in {folder}") from None
    except (OSError, RuntimeError) as e:        # a link loop
        raise DynspecError(f"{where}: file {rel!r} in {folder} cannot be resolved: {e}") from None
    if not real.is_relative_to(home):
        raise DynspecError(f"{path} is a symbolic link to {real}, outside {folder}; copy the file in instead "
                           f"(a Hugging Face cache snapshot links into its blobs: download with --local-dir, "
                           f"or copy with cp -rL)")
    if not real.is_file():
        raise DynspecError(f"{path} is not a regular file")
    return path


def _loads(path: Path, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DynspecError(f"{path}: not valid JSON: {e}") from None
    except RecursionError:
        raise DynspecError(f"{path}: nested too deeply to be read as JSON") from None


def read_json_file(path: Path):
    try:
        return _loads(path, path.read_text())
    except UnicodeDecodeError as e:
        raise DynspecError(f"{path}: not valid JSON: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise DynspecError(f"{path}: cannot be read: {e.strerror or e}") from None


Stamp = tuple[int, int, int, int]       # (st_dev, st_ino, st_size, st_mtime_ns)


def stamp(path: Path, st: os.stat_result | None = None) -> Stamp:
    st = st or os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def changed(path: Path) -> DynspecError:
    return DynspecError(f"{path}: changed while it was read (size, mtime or inode differ); nothing was "
                        "written, run again on a source that is not being modified")


def open_weights(path: Path, want: Stamp | None = None):
    """Open a weight file; with `want`, it must still be the file recorded then."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DynspecError(f"{path}: cannot be read: {e.strerror or e}") from None
    if want is not None and stamp(path, os.fstat(f.fileno())) != want:
        f.close()
        raise changed(path)
    return f
