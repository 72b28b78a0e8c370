"""pytorch_model.bin weight files (read only where a stage allows them): torch.load(weights_only=True)."""
from __future__ import annotations

from pathlib import Path

from dynspec.errors import DynspecError


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
