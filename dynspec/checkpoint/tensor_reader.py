"""Tensors of a WeightSource (weight_index) by name, each checked as it is read:
- float8 (any floating dtype of one byte) is refused: source checkpoints are bf16/fp16/fp32, FP8
  weights are made by `dynspec convert target --quant fp8`, and casting FP8 up would hide a
  quantized checkpoint behind full-precision numbers;
- a floating tensor holding NaN or +-Inf is refused. The scan is one sum per tensor as it is
  read (NaN and +-Inf propagate through a sum; no scratch memory); only a non-finite sum, which
  an fp16 overflow can also give, pays for the exact isfinite count. 131M bf16 elements: ~70 ms
  for the sum against ~3.2 s for isfinite on a 2-core CPU.
Each refusal is a DynspecError naming the file and the tensor.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from dynspec.checkpoint.pytorch_bin import load_bin
from dynspec.checkpoint.safetensors_file import StFile
from dynspec.checkpoint.weight_index import WeightSource
from dynspec.errors import DynspecError

if TYPE_CHECKING:
    import torch


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
        self._open: dict[Path, object] = {}   # file -> StFile or loaded state dict

    def _handle(self, path: Path):
        if path not in self._open:
            if self.src.fmt == "pytorch":
                self._open[path] = load_bin(path)
            else:
                self._open[path] = StFile(path, self.src.stamps.get(path))
        return self._open[path]

    def get(self, name: str, index: tuple[slice, ...] | None = None) -> "torch.Tensor":
        """The tensor, or only its part `index` (a TP rank's shard: (slice(0, 32),) rows 0..31,
        (slice(None), slice(64, 128)) columns 64..127). A safetensors file reads just those bytes
        (StSlice); a .bin file is loaded whole and the part copied out of it."""
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
