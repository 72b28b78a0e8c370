"""Open an ENGINE_DIR (or a target + draft pair) as a ready reference engine + executor."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from dynspec.config import EngineConfig, GraphMode, ReferenceSettings
from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import AcceptanceModel, Greedy
from dynspec.runtime.policy import DraftSchedule, Policy

def tiny_pair_dirs() -> tuple[str, str]:
    """The embedded tiny target + EAGLE-3 draft (committed under dynspec/assets/tiny)."""
    from importlib import resources

    root = Path(str(resources.files("dynspec") / "assets" / "tiny"))
    return str(root / "target"), str(root / "draft")


def engine_config_for(target_dir: str, draft_dir: str, schedule: DraftSchedule,
                      reference: ReferenceSettings = ReferenceSettings()) -> EngineConfig:
    """An in-memory EngineConfig for a pair that has not been through `dynspec build`."""
    return EngineConfig(target_dir=str(target_dir), draft_dir=str(draft_dir), schedule=schedule, reference=reference)


def target_positions(target_dir: str) -> int:
    """The target's max_position_embeddings, from its config.json (checked as loading checks it)."""
    from dynspec.checkpoint.hf_config import read_config
    from dynspec.runtime.engines.reference.model_config import TargetConfig

    where = str(Path(target_dir) / "config.json")
    return TargetConfig.from_hf(read_config(target_dir, "target"), where).max_position_embeddings


def check_positions(target_dir: str, positions: int, what: str) -> None:
    """Refuse a cache longer than the target's positions, as `dynspec build` does:
    check_positions(tiny, 10**6, "max_seq_len") -> "max_seq_len 1000000 exceeds the target's
    max_position_embeddings 1024 (.../config.json)"."""
    limit = target_positions(target_dir)
    if positions > limit:
        name, _, rest = what.partition(" ")
        raise DynspecError(f"{name} {positions} {rest + ' ' if rest else ''}exceeds the target's "
                           f"max_position_embeddings {limit} ({Path(target_dir) / 'config.json'})")


def open_reference_engine(cfg: EngineConfig, *, device: str = "cpu", max_draft_len: int | None = None,
                          tp=None, **overrides):
    """Load cfg's pair into a ReferenceEngine sized by cfg.reference (overrides: its fields).
    tp: this rank's TpContext (runtime/tp/tp_groups.py): the engine holds its shard of the pair
    and runs on tp.device (docs/tensor_parallel.md); None: the whole pair on `device`."""
    from dynspec.runtime.engines.reference.load import load_reference_engine

    ref = replace(cfg.reference, **overrides)
    dev = str(tp.device) if tp is not None else device
    if ref.dtype == "float64" and not dev.startswith("cpu"):
        raise DynspecError(f"dtype float64 is for CPU exactness tests; device {dev} takes float32, bfloat16 "
                           f"or float16")
    check_positions(cfg.target_dir, ref.max_seq_len, "max_seq_len (--max-seq-len or engine.json reference.max_seq_len)")
    sizes = dict(max_batch_size=ref.max_batch_size, max_seq_len=ref.max_seq_len,
                 max_draft_len=max(cfg.schedule.max_draft_len, max_draft_len or 0, 1),
                 max_num_tokens=ref.max_num_tokens, graphs=ref.graphs)
    if tp is not None:
        from dynspec.runtime.engines.reference.tp import load_tp_engine

        return load_tp_engine(cfg.target_dir, cfg.draft_dir, tp, dtype=ref.dtype, **sizes)
    return load_reference_engine(cfg.target_dir, cfg.draft_dir, device=device, dtype=ref.dtype, **sizes)


def capture(engine, keys, ref: ReferenceSettings = ReferenceSettings(), strict: bool = True) -> int:
    """The one capture sequence, for serving, tests and benchmarks alike: prepare an engine as
    `ref` (ReferenceSettings) asks. Under GraphMode.FULL the decode graphs of `keys`
    (reachable_graphs), the eager chunk path compiled (engine.warm_chunks: the ragged kernel's
    item form, the glue at several token counts), then the whole-forward graphs of mixed
    iterations, after which (CUDA) mixed iterations at every speculative row shape run once
    (engine.warm_mixed, inside capture_whole_graphs); under EAGER the warm-up alone. On CPU
    nothing is captured: the whole-forward functions are set up to run uncaptured. Returns how
    many graphs. strict=False (serving): a whole-forward capture that fails is reported on stderr
    and mixed iterations run eagerly; benchmarks keep strict, so a result never carries a label
    it did not run with."""
    if ref.graphs is not GraphMode.FULL:
        engine.warm_chunks()
        return 0
    n = engine.capture_decode_graphs(keys)
    engine.warm_chunks()                 # before the whole graphs: its chunk-only steps run eagerly then
    try:
        n += engine.capture_whole_graphs(keys)
    except Exception as e:
        if strict:
            raise
        engine.drop_whole()
        print(f"warning: whole-forward mixed graphs not captured ({type(e).__name__}: {str(e)[:300]}); "
              f"mixed iterations run eagerly", file=sys.stderr)
    return n


def policy_of(cfg: EngineConfig):
    """engine.json's policy (runtime/policy/__init__.py POLICIES): its schedule, or a cost-model policy on its
    cost model (per-request: each K_i capped by the schedule's K at b), priced with the step_prices.json
    beside it, if any (runtime/policy/step_prices.py); a schedule with prefill_k capped on the steps
    that end a prompt's prefill (runtime/policy/prefill_cap.py)."""
    from dynspec.runtime.policy import POLICIES

    kind = POLICIES[cfg.policy]
    if kind.cost_model:              # a K above the schedule's max_draft_len is refused, naming the file
        from dynspec.runtime.policy.cost_model import CostModel
        from dynspec.runtime.policy.step_prices import prices_beside

        k = cfg.schedule.max_draft_len
        cost = CostModel.load(cfg.cost_model, k, f"engine.json schedule {cfg.schedule.to_spec()}")
        return kind.make(cost, cap=cfg.schedule, prices=prices_beside(cfg.cost_model), ttft_weight=cfg.ttft_weight)
    from dynspec.runtime.policy.prefill_cap import capped

    return capped(cfg.schedule, cfg.prefill_k)


def open_executor(cfg: EngineConfig, *, device: str = "cpu", policy: Policy | None = None,
                  draft_sync: str | None = None, acceptance: AcceptanceModel = Greedy(),
                  allow_lossy: bool = False, stats_limit: int | None = None, **overrides):
    """Engine + Executor for cfg. On CUDA (session.capture) with reference.graphs "full", graphs
    for every (bucket, K) the policy can reach are captured here, before the first request.
    stats_limit: the Executor's bound on its per-iteration stats log (None: its default)."""
    from dynspec.runtime.engines.reference.graph_keys import reachable_graphs
    from dynspec.runtime.serving.executor import Executor

    sync = cfg.reference.draft_sync if draft_sync is None else draft_sync
    policy = policy or policy_of(cfg)
    engine = open_reference_engine(cfg, device=device, max_draft_len=policy.max_draft_len, **overrides)
    if device.startswith("cuda"):
        capture(engine, reachable_graphs([policy], engine.max_batch_size, sync, engine.max_num_tokens), cfg.reference,
                strict=False)
    limit = {} if stats_limit is None else {"stats_limit": stats_limit}
    return Executor(engine, policy, draft_sync=sync, acceptance=acceptance, allow_lossy=allow_lossy,
                    loop=cfg.reference.loop(engine.device), **limit)


def check_device(device: str, flag: str = "--device") -> None:
    """A CUDA --device on a machine without one is refused in one line, before torch is asked
    for it: `--device cuda` on CPU -> "--device cuda: this machine has no CUDA device (torch 2.x)".
    cuda:N past the device count and anything not cpu/cuda are refused too."""
    if device == "cpu":
        return
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise DynspecError(f"{flag} {device!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise DynspecError(f"{flag} {device}: this machine has no CUDA device (torch {torch.__version__})")
        if dev.index is not None and dev.index >= n:
            raise DynspecError(f"{flag} {device}: this machine has {n} CUDA device(s)")
    elif dev.type != "cpu":
        raise DynspecError(f"{flag} {device!r}: the reference engine runs on cpu or cuda")
