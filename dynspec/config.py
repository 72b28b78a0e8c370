"""Frozen values that travel between stages. ENGINE_DIR/engine.json is the one artifact the
runtime, the benchmarks and the Triton generator read; no stage re-parses an earlier one's flags.

engine.json (written by `dynspec build`):
{
  "format": "dynspec-engine/1",
  "target_dir": "../tiny/target",          # relative to ENGINE_DIR, or absolute
  "draft_dir": "../tiny/draft",
  "tp": 8,
  "trtllm_version": "1.2.1",
  "schedule": {"spec": "4:4,8:2", "tiers": [[4, 4], [8, 2]]},
  "trtllm_draft_len_schedule": {"1": 4, "5": 2, "9": 0},
  "max_batch_size": 256,
  "max_seq_len": 4096,
  "reference": {"dtype": "float32", "max_batch_size": 64, "max_seq_len": 1024,
                "keep_warm": true, "cuda_graphs": true},
  "llm_api_options": "llm_api_options.yaml",
  "manifests": {"target": {...}, "draft": {...}},
  "build": {"requested_schedule": ..., "max_num_tokens": ..., "cuda_graph_batch_sizes": [...], "plan": {...}}
}
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from dynspec.artifacts import read_json, write_json
from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule

ENGINE_FORMAT = "dynspec-engine/1"
ENGINE_JSON = "engine.json"
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ReferenceSettings:
    """How the reference engine runs an ENGINE_DIR (CPU default; bf16 + graphs on a GPU)."""

    dtype: str = "float32"
    max_batch_size: int = 64
    max_seq_len: int = 1024
    keep_warm: bool = True
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise DynspecError(f"reference.dtype {self.dtype!r} is not one of {DTYPES}")
        for name in ("max_batch_size", "max_seq_len"):
            if int(getattr(self, name)) < 1:
                raise DynspecError(f"reference.{name}={getattr(self, name)} must be at least 1")


@dataclass(frozen=True)
class EngineConfig:
    target_dir: str
    draft_dir: str
    schedule: DraftSchedule
    tp: int = 8
    trtllm_version: str = "1.2.1"
    max_batch_size: int = 256
    max_seq_len: int = 4096
    reference: ReferenceSettings = field(default_factory=ReferenceSettings)
    llm_api_options: str = "llm_api_options.yaml"
    manifests: Mapping[str, Any] = field(default_factory=dict)
    build: Mapping[str, Any] = field(default_factory=dict)   # `dynspec build` choices + memory plan

    def to_json(self) -> dict:
        d = {"format": ENGINE_FORMAT}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "schedule":
                d["schedule"] = {"spec": v.to_spec(), "tiers": [list(t) for t in v.tiers]}
                d["trtllm_draft_len_schedule"] = (
                    {str(k): x for k, x in v.to_trtllm(self.trtllm_version).items()} if v.tiers else None
                )
            elif f.name == "reference":
                d["reference"] = asdict(v)
            else:
                d[f.name] = dict(v) if isinstance(v, Mapping) else v
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = ENGINE_JSON) -> "EngineConfig":
        if d.get("format") != ENGINE_FORMAT:
            raise DynspecError(f"{where}: field 'format' is {d.get('format')!r}; expected {ENGINE_FORMAT!r}")
        for key in ("target_dir", "draft_dir", "schedule"):
            if key not in d:
                raise DynspecError(f"{where}: missing field {key!r}")
        sched = d["schedule"]
        if not isinstance(sched, Mapping) or "tiers" not in sched:
            raise DynspecError(f"{where}: field 'schedule' must be an object with 'tiers'")
        try:
            schedule = DraftSchedule(tuple(tuple(t) for t in sched["tiers"]))
        except (TypeError, DynspecError) as e:
            raise DynspecError(f"{where}: field 'schedule.tiers': {e}") from e
        known = {f.name for f in fields(cls)}
        extra = set(d) - known - {"format", "trtllm_draft_len_schedule"}
        if extra:
            raise DynspecError(f"{where}: unknown field(s) {sorted(extra)}")
        ref = d.get("reference", {})
        try:
            reference = ReferenceSettings(**ref)
        except TypeError as e:
            raise DynspecError(f"{where}: field 'reference': {e}") from e
        kw = {k: d[k] for k in known if k in d and k not in ("schedule", "reference")}
        return cls(schedule=schedule, reference=reference, **kw)

    # ---- engine-dir I/O ---------------------------------------------------------------
    def write(self, engine_dir: str | os.PathLike) -> Path:
        path = Path(engine_dir) / ENGINE_JSON
        write_json(path, self.to_json())
        return path

    @classmethod
    def load(cls, engine_dir: str | os.PathLike) -> "EngineConfig":
        """Read ENGINE_DIR/engine.json; relative checkpoint paths are resolved against ENGINE_DIR."""
        engine_dir = Path(engine_dir)
        if not engine_dir.is_dir():
            raise DynspecError(f"engine dir {engine_dir} does not exist")
        path = engine_dir / ENGINE_JSON
        cfg = cls.from_json(read_json(path, "engine config"), where=str(path))
        return replace(
            cfg,
            target_dir=str((engine_dir / cfg.target_dir).resolve()),
            draft_dir=str((engine_dir / cfg.draft_dir).resolve()),
        )
