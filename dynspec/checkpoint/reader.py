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
- safetensors files are read with plain reads at the offsets their header gives, never mapped
  into memory, so a file cut short while it is read is an error naming it (a mapped file ends
  the process with SIGBUS); each weight file's size, mtime and inode are recorded when the folder
  is opened, and WeightSource.check_unchanged() names a file rewritten since;
- config.json fields are type-checked as read (config_fields.check_config), the same for every
  stage.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
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


Stamp = tuple[int, int, int, int]       # (st_dev, st_ino, st_size, st_mtime_ns)


def stamp(path: Path, st: os.stat_result | None = None) -> Stamp:
    st = st or os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def changed(path: Path) -> DynspecError:
    return DynspecError(f"{path}: changed while it was read (size, mtime or inode differ); nothing was "
                        "written, run again on a source that is not being modified")


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


ST_DTYPES = {   # safetensors dtype -> (torch dtype name, bytes per element)
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
    "U16": ("uint16", 2), "U32": ("uint32", 4), "U64": ("uint64", 8), "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
}
ST_DTYPES_BY_TORCH = {name: width for name, width in ST_DTYPES.values()}
MAX_HEADER = 100 * 2**20            # safetensors' own bound on the JSON header


@dataclass(frozen=True)
class StEntry:
    dtype: str                        # torch dtype name, "bfloat16"
    shape: tuple[int, ...]
    start: int                        # absolute byte offsets in the file
    end: int


def _bad(path: Path, why: str) -> DynspecError:
    return DynspecError(f"{path}: cannot read weights (truncated or not a safetensors file): {why}")


def _entry(path: Path, name: str, e, data_at: int, size: int) -> StEntry:
    """One header entry {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, checked."""
    if not isinstance(e, dict) or e.get("dtype") not in ST_DTYPES:
        raise _bad(path, f"tensor {name!r} has no known dtype")
    shape, offs = e.get("shape"), e.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise _bad(path, f"tensor {name!r} has shape {shape!r}")
    if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) and not isinstance(o, bool)
                                                              for o in offs) and 0 <= offs[0] <= offs[1]):
        raise _bad(path, f"tensor {name!r} has data_offsets {offs!r}")
    dtype, width = ST_DTYPES[e["dtype"]]
    numel = 1
    for d in shape:
        numel *= d
    if offs[1] - offs[0] != numel * width:
        raise _bad(path, f"tensor {name!r} spans {offs[1] - offs[0]} bytes, its shape {shape} needs {numel * width}")
    if data_at + offs[1] > size:
        raise _bad(path, f"tensor {name!r} ends at byte {data_at + offs[1]}, the file has {size}")
    return StEntry(dtype, tuple(shape), data_at + offs[0], data_at + offs[1])


def read_header(f, path: Path) -> dict[str, StEntry]:
    """The tensors of an open safetensors file: 8-byte little-endian header length, JSON header
    {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the data."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(8)
    n = int.from_bytes(head, "little") if len(head) == 8 else -1
    if not 2 <= n <= min(MAX_HEADER, size - 8):
        raise _bad(path, f"header length {n} does not fit a file of {size} bytes")
    try:
        header = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _bad(path, f"header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    return {k: _entry(path, k, v, 8 + n, size) for k, v in header.items() if k != "__metadata__"}


def _open_weights(path: Path, want: Stamp | None = None):
    """Open a weight file; with `want`, it must still be the file recorded then."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DynspecError(f"{path}: cannot be read: {e.strerror or e}") from None
    if want is not None and stamp(path, os.fstat(f.fileno())) != want:
        f.close()
        raise changed(path)
    return f


def safetensors_keys(path: Path) -> list[str]:
    """The tensor names in a safetensors header; a truncated or corrupt file -> DynspecError."""
    with _open_weights(path) as f:
        return list(read_header(f, path))


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
        with _open_weights(path) as f:
            stamps[path] = stamp(path, os.fstat(f.fileno()))
            keys = read_header(f, path)
        for k in keys:
            if k in key_to_file:
                raise DynspecError(f"tensor {k!r} appears in both {key_to_file[k]} and {path}")
            key_to_file[k] = path
    return key_to_file, stamps


def weight_source(folder: str | Path, what: str = "checkpoint", allow_bin: bool = False) -> WeightSource:
    """Find the weights of an HF folder; pytorch_model.bin only when allow_bin."""
    folder = _folder(folder, what)
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


