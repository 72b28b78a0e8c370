"""Which file of a Hugging Face checkpoint folder holds each tensor, in one of these layouts

    model.safetensors                                   one file
    *.safetensors + model.safetensors.index.json        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors", ...}}
    *.safetensors, no index                             every file's header says what it holds
    pytorch_model.bin [+ pytorch_model.bin.index.json]  only with allow_bin; torch.load(weights_only=True)

- every safetensors header is read when the folder is opened, so a truncated or corrupt shard
  fails before any work, naming the file;
- a tensor name lives in one file: two shards holding the same name are refused, naming both
  (a silent pick of one of them could serve the wrong weights);
- each weight file's size, mtime and inode are recorded when the folder is opened, and
  WeightSource.check_unchanged() names a file rewritten since.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from dynspec.checkpoint.folder_files import (Stamp, changed, open_weights, read_json_file, source_file,
                                             source_folder, stamp)
from dynspec.checkpoint.pytorch_bin import load_bin
from dynspec.checkpoint.safetensors_file import read_header
from dynspec.errors import DynspecError

ST_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


@dataclass(frozen=True)
class WeightSource:
    """Which file holds each tensor of a folder (no tensor is loaded yet)."""
    folder: Path
    fmt: str                          # "safetensors" | "pytorch"
    key_to_file: Mapping[str, Path]
    stamps: Mapping[Path, Stamp] = field(default_factory=dict)   # each file as it was when opened

    def check_unchanged(self) -> None:
        """DynspecError naming the first weight file whose size, mtime or inode changed since."""
        for path, was in self.stamps.items():
            try:
                now = stamp(path)
            except OSError:
                now = None
            if now != was:
                raise changed(path)

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(sorted(set(self.key_to_file.values())))

    def __len__(self) -> int:
        return len(self.key_to_file)


def _from_index(folder: Path, index_name: str, fmt: str) -> WeightSource:
    index = source_file(folder, index_name, f"folder {folder}")
    obj = read_json_file(index)
    wmap = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wmap, dict) or not wmap or not all(isinstance(f, str) for f in wmap.values()):
        raise DynspecError(f"{index}: field 'weight_map' is missing, empty or not a mapping of names to files")
    files: dict[str, Path] = {}
    for name, shard in wmap.items():
        if shard not in files:
            p = folder / shard
            if not Path(shard).is_absolute() and not p.exists() and not p.is_symlink():
                raise DynspecError(f"{index}: missing shard {shard} (holds {name!r}): it does not exist in {folder}")
            files[shard] = source_file(folder, shard, str(index))
    key_to_file = {k: files[f] for k, f in wmap.items()}
    if fmt == "pytorch":
        return WeightSource(folder, fmt, key_to_file, {p: stamp(p) for p in set(files.values())})
    held, stamps = _headers(sorted(set(files.values())))
    for name, path in key_to_file.items():
        if held.get(name) != path:
            raise DynspecError(f"{path}: does not hold tensor {name!r} that {index_name} puts there")
    return WeightSource(folder, fmt, key_to_file, stamps)


def _headers(files) -> tuple[dict[str, Path], dict[Path, Stamp]]:
    """(name -> file, file -> stamp) over safetensors files; a name in two files is an error naming both."""
    key_to_file: dict[str, Path] = {}
    stamps: dict[Path, Stamp] = {}
    for path in files:
        with open_weights(path) as f:
            stamps[path] = stamp(path, os.fstat(f.fileno()))
            keys = read_header(f, path)
        for k in keys:
            if k in key_to_file:
                raise DynspecError(f"tensor {k!r} appears in both {key_to_file[k]} and {path}")
            key_to_file[k] = path
    return key_to_file, stamps


def weight_source(folder: str | Path, what: str = "checkpoint", allow_bin: bool = False) -> WeightSource:
    """Find the weights of an HF folder; pytorch_model.bin only when allow_bin."""
    folder = source_folder(folder, what)
    if (folder / ST_INDEX).exists() or (folder / ST_INDEX).is_symlink():
        return _from_index(folder, ST_INDEX, "safetensors")
    files = [source_file(folder, p.name, f"{what} folder {folder}") for p in sorted(folder.glob("*.safetensors"))]
    if files:
        return WeightSource(folder, "safetensors", *_headers(files))
    if allow_bin and ((folder / BIN_INDEX).exists() or (folder / BIN_INDEX).is_symlink()):
        return _from_index(folder, BIN_INDEX, "pytorch")
    if allow_bin and ((folder / "pytorch_model.bin").exists() or (folder / "pytorch_model.bin").is_symlink()):
        path = source_file(folder, "pytorch_model.bin", f"{what} folder {folder}")
        was = stamp(path)
        return WeightSource(folder, "pytorch", {k: path for k in load_bin(path)}, {path: was})
    expected = f"model.safetensors or {ST_INDEX}" + (f", pytorch_model.bin or {BIN_INDEX}" if allow_bin else "")
    raise DynspecError(f"{what} folder {folder} has no weight files (expected {expected})")
