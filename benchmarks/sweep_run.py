"""A sweep process: its plans (one per case, or the one plain sweep), the engine opened once for
all of them (per rank, or per TP replica), each plan measured (sweep_loop) and written by world
rank 0 as NAME.json, NAME.md and NAME.png (report.write_all)."""
from __future__ import annotations

import argparse
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dynspec.benchmarks.engines import BENCH_ENV, apply_bench_env
from dynspec.runtime.generate.session import check_device
from dynspec.benchmarks.mpi import World, log, world
from dynspec.benchmarks.sweep_args import command_line
from dynspec.benchmarks.sweep_loop import open_for_rank, open_engine, run_reference
from dynspec.benchmarks.sweep_plan import SweepSpec, check_overlap_fits, resolve
from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.policy.prefill_cap import PrefillCap
from dynspec.runtime.policy.step_prices import policy_record


def check_engine_overlap(plans: Sequence["PlannedSweep"]) -> None:
    """check_overlap_fits for every planned sweep at the one engine's K and cache length (the
    largest of any case's: sweep_cases.engine_sizes), naming the case."""
    kmax = max(p.spec.max_draft_len for p in plans)
    seq = max(p.spec.max_seq_len for p in plans)
    for p in plans:
        try:
            check_overlap_fits(dict(p.spec.loops), max(r.input_len + r.output_tokens for r in p.spec.requests), kmax,
                               seq)
        except DynspecError as e:
            raise DynspecError(f"case {p.case.name!r}: {e}" if p.case.name else str(e)) from None


def env_block(args, spec: SweepSpec, cfg, source: str, device: str, w: World, argv: Sequence[str],
              tp: int = 1) -> dict:
    from dynspec.benchmarks.engines import device_name, graphs_run, versions

    dev = device_name(device if not device == "cuda" else "cuda:0")
    graphs = graphs_run(cfg, device)
    return {
        "name": Path(args.out).name,
        "device": dev,
        "engine": spec.engine,
        "engine_source": source,
        "world_size": w.size,
        "replicas": w.size // tp if spec.engine == "reference" else 1,
        "tp": tp if spec.engine == "reference" else None,
        "allreduce": getattr(args, "allreduce", None) if spec.engine == "reference" and tp > 1 else None,   # requested
        "versions": versions(),
        "command": command_line(argv, w.size),
        "acceptance_model": str(spec.acceptance),
        "acceptance_lossless": bool(spec.acceptance.lossless),
        "schedules": {m: getattr(s, "schedule", s).to_spec() for m, s in spec.schedules
                      if isinstance(getattr(s, "schedule", s), DraftSchedule)},
        "prefill_k": next((s.prefill_k for _, s in spec.schedules if isinstance(s, PrefillCap)), None),
        "adaptive": None if spec.cost_model is None else {"cost_model": spec.cost_model,
                                                            **policy_record(spec.step_prices),
                                                            "ttft_weight": spec.ttft_weight},
        "draft_sync": dict(spec.draft_sync),
        "workload": spec.workload,
        "seed": spec.seed,
        "trials": spec.trials,
        "poisson_at": list(spec.poisson_at),
        "poisson_rate_rule": "open loop at the baseline's closed-loop requests/s per replica at that C"
                             " (median of its trials; the first mode's without a baseline)",
        "dtype": cfg.reference.dtype,
        "graphs": graphs,                               # GraphMode value as run ("eager" off CUDA)
        "cuda_graphs": graphs == "full",
        "max_batch_size": spec.max_batch_size,
        "max_seq_len": spec.max_seq_len,
        "hostname": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "nccl_env": {k: os.environ.get(k) for k in BENCH_ENV},
        "cpu_threads_per_rank": _threads() if device.startswith("cpu") else None,
    }


def _threads() -> int:
    import torch

    return torch.get_num_threads()


@dataclass(frozen=True)
class PlannedSweep:
    """One sweep of the process, resolved: its flags (sweep_cases.CaseRun), engine config and spec."""
    case: object            # sweep_cases.CaseRun
    cfg: object             # dynspec.config.EngineConfig
    source: str             # EngineChoice.source
    spec: SweepSpec


