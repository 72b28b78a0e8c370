"""ENGINE_DIR (engine.json, llm_api_options.yaml) -> a ready Triton model repository.

    reference       dynspec/{config.pbtxt, 1/model.py}: the reference executor in the python backend
    trtllm-llmapi   tensorrt_llm/{config.pbtxt, 1/model.yaml} + launch_triton.sh: TensorRT-LLM's
                    LLM-API Triton model at TP=engine.json tp
"""
from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dynspec.artifacts import atomic_dir, check_apart, write_json
from dynspec.build.engine_dir import options_file
from dynspec.config import ENGINE_JSON, EngineConfig
from dynspec.errors import DynspecError
from dynspec.runtime.engines.trtllm_options import read_options
from dynspec.runtime.engines.trtllm_release import release
from dynspec.runtime.policy import DraftSchedule
from dynspec.triton_repo.fill import fill_tree, pbtxt_string

TEMPLATES = Path(__file__).resolve().parent / "templates"
VARIANTS = {"reference": "reference", "trtllm-llmapi": "trtllm_llmapi"}
REPO_MANIFEST = "dynspec_repo.json"
DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


@dataclass(frozen=True)
class Engine:
    """An engine dir, checked: its config and where its files lie."""

    dir: Path
    config: EngineConfig

    @property
    def json_path(self) -> Path:
        return self.dir / ENGINE_JSON


def open_engine(engine_dir: str | os.PathLike) -> Engine:
    engine_dir = Path(engine_dir).resolve()
    cfg = EngineConfig.load(engine_dir)
    for what, d in (("target_dir", cfg.target_dir), ("draft_dir", cfg.draft_dir)):
        if not (Path(d) / "config.json").is_file():
            raise DynspecError(f"{engine_dir / ENGINE_JSON}: field {what!r} points to {d}, which has no config.json")
    return Engine(engine_dir, cfg)


def _plain(value: str, what: str) -> str:
    if any(ord(c) < 0x20 for c in value):
        raise DynspecError(f"{what} {value!r} has control characters")
    return value


def site_packages() -> str:
    """This environment's site-packages folders (where dynspec's install, or its .pth, lives)."""
    paths = sysconfig.get_paths()
    return os.pathsep.join(dict.fromkeys((paths["purelib"], paths["platlib"])))


def reference_params(engine: Engine, device: str = "cpu", monitor_interval_ms: int = 50) -> dict[str, str]:
    if not DEVICE.match(device):
        raise DynspecError(f"device {device!r} is not 'cpu', 'cuda' or 'cuda:N'")
    return {
        "engine_json": _plain(str(engine.json_path), "engine path"),
        "engine_dir": pbtxt_string(str(engine.dir)),
        "device": device,
        "python_site_packages": pbtxt_string(site_packages()),
        "monitor_interval_ms": str(int(monitor_interval_ms)),
    }


# ---- trtllm-llmapi ---------------------------------------------------------------------------
def _abs(engine_dir: Path, p: Any, where: str) -> str:
    if not isinstance(p, str) or not p:
        raise DynspecError(f"{where} must be a path string, not {p!r}")
    return str((engine_dir / p).resolve()) if not os.path.isabs(p) else p


def rendered_speculative_config(cfg: EngineConfig) -> dict | None:
    """speculative_config for cfg's schedule in the dialect of cfg.trtllm_version (None: never speculates)."""
    sched = cfg.schedule
    if not sched.tiers:
        return None
    spec = {"decoding_type": "Eagle3", "max_draft_len": sched.max_draft_len, "speculative_model_dir": cfg.draft_dir}
    key = release(cfg.trtllm_version).one_model_key      # runtime/engines/trtllm_release.py: per release
    if key != "rejected":                                  # 1.4 takes no eagle3_one_model key (PR 17366)
        spec["eagle3_one_model"] = key != "false"
    spec["draft_len_schedule"] = sched.to_trtllm(cfg.trtllm_version)
    return spec


def _check_schedule(spec: Mapping, cfg: EngineConfig, where: str) -> None:
    if "draft_len_schedule" not in spec:
        return
    try:
        theirs = DraftSchedule.from_trtllm(spec["draft_len_schedule"], cfg.trtllm_version)
    except (DynspecError, AttributeError) as e:
        raise DynspecError(f"{where}.draft_len_schedule: {e}") from e
    if theirs != cfg.schedule:
        raise DynspecError(
            f"{where}.draft_len_schedule {spec['draft_len_schedule']!r} means schedule '{theirs}' under TRT-LLM"
            f" {cfg.trtllm_version}, but engine.json's schedule is '{cfg.schedule}'"
        )


