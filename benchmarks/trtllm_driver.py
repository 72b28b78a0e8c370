"""`--engine trtllm`: the same sweep through TensorRT-LLM's LLM API (PyTorch backend), TP from the engine dir.

Launch (one TP=8 instance; rank 0 runs this script and drives the load, the other ranks are
the LLM API's MPI workers):
    mpirun -n 8 --allow-run-as-root -x NCCL_NVLS_ENABLE=0 \\
        trtllm-llmapi-launch python -m dynspec.benchmarks.sweep --engine trtllm --engine-dir DIR ...
Without mpirun the LLM API spawns its own workers.

Each mode is one TrtllmEngine (runtime/engines/trtllm.py: the one TRT-LLM path, for `generate`,
Triton-free serving and this sweep alike) started from ENGINE_DIR/llm_api_options.yaml (written
by `dynspec build`) with its speculative_config replaced:
    baseline  no speculative_config
    static    max_draft_len = K, no draft_len_schedule
    dynamic   draft_len_schedule rendered by DraftSchedule.to_trtllm(engine trtllm_version)
Per iteration, K is the mode's schedule at numActiveRequests and acceptance comes from the
iteration stats (enable_iter_perf_stats), both read by the engine's one parser, iteration_record. With --trials T every mode runs T times (one LLM start each), the
mode order rotated per trial; a row is the median trial with the spread of all T, as in sweep.py.

draft_sync in each row says what the draft does while K = 0 ("warm": kept up to date; "off": not):
"off" for the baseline (no draft), and "off" for every TRT-LLM version dynspec renders: each has the
stale-draft trap (build/trap.py: on 1.2.x the two-model drafter is skipped at K=0 and never
catches up; PR 16888, still open, addresses only the one-engine path).

tensorrt_llm is imported here only, lazily: the rest of the kit runs without it. This path
has not been run on these CPU machines (TensorRT-LLM cannot be installed on them).
"""
from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Sequence

from dynspec.errors import DynspecError

INSTALL_HINT = "pip install --extra-index-url https://pypi.nvidia.com tensorrt_llm==1.2.1"


def require_tensorrt_llm():
    try:
        import tensorrt_llm  # noqa: F401
    except Exception as e:  # ImportError, or a broken CUDA/TensorRT install
        raise DynspecError(
            f"--engine trtllm needs TensorRT-LLM, which is not importable here ({type(e).__name__}: {e}). "
            f"Install it on the GPU node ({INSTALL_HINT}) and launch with "
            "`mpirun -n 8 trtllm-llmapi-launch python -m dynspec.benchmarks.sweep --engine trtllm ...`; "
            "use --engine reference everywhere else"
        ) from None
    return tensorrt_llm


def launched_by_llmapi_launch() -> bool:
    """trtllm-llmapi-launch exports TLLM_SPAWN_PROXY_PROCESS (and tllm_mpi_size) before running rank 0."""
    return "TLLM_SPAWN_PROXY_PROCESS" in os.environ or "tllm_mpi_size" in os.environ


def mode_options(base: dict, mode: str, schedule, static_k: int, trtllm_version: str) -> dict:
    """LLM() kwargs for one mode from the engine dir's options (pure; a deep copy)."""
    opts = copy.deepcopy(base)
    opts.pop("model", None)
    opts.pop("backend", None)                      # LLM is the PyTorch-backend class already
    spec = opts.pop("speculative_config", None)
    if mode != "baseline":
        if spec is None:
            raise DynspecError("llm_api_options.yaml has no speculative_config; rebuild the engine dir with a draft")
        spec = dict(spec)
        spec.pop("draft_len_schedule", None)
        if mode == "static":
            spec["max_draft_len"] = static_k
        else:
            rendered = schedule.to_trtllm(trtllm_version)
            spec["max_draft_len"] = schedule.max_draft_len
            spec["draft_len_schedule"] = {int(k): int(v) for k, v in rendered.items()}
        opts["speculative_config"] = spec
    opts["enable_iter_perf_stats"] = True
    return opts


def draft_sync_label(mode: str, trtllm_version: str) -> str:
    """"warm" where the draft is kept up to date while K = 0 in this mode on this TRT-LLM version, else "off"."""
    from dynspec.build.trap import has_stale_draft_trap

    return "warm" if mode != "baseline" and not has_stale_draft_trap(trtllm_version) else "off"


def steps_from_stats(stats: Sequence, lengths) -> tuple:
    """IterationStats JSON (llm.get_stats) of an LLM started with `lengths` (a DraftLengths) ->
    StepRecords, by the engine's one parser."""
    from dynspec.benchmarks.metrics import StepRecord
    from dynspec.runtime.engines.trtllm import iteration_records

    return tuple(StepRecord.of(r) for r in iteration_records(stats, lengths))


