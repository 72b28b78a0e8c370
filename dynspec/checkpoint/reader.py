"""Read Hugging Face checkpoint folders: config.json and the weights, in one of these layouts

    model.safetensors                                   one file
    *.safetensors + model.safetensors.index.json        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors", ...}}
    *.safetensors, no index                             every file's header says what it holds
    pytorch_model.bin [+ pytorch_model.bin.index.json]  only with allow_bin; torch.load(weights_only=True)

Rules (the same for `dynspec convert` and the reference engine), each broken one a DynspecError
naming the file and the tensor:
- every safetensors header is read when the folder is opened, so a truncated or corrupt shard
  fails before any work, naming the file;
- a tensor name lives in one file: two shards holding the same name are refused, naming both
  (a silent pick of one of them could serve the wrong weights);
- float8 (any floating dtype of one byte) is refused: source checkpoints are bf16/fp16/fp32, FP8
  weights are made by `dynspec convert target --quant fp8`, and casting FP8 up would hide a
  quantized checkpoint behind full-precision numbers;
- a floating tensor holding NaN or +-Inf is refused. The scan is one sum per tensor as it is
  read (NaN and +-Inf propagate through a sum; no scratch memory); only a non-finite sum, which
  an fp16 overflow can also give, pays for the exact isfinite count. 131M bf16 elements: ~70 ms
  for the sum against ~3.2 s for isfinite on a 2-core CPU;
- every file read lies inside the folder: a weight_map entry "../x.safetensors" or "/abs/x", or a
  symbolic link resolving outside the folder, is refused (links inside it are followed);
- config.json fields are type-checked as read (config_fields.check_config), the same for every
  stage.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

from dynspec.checkpoint.config_fields import check_config
from dynspec.errors import DynspecError

if TYPE_CHECKING:
    import torch

ST_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


def _folder(folder: str | Path, what: str) -> Path:
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
        raise DynspecError(f"{path} is a symbolic link to {real}, outside {folder}; copy the file in instead")
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


def read_config(folder: str | Path, what: str = "checkpoint") -> dict:
    """FOLDER/config.json as a dict, its fields type-checked; `what` names the folder in errors."""
    folder = _folder(folder, what)
    if not (folder / "config.json").exists() and not (folder / "config.json").is_symlink():
        raise DynspecError(f"{what} folder {folder} has no config.json")
    path = source_file(folder, "config.json", f"{what} folder {folder}")
    cfg = read_json_file(path)
    if not isinstance(cfg, dict):
        raise DynspecError(f"{path}: must hold a JSON object, not {type(cfg).__name__}")
    check_config(cfg, str(path))
    return cfg


@dataclass(frozen=True)
class WeightSource:
    """Which file holds each tensor of a folder (no tensor is loaded yet)."""
    folder: Path
    fmt: str                          # "safetensors" | "pytorch"
    key_to_file: Mapping[str, Path]

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(sorted(set(self.key_to_file.values())))

    def __len__(self) -> int:
        return len(self.key_to_file)


def safetensors_keys(path: Path) -> list[str]:
    """The tensor names in a safetensors header; a truncated or corrupt file -> DynspecError."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except Exception as e:  # safetensors raises its own error types for short or corrupt files
        raise DynspecError(f"{path}: cannot read weights (truncated or not a safetensors file): {e}") from None


def load_bin(path: Path) -> dict:
    """A pytorch_model.bin state dict, loaded with torch.load(weights_only=True) only."""
    import torch

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses anything but tensors and plain containers
        raise DynspecError(f"{path}: cannot read weights with torch.load(weights_only=True): {e}") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                            for k, v in obj.items()):
        raise DynspecError(f"{path}: cannot read weights: not a state dict (a mapping of tensor names to tensors)")
    return obj


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
    src = WeightSource(folder, fmt, {k: files[f] for k, f in wmap.items()})
    if fmt == "safetensors":
        held = _headers(src.files)
        for name, path in src.key_to_file.items():
            if held.get(name) != path:
                raise DynspecError(f"{path}: does not hold tensor {name!r} that {index_name} puts there")
    return src


def _headers(files) -> dict[str, Path]:
    """name -> file over safetensors files; a name in two files is an error naming both."""
    key_to_file: dict[str, Path] = {}
    for path in files:
        for k in safetensors_keys(path):
            if k in key_to_file:
                raise DynspecError(f"tensor {k!r} appears in both {key_to_file[k]} and {path}")
            key_to_file[k] = path
    return key_to_file