def llm_api_args(engine: Engine) -> dict:
    """LLM() arguments from ENGINE_DIR/<llm_api_options>, which must exist (build/engine_dir.options_file):
    relative paths resolved, model paths and tp filled in and cross-checked against engine.json."""
    cfg = engine.config
    path = options_file(engine.dir, cfg)
    opts = read_options(path)
    if "triton_config" in opts:
        raise DynspecError(f"{path}: key 'triton_config' is Triton's, not an LLM() argument; remove it")
    args = {"model": _abs(engine.dir, opts.pop("model", cfg.target_dir), f"{path}: 'model'")}
    args.update(opts)
    backend = args.setdefault("backend", "pytorch")
    if backend != "pytorch":
        raise DynspecError(f"{path}: 'backend' is {backend!r}; EAGLE-3 with a draft length schedule needs 'pytorch'")
    tp = args.setdefault("tensor_parallel_size", cfg.tp)
    if tp != cfg.tp:
        raise DynspecError(f"{path}: 'tensor_parallel_size' is {tp!r} but engine.json's tp is {cfg.tp}")
    spec = args.get("speculative_config")
    if spec is not None:
        if not isinstance(spec, dict):
            raise DynspecError(f"{path}: 'speculative_config' must be a mapping, not {spec!r}")
        spec = dict(spec)
        key = "speculative_model" if "speculative_model" in spec else "speculative_model_dir"
        spec[key] = _abs(engine.dir, spec.get(key, cfg.draft_dir), f"{path}: 'speculative_config.{key}'")
        _check_schedule(spec, cfg, f"{path}: speculative_config")
        args["speculative_config"] = spec
    return _validated(args, cfg, str(path))


def _validated(args: dict, cfg: EngineConfig, where: str) -> dict:
    """The pinned TRT-LLM version's rules (dynspec.build.validate), when there is a speculative_config."""
    from dynspec.build.validate import validate_options

    if args.get("speculative_config") is not None:
        try:
            validate_options(args, cfg.trtllm_version)
        except DynspecError as e:
            raise DynspecError(f"{where}: {e}") from e
    return args


def llmapi_params(engine: Engine, decoupled: bool = True) -> dict[str, str]:
    import yaml

    cfg = engine.config
    args = llm_api_args(engine)
    spec = args.get("speculative_config") or {}
    schedule = spec.get("draft_len_schedule")
    comment = (f"'{cfg.schedule}' -> {schedule}" if schedule is not None
               else f"'{cfg.schedule}' (no draft_len_schedule)")
    return {
        "engine_json": _plain(str(engine.json_path), "engine path"),
        "trtllm_version": _plain(cfg.trtllm_version, "trtllm_version"),
        "schedule_comment": _plain(comment, "schedule"),
        "llm_args": yaml.safe_dump(args, sort_keys=False, default_flow_style=None).rstrip("\n"),
        "triton_max_batch_size": "0",
        "decoupled": "true" if decoupled else "false",
        "world_size": str(int(cfg.tp)),
    }


# ---- the repository --------------------------------------------------------------------------
def generate_repo(engine_dir: str | os.PathLike, out: str | os.PathLike, variant: str = "reference", *,
                  device: str = "cpu", force: bool = False) -> Path:
    """Fill the variant's templates from ENGINE_DIR into `out` (all-or-nothing)."""
    if variant not in VARIANTS:
        raise DynspecError(f"unknown Triton variant {variant!r}; choose one of {sorted(VARIANTS)}")
    check_apart(out, {"--engine-dir": engine_dir})
    engine = open_engine(engine_dir)
    check_apart(out, {"engine.json target_dir": engine.config.target_dir,
                      "engine.json draft_dir": engine.config.draft_dir})
    if variant == "reference":
        params = reference_params(engine, device)
    else:
        if device != "cpu":
            raise DynspecError("--device applies to the reference variant; TRT-LLM places its own TP ranks")
        params = llmapi_params(engine)
    out = Path(out)
    with atomic_dir(out, force=force) as tmp:
        fill_tree(TEMPLATES / VARIANTS[variant], params, tmp)
        write_json(tmp / REPO_MANIFEST, {
            "generator": "dynspec triton",
            "variant": variant,
            "engine_dir": str(engine.dir),
            "schedule": engine.config.schedule.to_spec(),
            "trtllm_version": engine.config.trtllm_version,
            "tp": engine.config.tp,
            "device": device,           # the reference variant's; the TP launcher places its workers by it
        })
    return out
