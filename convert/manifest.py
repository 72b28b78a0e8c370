"""dynspec.json: what `dynspec convert` checked and computed, stored next to the checkpoint.
`dynspec build` reads these instead of re-parsing convert's flags.

target:  {"format": "dynspec-checkpoint/1", "kind": "target", "architecture": "LlamaForCausalLM",
          "dtype": "bfloat16", "tp": 8, "shape": {...}, "parameter_count": 70553706496,
          "weight_bytes_per_rank": 17640734720, "kv_bytes_per_token_per_rank": 40960, "checks": [...]}
draft:   {"format": "dynspec-checkpoint/1", "kind": "eagle3-draft", "capture_layers": [1, 39, 76], ...}
"""
from __future__ import annotations

from pathlib import Path

from dynspec.artifacts import read_json
from dynspec.checkpoint.shapes import ModelShape
from dynspec.errors import DynspecError

MANIFEST = "dynspec.json"
CHECKPOINT_FORMAT = "dynspec-checkpoint/1"
KINDS = ("target", "eagle3-draft")
REQUIRED = ("dtype", "tp", "shape", "parameter_count", "weight_bytes_per_rank", "kv_bytes_per_token_per_rank")


def read_manifest(folder: str | Path, kind: str) -> dict:
    """The manifest of a converted checkpoint, checked for its kind and required fields."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise DynspecError(
            f"{folder} has no {MANIFEST}; convert it first with `dynspec convert "
            f"{'target' if kind == 'target' else 'eagle3'}`"
        )
    m = read_json(path, "checkpoint manifest")
    if m.get("format") != CHECKPOINT_FORMAT:
        raise DynspecError(f"{path}: field 'format' is {m.get('format')!r}; expected {CHECKPOINT_FORMAT!r}")
    if m.get("kind") != kind:
        raise DynspecError(f"{path}: field 'kind' is {m.get('kind')!r}; expected {kind!r}")
    for key in REQUIRED + (("capture_layers",) if kind == "eagle3-draft" else ()):
        if key not in m:
            raise DynspecError(f"{path}: missing field {key!r}")
    ModelShape.from_json(m["shape"], str(path))
    return m


def manifest_shape(m: dict, where: str = MANIFEST) -> ModelShape:
    return ModelShape.from_json(m["shape"], where)
