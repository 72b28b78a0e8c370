"""Read Hugging Face checkpoint folders: config.json, safetensors (single file or sharded with
model.safetensors.index.json) and, for EAGLE-3 drafts only, pytorch_model.bin (loaded with
torch.load(weights_only=True), never with pickle's full power).

A WeightSource maps every tensor name to the file that holds it, so tensors can be streamed
one at a time:
    model.safetensors.index.json {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", ...}}
    -> WeightSource(key_to_file={"model.embed_tokens.weight": Path(".../model-00001-of-00002.safetensors"), ...})
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

from dynspec.artifacts import read_json
from dynspec.errors import DynspecError

if TYPE_CHECKING:
    import torch

ST_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)


@dataclass(frozen=True)
class WeightSource:
    folder: Path
    fmt: str                          # "safetensors" | "pytorch"
    key_to_file: Mapping[str, Path]

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(sorted(set(self.key_to_file.values())))

    def __len__(self) -> int:
        return len(self.key_to_file)


def read_config(folder: str | Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise DynspecError(f"checkpoint folder {folder} does not exist")
    return read_json(folder / "config.json", "HF config")


def _from_index(folder: Path, index_name: str, fmt: str) -> WeightSource:
    index = read_json(folder / index_name, "weight index")
    wmap = index.get("weight_map")
    if not isinstance(wmap, dict) or not wmap:
        raise DynspecError(f"{folder / index_name}: field 'weight_map' is missing or empty")
    missing = sorted({f for f in wmap.values() if not (folder / f).is_file()})
    if missing:
        example = next(k for k, f in wmap.items() if f == missing[0])
        raise DynspecError(
            f"{folder / index_name}: missing shard {missing[0]} (holds {example!r}"
            + (f" and {len(missing) - 1} more shard(s))" if len(missing) > 1 else ")")
        )
    return WeightSource(folder, fmt, {k: folder / f for k, f in wmap.items()})


def _safetensors_keys(path: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise DynspecError(f"{path} is not a readable safetensors file: {e}") from e


def weight_source(folder: str | Path, allow_bin: bool = False) -> WeightSource:
    """Find the weights of an HF folder; pytorch_model.bin only when allow_bin (EAGLE-3 drafts)."""
    folder = Path(folder)
    if (folder / ST_INDEX).is_file():
        return _from_index(folder, ST_INDEX, "safetensors")
    files = sorted(folder.glob("*.safetensors"))
    if files:
        key_to_file: dict[str, Path] = {}
        for path in files:
            for k in _safetensors_keys(path):
                if k in key_to_file:
                    raise DynspecError(f"tensor {k!r} appears in both {key_to_file[k].name} and {path.name}")
                key_to_file[k] = path
        return WeightSource(folder, "safetensors", key_to_file)
    if allow_bin and (folder / BIN_INDEX).is_file():
        return _from_index(folder, BIN_INDEX, "pytorch")
    if allow_bin and (folder / "pytorch_model.bin").is_file():
        path = folder / "pytorch_model.bin"
        return WeightSource(folder, "pytorch", {k: path for k in _load_bin(path)})
    expected = "model.safetensors or " + ST_INDEX + (" or pytorch_model.bin" if allow_bin else "")
    raise DynspecError(f"no weights in {folder}: expected {expected}")


def _load_bin(path: Path) -> dict:
    import torch

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses anything but tensors and plain containers
        raise DynspecError(f"{path} cannot be loaded with torch.load(weights_only=True): {e}") from e
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise DynspecError(f"{path} does not hold a state dict (a mapping of tensor names to tensors)")
    return obj


def iter_tensors(src: WeightSource) -> Iterator[tuple[str, "torch.Tensor"]]:
    """(name, tensor) for every tensor, opening each file once, in file order."""
    by_file: dict[Path, list[str]] = {}
    for k, f in src.key_to_file.items():
        by_file.setdefault(f, []).append(k)
    for path, keys in sorted(by_file.items()):
        if src.fmt == "pytorch":
            sd = _load_bin(path)
            for k in keys:
                if k not in sd:
                    raise DynspecError(f"{path.name} does not hold tensor {k!r} that its index lists")
                yield k, sd[k]
            continue
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            present = set(f.keys())
            for k in keys:
                if k not in present:
                    raise DynspecError(f"{path.name} does not hold tensor {k!r} that {ST_INDEX} lists")
                yield k, f.get_tensor(k)


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied
