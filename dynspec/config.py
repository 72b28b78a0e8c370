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
                "draft_sync": "lazy", "max_num_tokens": 8192, "graphs": "full", "overlap": "auto"},
  "llm_api_options": "llm_api_options.yaml",
  "policy": "schedule",                    # or "adaptive": K from cost_model.json + measured acceptance,
                                           # or "per-request": each row's own K (runtime/policy/per_request.py)
  "cost_model": "cost_model.json",         # relative to ENGINE_DIR; read only when policy is not "schedule"
  "ttft_weight": null,                     # a cost-model policy's weight of a prompt its step ends (a number
                                           # >= 0; null: the policy's default, runtime/policy/prefill_price.py)
  "prefill_k": null,                       # policy "schedule": K at most this (an integer, or tiers "37:1") on a
                                           # step that ends a prompt's prefill (runtime/policy/prefill_cap.py;
                                           # null: the schedule's K)
  "manifests": {"target": {...}, "draft": {...}},
  "build": {"requested_schedule": ..., "max_num_tokens": ..., "cuda_graph_batch_sizes": [...], "plan": {...}}
}

max_num_tokens (TRT-LLM's name): the most tokens one iteration may feed the target, decode rows
(K+1 each) plus prompt chunks. It lives in two places, as max_batch_size and max_seq_len do:
  - reference.max_num_tokens: the reference engine's budget (default 8192); `dynspec build
    --max-num-tokens N` and `dynspec generate --max-num-tokens N` set it.
  - llm_api_options.yaml `max_num_tokens` (copied to build.max_num_tokens): TRT-LLM's; `build
    --max-num-tokens N` sets it to N, else max(8192, the largest decode iteration).
It must hold one verify window: max_num_tokens >= max K + 1 (e.g. schedule 4:4 -> at least 5).

reference.graphs (GraphMode): "full" replays CUDA graphs for pure-decode and mixed iterations on
CUDA; "eager" runs every step eagerly (the same kernels). CPU always runs eagerly.

reference.draft_sync ("lazy", the default, "warm" or "off"; docs/design.md, "Draft sync"): what
the draft does while a row runs at K=0. lazy: nothing but keep the target's captured features; the
row's draft K/V is caught up when it drafts again. warm: extend the draft's K/V every K=0 step.
off: nothing; only the draft head is rebuilt when K resumes. An older engine.json's
"keep_warm": true / false reads as "warm" / "off".

reference.overlap (true, false or "auto", the default: true on CUDA, false elsewhere): the
executor's overlapped loop (Executor(loop=Loop.OVERLAPPED), runtime/serving/loop.py serving_loop;
docs/design.md, "The overlapped loop"):
iteration i+1 is planned and launched while iteration i runs. Each request's cache then holds two
verify windows past its last token instead of one. The serial loop stays the CPU's and the oracle.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from dynspec.artifacts import read_json, write_json
from dynspec.errors import DynspecError
from dynspec.runtime.serving.loop import Loop, serving_loop
from dynspec.runtime.serving.plan import DRAFT_SYNCS
from dynspec.runtime.policy import MAX_BATCH_SIZE, SERVED_POLICIES, DraftSchedule

ENGINE_FORMAT = "dynspec-engine/1"
ENGINE_JSON = "engine.json"
DTYPES = ("float32", "bfloat16", "float16", "float64")   # float64: CPU exactness tests only
DEFAULT_MAX_NUM_TOKENS = 8192   # TRT-LLM's default
MAX_TP = 1024                   # ranks per replica
MAX_ENGINE_JSON_BYTES = 64 * 2**20   # engine.json with both manifests is a few kB
STR_FIELDS = ("target_dir", "draft_dir", "trtllm_version", "llm_api_options", "cost_model")
POLICIES = SERVED_POLICIES      # engine.json's `policy`: the served names of runtime/policy/__init__.py POLICIES
COST_MODEL_JSON = "cost_model.json"
INT_FIELDS = ("tp", "max_batch_size", "max_seq_len")
MAP_FIELDS = ("manifests", "build")


class GraphMode(str, Enum):
    """How the reference engine runs its steps on CUDA (docs/design.md, "CUDA graphs")."""
    FULL = "full"        # pure decode and mixed iterations replay captured graphs
    EAGER = "eager"      # every step eagerly


# keys engine.json files of earlier builds carry; one of them means the file needs a rebuild
RETIRED_REFERENCE_KEYS = ("cuda_graphs", "mixed_graphs", "whole_mixed_graphs", "triton_kernels", "split_graphs",
                          "fused_rope")


@dataclass(frozen=True)
class ReferenceSettings:
    """How the reference engine runs an ENGINE_DIR (CPU default; bf16 + graphs on a GPU)."""

    dtype: str = "float32"
    max_batch_size: int = 64
    max_seq_len: int = 1024
    draft_sync: str = "lazy"       # "lazy" | "warm" | "off" (module docstring)
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS   # tokens per iteration: decode rows x (K+1) + prompt chunks
    graphs: GraphMode = GraphMode.FULL
    overlap: bool | str = "auto"   # the executor's overlapped loop: true, false, "auto" (module docstring)

    def loop(self, device) -> Loop:
        """The executor's loop on `device` (runtime/serving/loop.py serving_loop): "auto" -> OVERLAPPED on
        CUDA, SERIAL elsewhere; true / false pin it."""
        return serving_loop(device, self.overlap)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise DynspecError(f"reference.dtype {self.dtype!r} is not one of {DTYPES}")
        for name in ("max_batch_size", "max_seq_len", "max_num_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise DynspecError(f"reference.{name}={v!r} must be an integer of at least 1")
        if self.draft_sync not in DRAFT_SYNCS:
            raise DynspecError(f"reference.draft_sync={self.draft_sync!r} must be one of "
                               f"{', '.join(repr(m) for m in DRAFT_SYNCS)}")
        if not isinstance(self.overlap, bool) and self.overlap != "auto":
            raise DynspecError(f"reference.overlap={self.overlap!r} must be true, false or \"auto\"")
        try:
            object.__setattr__(self, "graphs", GraphMode(self.graphs))
        except ValueError:
            raise DynspecError(f"reference.graphs={self.graphs!r} is not one of "
                               f"{[m.value for m in GraphMode]}") from None

    @property
    def keep_warm(self) -> bool:
        """The K=0 steps extend the draft's K/V (draft_sync "warm")."""
        return self.draft_sync == "warm"

    def to_json(self) -> dict:
        return dict(asdict(self), graphs=self.graphs.value)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> "ReferenceSettings":
        if not isinstance(d, Mapping):
            raise DynspecError(f"{where}: field 'reference' must be an object")
        retired = [k for k in RETIRED_REFERENCE_KEYS if k in d]
        if retired:
            raise DynspecError(f"{where}: field 'reference.{retired[0]}' is retired (the engine has one path "
                               f"per step, chosen by reference.graphs); rebuild the engine dir with `dynspec build`")
        if "keep_warm" in d:                   # an older engine.json: keep_warm true / false
            warm = d["keep_warm"]
            if not isinstance(warm, bool):
                raise DynspecError(f"{where}: field 'reference.keep_warm'={warm!r} must be true or false "
                                   f"(or give reference.draft_sync: 'lazy', 'warm' or 'off')")
            if "draft_sync" in d:
                raise DynspecError(f"{where}: fields 'reference.keep_warm' and 'reference.draft_sync' are both "
                                   f"given; keep draft_sync")
            d = {**{k: v for k, v in d.items() if k != "keep_warm"}, "draft_sync": "warm" if warm else "off"}
        try:
            return cls(**d)
        except TypeError as e:
            raise DynspecError(f"{where}: field 'reference': {e}") from e
        except DynspecError as e:
            raise DynspecError(f"{where}: {e}") from e


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
    policy: str = "schedule"
    cost_model: str = COST_MODEL_JSON
    ttft_weight: float | None = None
    prefill_k: int | str | None = None     # a K, or tiers '37:1' (prefill_cap.parse_cap)
    manifests: Mapping[str, Any] = field(default_factory=dict)
    build: Mapping[str, Any] = field(default_factory=dict)   # `dynspec build` choices + memory plan

    def __post_init__(self) -> None:
        for name in STR_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise DynspecError(f"field {name!r} is {v!r}; it must be a non-empty string")
        for name in INT_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise DynspecError(f"field {name!r} is {v!r}; it must be an integer, not {type(v).__name__}")
            if v < 1:
                raise DynspecError(f"field {name!r} is {v}; it must be at least 1")
        if self.policy not in POLICIES:
            raise DynspecError(f"field 'policy' is {self.policy!r}; it must be one of {list(POLICIES)}")
        w = self.ttft_weight
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < float("inf")):
            raise DynspecError(f"field 'ttft_weight' is {w!r}; it must be a number >= 0 or null")
        pk = self.prefill_k
        if pk is not None:
            from dynspec.runtime.policy.prefill_cap import parse_cap

            if isinstance(pk, bool) or not isinstance(pk, (int, str)) or isinstance(pk, str) and (
                    pk.strip().startswith("@") or pk.strip().lstrip("-").isdigit()):
                raise DynspecError(f"field 'prefill_k' is {pk!r}; it must be an integer K >= 0, tiers like '37:1',"
                                   " or null")
            parse_cap(pk, "field 'prefill_k'")
        if pk is not None and self.policy != "schedule":
            raise DynspecError(f"field 'prefill_k' caps a schedule's K; policy {self.policy!r} weighs the prompt by "
                               f"'ttft_weight' instead")
        if self.tp > MAX_TP:
            raise DynspecError(f"field 'tp' is {self.tp}; one replica spans at most {MAX_TP} ranks")
        if self.max_batch_size > MAX_BATCH_SIZE:
            raise DynspecError(f"field 'max_batch_size' is {self.max_batch_size}; the limit is {MAX_BATCH_SIZE}")
        for name in MAP_FIELDS:
            if not isinstance(getattr(self, name), Mapping):
                raise DynspecError(f"field {name!r} must be an object, not {getattr(self, name)!r}")
        if not isinstance(self.reference, ReferenceSettings):
            raise DynspecError(f"field 'reference' must be an object, not {self.reference!r}")
        if self.reference.max_batch_size > self.max_batch_size:
            raise DynspecError(
                f"reference.max_batch_size {self.reference.max_batch_size} exceeds max_batch_size "
                f"{self.max_batch_size}: the engine dir's one batch limit (docs/design.md, \"Limits\")")
        window = self.schedule.max_draft_len + 1
        if self.reference.max_num_tokens < window:
            raise DynspecError(
                f"reference.max_num_tokens={self.reference.max_num_tokens} is smaller than one verify window "
                f"(max K + 1 = {window}) of schedule {self.schedule.to_spec()!r}")

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
                d["reference"] = v.to_json()
            else:
                d[f.name] = dict(v) if isinstance(v, Mapping) else v
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = ENGINE_JSON) -> "EngineConfig":
        """engine.json's object -> EngineConfig; every field type-checked (ints are ints, not
        bools or strings, and positive; strings are strings; objects are objects), each error
        one line naming `where` and the field: `"tp": "8"` -> "...: field 'tp' is '8'; ..."."""
        if not isinstance(d, Mapping):
            raise DynspecError(f"{where}: must hold a JSON object, not {type(d).__name__}")
        try:
            return cls._from_json(d, where)
        except DynspecError as e:
            msg = str(e)
            raise DynspecError(msg if msg.startswith(f"{where}:") else f"{where}: {msg}") from None

    @classmethod
    def _from_json(cls, d: Mapping[str, Any], where: str) -> "EngineConfig":
        if d.get("format") != ENGINE_FORMAT:
            raise DynspecError(f"{where}: field 'format' is {d.get('format')!r}; expected {ENGINE_FORMAT!r}")
        for key in ("target_dir", "draft_dir", "schedule"):
            if key not in d:
                raise DynspecError(f"{where}: missing field {key!r}")
        sched = d["schedule"]
        if not isinstance(sched, Mapping) or "tiers" not in sched:
            raise DynspecError(f"{where}: field 'schedule' must be an object with 'tiers'")
        tiers = sched["tiers"]
        if not isinstance(tiers, list) or not all(isinstance(t, list) for t in tiers):
            raise DynspecError(f"{where}: field 'schedule.tiers' must be a list of [max_batch, K] pairs, not {tiers!r}")
        try:
            schedule = DraftSchedule(tuple(tuple(t) for t in tiers))
        except (TypeError, DynspecError) as e:
            raise DynspecError(f"{where}: field 'schedule.tiers': {e}") from e
        known = {f.name for f in fields(cls)}
        extra = set(d) - known - {"format", "trtllm_draft_len_schedule"}
        if extra:
            raise DynspecError(f"{where}: unknown field(s) {sorted(extra)}")
        reference = ReferenceSettings.from_json(d.get("reference", {}), where)
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
        cfg = cls.from_json(read_engine_json(path), where=str(path))
        cfg = replace(
            cfg,
            target_dir=str((engine_dir / cfg.target_dir).resolve()),
            draft_dir=str((engine_dir / cfg.draft_dir).resolve()),
            cost_model=str((engine_dir / cfg.cost_model).resolve()),
        )
        if cfg.policy != "schedule" and not Path(cfg.cost_model).is_file():
            raise DynspecError(f"{path}: field 'policy' is '{cfg.policy}' but its cost model {cfg.cost_model} does not "
                               f"exist; write it with `dynspec profile --context-lens ... --out {cfg.cost_model}`")
        return cfg


def read_engine_json(path: Path) -> dict:
    """ENGINE_DIR/engine.json's object: a file over MAX_ENGINE_JSON_BYTES, or one nested too deep
    for Python's parser (`[[[[...]]]]` 100,000 deep), is one line, not a traceback."""
    if path.is_file() and path.stat().st_size > MAX_ENGINE_JSON_BYTES:
        raise DynspecError(f"engine config {path} is {path.stat().st_size} bytes; an engine.json holds at most "
                           f"{MAX_ENGINE_JSON_BYTES}")
    try:
        return read_json(path, "engine config")
    except RecursionError:
        raise DynspecError(f"engine config {path} is nested too deeply to be an engine.json") from None


def check_batch_limit(flag: str, asked: int, cfg: EngineConfig, engine_dir: str | os.PathLike,
                      engine: str = "reference") -> None:
    """One max batch size per engine dir: the reference engine never runs more rows than
    reference.max_batch_size (which is at most max_batch_size), TensorRT-LLM never more than
    max_batch_size; a command asking for more is refused, naming both numbers.
    check_batch_limit("--concurrency", 16, <engine built with --max-batch-size 8>, "E") ->
    "--concurrency 16 exceeds the max batch size 8 of engine dir E (engine.json reference.max_batch_size) ..."."""
    field, limit = (("max_batch_size", cfg.max_batch_size) if engine == "trtllm" else
                    ("reference.max_batch_size", cfg.reference.max_batch_size))
    if asked > limit:
        raise DynspecError(
            f"{flag} {asked} exceeds the max batch size {limit} of engine dir {engine_dir} (engine.json {field});"
            f" give at most {limit}, or rebuild the engine dir with a larger one")