async def _closed_loop_async(engine, requests, concurrency: int):
    """`concurrency` workers, each streaming one request at a time to its full output length."""
    import asyncio

    from dynspec.benchmarks.metrics import RequestTiming

    queue = list(requests)[::-1]
    done: list[RequestTiming] = []

    async def worker():
        while queue:
            r = queue.pop()
            t_sub = time.perf_counter()
            first, n = None, 0
            async for chunk in engine.stream(r.input_ids, r.output_tokens, ignore_eos=True):
                if first is None and chunk:
                    first = time.perf_counter()
                n += len(chunk)
            done.append(RequestTiming(r.input_len, n, t_sub, first, time.perf_counter()))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def _launch_line(argv: Sequence[str]) -> str:
    from dynspec.benchmarks.sweep_args import command_line

    line = command_line(argv, 1)
    if launched_by_llmapi_launch():
        line = f"mpirun -n {os.environ.get('tllm_mpi_size', '?')} trtllm-llmapi-launch {line}"
    return line


def run_trtllm_sweep(args, argv: Sequence[str]) -> int:
    require_tensorrt_llm()
    from dynspec.benchmarks.mpi import World, launched_by_mpirun, log

    if launched_by_mpirun() and not launched_by_llmapi_launch():
        raise DynspecError(
            "--engine trtllm under mpirun must go through trtllm-llmapi-launch, so that ranks > 0 become the LLM API's "
            "workers: mpirun -n 8 trtllm-llmapi-launch python -m dynspec.benchmarks.sweep --engine trtllm ..."
        )
    if not args.engine_dir:
        raise DynspecError("--engine trtllm needs --engine-dir (its llm_api_options.yaml holds the LLM API options)")
    import asyncio

    from dynspec.benchmarks.engines import engine_choice, versions
    from dynspec.benchmarks.metrics import RunRecord, StepRecord, summarize
    from dynspec.benchmarks.report import write_all
    from dynspec.benchmarks.sweep_plan import resolve
    from dynspec.benchmarks.sweep_rows import make_row, median_trial, trial_fields
    from dynspec.benchmarks.workload import take
    from dynspec.runtime.policy.acceptance import Greedy
    from dynspec.runtime.engines.trtllm import TrtllmEngine, load_options
    from dynspec.runtime.engines.trtllm_options import read_options

    choice = engine_choice(args)
    cfg = choice.config
    w = World(0, 1, 0, None)          # the MPI world belongs to the LLM API here
    spec = resolve(args, w, cfg)
    if not isinstance(spec.acceptance, Greedy):
        raise DynspecError("--engine trtllm measures real acceptance only; use --acceptance real")
    if args.trtllm_options:
        base = read_options(Path(args.trtllm_options))
    else:
        _, base = load_options(args.engine_dir)           # model paths re-pointed as engine.json names them
    schedules = dict(spec.schedules)
    static_k = schedules["static"].max_draft_len if "static" in schedules else 0
    if any(p.concurrency is None for p in spec.points):
        raise DynspecError("--engine trtllm supports closed-loop --concurrency only")
    sync = {m: draft_sync_label(m, cfg.trtllm_version) for m in spec.modes}
    trials: dict[tuple, list] = {}                        # (point, mode) -> RunMetrics of each trial
    n = len(spec.modes)
    for t in range(spec.trials):
        # rotate the mode order per trial, as benchmarks/sweep_loop.py does: trial 1 of (a, b, c) runs b, c, a
        for m in spec.modes[t % n:] + spec.modes[:t % n]:
            opts = mode_options(base, m, schedules[m], static_k, cfg.trtllm_version)
            log(f"trtllm: starting LLM for mode {m}" + (f" (trial {t + 1}/{spec.trials})" if spec.trials > 1 else ""))
            with TrtllmEngine.start({"model": cfg.target_dir, **opts}, cfg) as engine:
                for p in spec.points:
                    reqs = take(spec.requests, spec.count.at(p))
                    engine.new_iteration_stats(timeout=1)            # drain stats of earlier runs
                    t0 = time.perf_counter()
                    timings = asyncio.run(_closed_loop_async(engine, reqs, p.concurrency))
                    t1 = time.perf_counter()
                    steps = tuple(StepRecord.of(r) for r in engine.new_iteration_stats(timeout=5))
                    met = summarize([RunRecord(tuple(timings), steps, t0, t1)])
                    trials.setdefault((p, m), []).append(met)
                    log(f"trtllm {m} C={p.concurrency}: {met.output_tok_per_s:.1f} tok/s, mean K {met.mean_k:.2f}")
    rows = []
    for p in spec.points:                                   # the median trial + spread, as sweep's rows
        for m in spec.modes:
            mets = trials[(p, m)]
            row = make_row(p, m, spec, schedules[m], sync[m], median_trial(mets), 1)
            row.update(trial_fields(mets))
            rows.append(row)
    doc = {"env": {"name": Path(args.out).name, "device": "cuda (TensorRT-LLM)", "engine": "trtllm",
                   "engine_source": choice.source, "tp": base.get("tensor_parallel_size", cfg.tp),
                   "world_size": int(os.environ.get("tllm_mpi_size", "1")), "replicas": 1,
                   "versions": versions(), "command": _launch_line(argv),
                   "acceptance_model": str(spec.acceptance), "acceptance_lossless": True,
                   "schedules": {m: s.to_spec() for m, s in spec.schedules}, "workload": spec.workload,
                   "draft_sync": sync,
                   "trtllm_version": cfg.trtllm_version, "seed": spec.seed},
           "rows": rows}
    write_all(doc, args.out)
    return 0
