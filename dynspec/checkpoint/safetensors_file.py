"""Safetensors weight files: the header, checked entry by entry, and the tensors read with plain
reads at the offsets the header gives.

- every header entry is checked as the header is read (a known dtype, a shape of non-negative
  ints, data_offsets spanning exactly shape x dtype width and ending inside the file), so a
  truncated or corrupt file is an error naming it;
- files are never mapped into memory, so a file cut short while it is read is an error naming it
  (a mapped file ends the process with SIGBUS).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dynspec.checkpoint.folder_files import Stamp, open_weights
from dynspec.errors import DynspecError

if TYPE_CHECKING:
    import torch

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


def safetensors_keys(path: Path) -> list[str]:
    """The tensor names in a safetensors header; a truncated or corrupt file -> DynspecError."""
    with open_weights(path) as f:
        return list(read_header(f, path))


class StFile:
    """An open safetensors file with safe_open's reading calls (keys, get_tensor, get_slice),
    read with plain reads at the header's offsets: nothing is mapped into memory."""

    def __init__(self, path: Path, want: Stamp | None):
        self.path = path
        self.f = open_weights(path, want)
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

    def get_slice(self, name: str) -> "StSlice":
        return StSlice(self, name, self.entries[name])

    def close(self) -> None:
        self.f.close()


class StSlice:
    """Part of one tensor: rows [a:b] (then all of the rest) or, of a 2-D or wider tensor, rows
    [a:b] x columns [c:d] read as one span per row; any other index reads the tensor and copies
    the part out. [8, 6] fp32, index (slice(None), slice(2, 4)) -> 8 reads of 8 bytes."""

    def __init__(self, file: StFile, name: str, e: StEntry):
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