def weight_source(folder: str | Path, what: str = "checkpoint", allow_bin: bool = False) -> WeightSource:
    """Find the weights of an HF folder; pytorch_model.bin only when allow_bin."""
    folder = _folder(folder, what)
    if (folder / ST_INDEX).exists() or (folder / ST_INDEX).is_symlink():
        return _from_index(folder, ST_INDEX, "safetensors")
    files = [source_file(folder, p.name, f"{what} folder {folder}") for p in sorted(folder.glob("*.safetensors"))]
    if files:
        return WeightSource(folder, "safetensors", _headers(files))
    if allow_bin and ((folder / BIN_INDEX).exists() or (folder / BIN_INDEX).is_symlink()):
        return _from_index(folder, BIN_INDEX, "pytorch")
    if allow_bin and ((folder / "pytorch_model.bin").exists() or (folder / "pytorch_model.bin").is_symlink()):
        path = source_file(folder, "pytorch_model.bin", f"{what} folder {folder}")
        return WeightSource(folder, "pytorch", {k: path for k in load_bin(path)})
    expected = f"model.safetensors or {ST_INDEX}" + (f", pytorch_model.bin or {BIN_INDEX}" if allow_bin else "")
    raise DynspecError(f"{what} folder {folder} has no weight files (expected {expected})")


def check_values(name: str, t: "torch.Tensor", path: Path) -> "torch.Tensor":
    """The module's float8 and NaN/Inf rules for one tensor; returns it unchanged."""
    import torch

    if t.is_floating_point() and t.element_size() == 1:
        raise DynspecError(f"{path}: tensor {name!r} is {t.dtype}; source checkpoints must be bf16, fp16 or fp32 "
                           "(FP8 weights come from `dynspec convert target --quant fp8`)")
    if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t.sum())):
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise DynspecError(f"{path}: tensor {name!r} holds {bad} NaN/Inf value(s)")
    return t


class TensorReader:
    """Tensors of a WeightSource by name, each file opened once, each tensor checked as read."""

    def __init__(self, src: WeightSource):
        self.src = src
        self._open: dict[Path, object] = {}   # file -> safe_open handle or loaded state dict

    def _handle(self, path: Path):
        if path not in self._open:
            if self.src.fmt == "pytorch":
                self._open[path] = load_bin(path)
            else:
                from safetensors import safe_open

                try:
                    self._open[path] = safe_open(str(path), framework="pt", device="cpu")
                except Exception as e:
                    raise DynspecError(f"{path}: cannot read weights (truncated or not a safetensors file): "
                                       f"{e}") from None
        return self._open[path]

    def get(self, name: str, index: tuple[slice, ...] | None = None) -> "torch.Tensor":
        """The tensor, or only its part `index` (a TP rank's shard: (slice(0, 32),) rows 0..31,
        (slice(None), slice(64, 128)) columns 64..127). A safetensors file reads just those bytes
        (safe_open's get_slice); a .bin file is loaded whole and the part copied out of it."""
        path = self.src.key_to_file[name]
        h = self._handle(path)
        if isinstance(h, dict):
            if name not in h:
                raise DynspecError(f"{path}: does not hold tensor {name!r} that its index lists")
            t = h[name] if index is None else h[name][index].clone()
        else:
            try:
                t = h.get_tensor(name) if index is None else h.get_slice(name)[index]
            except Exception as e:
                raise DynspecError(f"{path}: cannot read tensor {name!r} (truncated or corrupt file?): {e}") from None
        return check_values(name, t, path)

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape from its file's header (no data read from a safetensors file)."""
        path = self.src.key_to_file[name]
        h = self._handle(path)
        if isinstance(h, dict):
            if name not in h:
                raise DynspecError(f"{path}: does not hold tensor {name!r} that its index lists")
            return tuple(h[name].shape)
        try:
            return tuple(h.get_slice(name).get_shape())
        except Exception as e:
            raise DynspecError(f"{path}: cannot read tensor {name!r} (truncated or corrupt file?): {e}") from None

    def release(self, path: Path) -> None:
        """Drop a file's handle (a loaded .bin frees its memory)."""
        self._open.pop(path, None)


def iter_tensors(src: WeightSource) -> Iterator[tuple[str, "torch.Tensor"]]:
    """(name, tensor) for every tensor, file by file, each file held open only while it is read."""
    reader = TensorReader(src)
    by_file: dict[Path, list[str]] = {}
    for k, f in src.key_to_file.items():
        by_file.setdefault(f, []).append(k)
    for path, keys in sorted(by_file.items()):
        for k in keys:
            yield k, reader.get(k)
        reader.release(path)
