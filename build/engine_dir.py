"""`dynspec build`: two converted checkpoints + a schedule -> ENGINE_DIR, all or nothing.

ENGINE_DIR/
    llm_api_options.yaml              TRT-LLM LLM-API options (see llm_api.py)
    engine.json                       EngineConfig: every choice, both manifests, reference settings
    build_baseline_trt_engine.sh      only with --baseline-trt-engine
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from dynspec.artifacts import atomic_dir
from dynspec.build.baseline import SCRIPT, BaselineSpec, baseline_script
from dynspec.build.llm_api import LlmApiSettings, decode_tokens, render_options, to_yaml
from dynspec.build.plan import GB, MemoryPlan, memory_plan
from dynspec.build.trap import floor_schedule, trap_warning
from dynspec.build.validate import validate_options
from dynspec.config import COST_MODEL_JSON, EngineConfig, ReferenceSettings
from dynspec.convert.manifest import manifest_shape, read_manifest
from dynspec.errors import DynspecError
from dynspec.runtime.engines.trtllm_options import OPTIONS_FILE
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.policy.prefill_cap import json_form, parse_cap

DEFAULT_MAX_SEQ_LEN = 4096


@dataclass(frozen=True)
class BuildRequest:
    target: str
    draft: str
    schedule: DraftSchedule
    tp: int = 8
    trtllm_version: str = "1.2.1"
    max_batch_size: int = 256
    max_seq_len: int | None = None        # default: min(4096, target max_position_embeddings)
    kv_cache_fraction: float = 0.9
    min_draft_len: int = 0
    gpu_mem_gb: float = 141.0
    baseline: bool = False
    reference_dtype: str = "float32"            # how the reference engine runs this ENGINE_DIR
    reference_max_batch_size: int | None = None  # default: min(64, max_batch_size)
    reference_max_seq_len: int | None = None     # default: min(1024, max_seq_len)
    max_num_tokens: int | None = None            # tokens per iteration (TRT-LLM + reference); see config.py
    cost_model: str | None = None                # a `dynspec profile` JSON: policy "adaptive" (reference engine)
    ttft_weight: float | None = None             # the adaptive policy's prompt weight (None: its default)
    prefill_k: int | str | None = None           # the schedule's cap on a step that ends a prefill: K or tiers
                                                 # (prefill_cap.parse_cap; None: uncapped)


@dataclass(frozen=True)
class BuildPlan:
    schedule: DraftSchedule               # after the --min-draft-len floor
    options: dict
    plan: MemoryPlan
    warnings: tuple[str, ...]
    target_manifest: dict
    draft_manifest: dict
    max_seq_len: int


def _check_pair(tm: dict, dm: dict, req: BuildRequest) -> None:
    if tm["tp"] != req.tp or dm["tp"] != req.tp:
        raise DynspecError(
            f"--tp {req.tp}, but the target was converted for tp={tm['tp']} and the draft for tp={dm['tp']}; "
            "re-run `dynspec convert` with the same --tp"
        )
    ts, seen = manifest_shape(tm), dm.get("target", {})
    for field, have in (("layers", ts.layers), ("hidden_size", ts.hidden), ("vocab_size", ts.vocab)):
        if seen.get(field) != have:
            raise DynspecError(
                f"the draft in {req.draft} was converted against a target with {field}={seen.get(field)}; "
                f"{req.target} has {field}={have}"
            )


def _check_flags(req: BuildRequest) -> None:
    """Bounds that need no checkpoint: each error names the flag and its value."""
    for flag, v in (("--max-batch-size", req.max_batch_size), ("--tp", req.tp), ("--max-seq-len", req.max_seq_len),
                    ("--reference-max-batch-size", req.reference_max_batch_size),
                    ("--reference-max-seq-len", req.reference_max_seq_len), ("--max-num-tokens", req.max_num_tokens)):
        if v is not None and v < 1:
            raise DynspecError(f"{flag} {v} must be at least 1")
    if req.min_draft_len < 0:
        raise DynspecError(f"--min-draft-len {req.min_draft_len} must be at least 0")
    if not (math.isfinite(req.gpu_mem_gb) and req.gpu_mem_gb > 0):
        raise DynspecError(f"--gpu-mem-gb {req.gpu_mem_gb} must be a positive number of GB")
    if not (math.isfinite(req.kv_cache_fraction) and 0 < req.kv_cache_fraction <= 1):
        raise DynspecError(f"--kv-cache-fraction {req.kv_cache_fraction} must be in (0, 1]")
    rb = req.reference_max_batch_size
    if rb is not None and rb > req.max_batch_size:
        raise DynspecError(f"--reference-max-batch-size {rb} exceeds --max-batch-size {req.max_batch_size}")
    if not req.schedule.tiers:
        raise DynspecError("the schedule never speculates (K=0 everywhere); there is nothing for the draft to do")
    if req.prefill_k is not None:
        parse_cap(req.prefill_k)
        if req.cost_model:
            raise DynspecError(f"--prefill-k {req.prefill_k} caps a schedule's K; with --cost-model the adaptive"
                               " policy weighs the prompt by --ttft-weight")


def plan_build(req: BuildRequest) -> BuildPlan:
    """Read both manifests, floor and render the schedule, validate it, plan memory. No writes."""
    _check_flags(req)
    tm = read_manifest(req.target, "target")
    dm = read_manifest(req.draft, "eagle3-draft")
    _check_pair(tm, dm, req)
    ts = manifest_shape(tm)
    max_seq_len = req.max_seq_len or min(DEFAULT_MAX_SEQ_LEN, ts.max_position_embeddings)
    for flag, v in (("--max-seq-len", max_seq_len), ("--reference-max-seq-len", req.reference_max_seq_len)):
        if v is not None and v > ts.max_position_embeddings:
            raise DynspecError(f"{flag} {v} exceeds the target's max_position_embeddings {ts.max_position_embeddings}")
    schedule = floor_schedule(req.schedule, req.min_draft_len, req.max_batch_size)
    window = schedule.max_draft_len + 1
    if req.max_num_tokens is not None and req.max_num_tokens < window:
        raise DynspecError(f"--max-num-tokens {req.max_num_tokens} is smaller than one verify window: "
                           f"max K + 1 = {window} for schedule {schedule.to_spec()!r}")
    if req.cost_model:                    # the adaptive policy picks only K the engine is built for
        from dynspec.runtime.policy.cost_model import CostModel

        CostModel.load(req.cost_model, schedule.max_draft_len, f"--schedule {schedule.to_spec()}")
    warning = trap_warning(req.trtllm_version, schedule, req.max_batch_size)
    settings = LlmApiSettings(req.tp, req.trtllm_version, req.max_batch_size, max_seq_len, req.kv_cache_fraction,
                              req.max_num_tokens)
    options = render_options(str(Path(req.target).resolve()), str(Path(req.draft).resolve()), schedule,
                             dm["capture_layers"], settings)
    validate_options(options, req.trtllm_version)
    plan = memory_plan(
        target=ts, tp=req.tp, dtype=tm["dtype"], target_weight_bytes=tm["weight_bytes_per_rank"],
        draft_weight_bytes=dm["weight_bytes_per_rank"],
        kv_bytes_per_token=tm["kv_bytes_per_token_per_rank"] + dm["kv_bytes_per_token_per_rank"],
        graph_tokens=decode_tokens(schedule, req.max_batch_size, req.trtllm_version),
        gpu_bytes=int(req.gpu_mem_gb * GB), kv_fraction=req.kv_cache_fraction,
        max_seq_len=max_seq_len, max_batch_size=req.max_batch_size,
    )
    capped = (f"warning: --prefill-k {req.prefill_k} is the reference engine's (engine.json prefill_k); TensorRT-LLM's "
              f"draft_len_schedule reads the batch size alone" if req.prefill_k is not None else None)
    warnings = (warning, budget_warning(schedule, req.max_batch_size, options["max_num_tokens"], req.trtllm_version),
                capped)
    return BuildPlan(schedule, options, plan, tuple(w for w in warnings if w), tm, dm, max_seq_len)


def budget_warning(schedule: DraftSchedule, max_batch_size: int, max_num_tokens: int, version: str) -> str | None:
    """A budget smaller than the largest decode iteration caps K (or admission) at large b.
    "4:4", max batch 64, budget 16: b=4 needs 4 * (4+1) = 20 > 16."""
    need = decode_tokens(schedule, max_batch_size, version)
    if need <= max_num_tokens:
        return None
    return (f"warning: max_num_tokens {max_num_tokens} is below the largest decode iteration ({need} tokens: "
            f"b x (K+1) up to max_batch_size {max_batch_size}); K is capped where b x (K+1) does not fit")


def options_file(engine_dir: str | os.PathLike, cfg: EngineConfig) -> Path:
    """ENGINE_DIR/<engine.json llm_api_options>, which must exist: TRT-LLM's max_num_tokens and
    kv_cache_config live only there, so nothing is rendered without it."""
    path = Path(engine_dir) / cfg.llm_api_options
    if not path.is_file():
        raise DynspecError(f"{path} (engine.json field 'llm_api_options') does not exist; it holds TRT-LLM's "
                           f"max_num_tokens and kv_cache_config: rebuild the engine dir with `dynspec build`")
    return path


def _rel(path: str, start: Path) -> str:
    """path relative to start when both are on one filesystem root, else absolute."""
    p = Path(path).resolve()
    try:
        return os.path.relpath(p, start)
    except ValueError:  # e.g. different drives
        return str(p)


def engine_config(req: BuildRequest, bp: BuildPlan, out: Path) -> EngineConfig:
    out = out.resolve()
    build = {
        "requested_schedule": req.schedule.to_spec(),
        "min_draft_len": req.min_draft_len,
        "kv_cache_fraction": req.kv_cache_fraction,
        "max_num_tokens": bp.options["max_num_tokens"],
        "cuda_graph_batch_sizes": bp.options["cuda_graph_config"]["batch_sizes"],
        "capture_layers": bp.draft_manifest["capture_layers"],
        "gpu_mem_gb": req.gpu_mem_gb,
        "memory_plan": asdict(bp.plan),
        "warnings": list(bp.warnings),
        "baseline_script": SCRIPT if req.baseline else None,
    }
    return EngineConfig(
        target_dir=_rel(req.target, out),
        draft_dir=_rel(req.draft, out),
        schedule=bp.schedule,
        tp=req.tp,
        trtllm_version=req.trtllm_version,
        max_batch_size=req.max_batch_size,
        max_seq_len=bp.max_seq_len,
        reference=ReferenceSettings(
            dtype=req.reference_dtype,
            max_batch_size=req.reference_max_batch_size or min(64, req.max_batch_size),
            max_seq_len=req.reference_max_seq_len or min(1024, bp.max_seq_len),
            max_num_tokens=req.max_num_tokens or ReferenceSettings.max_num_tokens,
        ),
        llm_api_options=OPTIONS_FILE,
        policy="adaptive" if req.cost_model else "schedule",
        ttft_weight=req.ttft_weight,
        prefill_k=None if req.prefill_k is None else json_form(parse_cap(req.prefill_k)),
        manifests={"target": bp.target_manifest, "draft": bp.draft_manifest},
        build=build,
    )


def write_engine_dir(req: BuildRequest, bp: BuildPlan, out: str | os.PathLike, force: bool = False) -> EngineConfig:
    out = Path(out)
    cfg = engine_config(req, bp, out)
    cost = None
    if req.cost_model:                    # read and checked before anything is written
        from dynspec.runtime.policy.cost_model import CostModel

        CostModel.load(req.cost_model)
        cost = Path(req.cost_model).read_bytes()
    with atomic_dir(out, force=force, inputs={"--target": req.target, "--draft": req.draft}) as tmp:
        (tmp / OPTIONS_FILE).write_text(to_yaml(bp.options))
        if cost is not None:
            (tmp / COST_MODEL_JSON).write_bytes(cost)
        cfg.write(tmp)
        if req.baseline:
            tm = bp.target_manifest
            if tm.get("quant"):
                raise DynspecError("--baseline-trt-engine needs an unquantized target; convert one without --quant")
            spec = BaselineSpec(str(Path(req.target).resolve()), req.tp, tm["dtype"], req.max_batch_size,
                                bp.max_seq_len, max(bp.options["max_num_tokens"], req.max_batch_size))
            script = tmp / SCRIPT
            script.write_text(baseline_script(spec))
            script.chmod(0o755)
    return cfg