class _StFile:
    """An open safetensors file with safe_open's reading calls (keys, get_tensor, get_slice),
    read with plain reads at the header's offsets: nothing is mapped into memory."""

    def __init__(self, path: Path, want: Stamp | None):
        self.path = path
        self.f = _open_weights(path, want)
        self.entries = read_header(self.f, path)

    def keys(self) -> list[str]:
        return list(self.entries)

    def read(self, name: str, spans: list[tuple[int, int]]) -> bytearray:
        """The bytes of `spans` [(file offset, length), ...] back to back; a file that ends early
        is a DynspecError naming it."""
        buf = bytearray(sum(n for _, n in spans))
        view, at = memoryview(buf), 0
        for start, n in spans:
            got = 0
            while got < n:
                k = os.preadv(self.f.fileno(), [view[at + got:at + n]], start + got)
                if k == 0:
                    raise DynspecError(f"{self.path}: ended at byte {start + got} while reading tensor {name!r} "
                                       "(truncated while it was read?)")
                got += k
            at += n
        return buf

    def get_tensor(self, name: str) -> "torch.Tensor":
        return self.get_slice(name)[()]

    def get_slice(self, name: str) -> "_StSlice":
        return _StSlice(self, name, self.entries[name])

    def close(self) -> None:
        self.f.close()


class _StSlice:
    """Part of one tensor: rows [a:b] (then all of the rest) or, of a 2-D or wider tensor, rows
    [a:b] x columns [c:d] read as one span per row; any other index reads the tensor and copies
    the part out. [8, 6] fp32, index (slice(None), slice(2, 4)) -> 8 reads of 8 bytes."""

    def __init__(self, file: _StFile, name: str, e: StEntry):
        self.file, self.name, self.e = file, name, e

    def get_shape(self) -> list[int]:
        return list(self.e.shape)

    def __getitem__(self, index) -> "torch.Tensor":
        import torch

        e = self.e
        dtype = getattr(torch, e.dtype)
        index = index if isinstance(index, tuple) else (index,)
        plain = len(index) <= min(2, len(e.shape)) and all(
            isinstance(i, slice) and i.step in (None, 1) for i in index)
        if not plain:
            whole = self[()]
            return whole[index].clone()
        ranges = [i.indices(d)[:2] for i, d in zip(index, e.shape)] + [(0, d) for d in e.shape[len(index):]]
        ranges = [(a, max(a, b)) for a, b in ranges]
        shape = tuple(b - a for a, b in ranges)
        width = ST_DTYPES_BY_TORCH[e.dtype]
        inner = width
        for d in e.shape[2:]:
            inner *= d
        row = inner * (e.shape[1] if len(e.shape) > 1 else 1)           # bytes of one row
        if len(e.shape) < 2 or ranges[1] == (0, e.shape[1]):
            spans = [(e.start + ranges[0][0] * row, shape[0] * row)] if e.shape else [(e.start, width)]
        else:
            (a, b), (c, d) = ranges[:2]
            spans = [(e.start + r * row + c * inner, (d - c) * inner) for r in range(a, b)]
        spans = [sp for sp in spans if sp[1]]
        if not spans:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.file.read(self.name, spans), dtype=dtype).reshape(shape)


class TensorReader:
    """Tensors of a WeightSource by name, each file opened once, each tensor checked as read."""

    def __init__(self, src: WeightSource):
        self.src = src
        self._open: dict[Path, object] = {}   # file -> _StFile or loaded state dict

    def _handle(self, path: Path):
        if path not in self._open:
            if self.src.fmt == "pytorch":
                self._open[path] = load_bin(path)
            else:
                self._open[path] = _StFile(path, self.src.stamps.get(path))
        return self._open[path]

    def get(self, name: str, index: tuple[slice, ...] | None = None) -> "torch.Tensor":
        """The tensor, or only its part `index` (a TP rank's shard: (slice(0, 32),) rows 0..31,
        (slice(None), slice(64, 128)) columns 64..127). A safetensors file reads just those bytes
        (_StSlice); a .bin file is loaded whole and the part copied out of it."""
        path = self.src.key_to_file[name]
        h = self._handle(path)
        if isinstance(h, dict):
            if name not in h:
                raise DynspecError(f"{path}: does not hold tensor {name!r} that its index lists")
            t = h[name] if index is None else h[name][index].clone()
        else:
            try:
                t = h.get_tensor(name) if index is None else h.get_slice(name)[index]
            except DynspecError:
                raise
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
        h = self._open.pop(path, None)
        if hasattr(h, "close"):
            h.close()


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