def plan(case, w: World, replicas: int, tp: int) -> PlannedSweep:
    """A CaseRun -> its engine config and SweepSpec (the same on every rank), logged on rank 0."""
    from dynspec.benchmarks.engines import engine_choice

    try:
        choice = engine_choice(case.args)
        spec = resolve(case.args, w, choice.config)
    except DynspecError as e:
        if case.name is None:
            raise
        raise DynspecError(f"case {case.name!r}: {e}") from None
    log((f"case {case.name}: " if case.name else "")
        + f"sweep: {len(spec.points)} load points x modes {','.join(spec.modes)} on {replicas} replica(s)"
        + (f" of TP={tp}" if tp > 1 else "") + f", acceptance {spec.acceptance}, {choice.source}")
    return PlannedSweep(case, choice.config, choice.source, spec)


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """One plain sweep, or (--cases) several on one engine opened once (benchmarks/sweep_cases.py)."""
    from dynspec.benchmarks.engines import set_cpu_threads
    from dynspec.benchmarks.mpi import split_leaders
    from dynspec.benchmarks.sweep_cases import case_runs
    from dynspec.runtime.tp.tp_layout import layout
    from dynspec.runtime.tp.tp_lifecycle import run_replica

    apply_bench_env()
    runs = case_runs(args, argv)                           # every case's flags checked, before any model
    if args.engine == "trtllm":
        from dynspec.benchmarks.trtllm_driver import run_trtllm_sweep

        return run_trtllm_sweep(args, argv)
    t0 = time.perf_counter()
    first = runs[0].args                                   # its SHARED_FLAGS are every case's
    check_device(first.device)
    w, tp = world(), first.tp
    replicas = layout(w.rank, w.size, tp).replicas         # refuses -n that is not a multiple of --tp
    leaders = split_leaders(w, tp)                         # None on a TP worker
    plans = [plan(r, leaders or World(w.rank, replicas, w.local_rank), replicas, tp) for r in runs]
    check_engine_overlap(plans)
    specs, cfg = [p.spec for p in plans], plans[0].cfg
    opened = {}

    def load(ctx=None):
        t = time.perf_counter()
        engine = (open_for_rank(specs, cfg, first.device, w, first.threads) if ctx is None
                  else open_engine(specs, cfg, str(ctx.device), tp=ctx))
        opened["s"] = time.perf_counter() - t
        return engine

    def sweep_all(engine, lw: World, ctx=None) -> None:
        for i, p in enumerate(plans):
            run_planned(plans, i, engine, lw, w, ctx, argv, t0 if p.case.name is None else None, opened.get("s"))

    if tp == 1:
        sweep_all(load(), w)
    else:
        set_cpu_threads(first.threads, first.device)
        run_replica(tp, load, lambda engine, ctx: sweep_all(engine, leaders, ctx), device=first.device,
                    allreduce=first.allreduce)
    w.barrier()
    return 0


def run_planned(plans: Sequence[PlannedSweep], i: int, engine, lw: World, w: World, ctx, argv: Sequence[str],
                t0: float | None, open_s: float | None) -> None:
    """Sweep plans[i] on the open engine (every rank of lw); w's rank 0 writes its NAME.json/.md/.png,
    partial after each load point, complete at the end. t0: when its wall time starts (None: now)."""
    from dynspec.benchmarks.report import write_all
    from dynspec.benchmarks.sweep_cases import graph_keys, shared_engine_block

    p, a = plans[i], plans[i].case.args
    t0 = time.perf_counter() if t0 is None else t0
    env = None
    if w.is_root:
        env = env_block(a, p.spec, p.cfg, p.source, a.device, w, p.case.argv, a.tp)
        env["max_num_tokens"] = engine.max_num_tokens      # the token budget each step was shaped under
        shared = shared_engine_block(
            [q.case for q in plans], i, {"max_batch_size": engine.max_batch_size, "max_seq_len": engine.max_seq_len,
                                         "max_draft_len": engine.max_draft_len},
            len(graph_keys([q.spec for q in plans], engine.max_batch_size, engine.max_num_tokens)),
            command_line(argv, w.size), open_s)
        if shared is not None:
            env["shared_engine"] = shared

    def partial(rows: list[dict]) -> None:
        write_all({"env": dict(env, wall_s=time.perf_counter() - t0, complete=False), "rows": rows}, a.out,
                  plot_png=False)

    rows = run_reference(p.spec, p.cfg, a.device, lw, progress=not a.no_progress, threads=a.threads, on_rows=partial,
                         engine=engine, label=p.case.name or "sweep")
    if w.is_root:
        if ctx is not None and ctx.tp > 1:     # the mode that ran ('auto' may have fallen back to NCCL)
            env.update(allreduce=ctx.reducer.mode, allreduce_fallback=ctx.reducer.fallback or None)
        doc = {"env": dict(env, wall_s=time.perf_counter() - t0, complete=True), "rows": rows}
        paths = write_all(doc, a.out)
        log("wrote " + ", ".join(str(x) for x in paths.values()))
