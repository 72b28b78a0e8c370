"""`--engine trtllm`: the same sweep through TensorRT-LLM's LLM API (PyTorch backend), TP from the engine dir.

Launch (one TP=8 instance; rank 0 runs this script and drives the load, the other ranks are
the LLM API's MPI workers):
    mpirun -n 8 --allow-run-as-root -x NCCL_NVLS_ENABLE=0 \\
        trtllm-llmapi-launch python -m dynspec.benchmarks.sweep --engine trtllm --engine-dir DIR ...
Without mpirun the LLM API spawns its own workers.

Each mode is one LLM instance built from ENGINE_DIR/llm_api_options.yaml (written by
`dynspec build`) with its speculative_config replaced:
    baseline  no speculative_config
    static    max_draft_len = K, no draft_len_schedule
    dynamic   draft_len_schedule rendered by DraftSchedule.to_trtllm(engine trtllm_version)
K and acceptance come from the iteration stats (enable_iter_perf_stats).

tensorrt_llm is imported here only, lazily: the rest of the kit runs without it. This path
has not been run on these CPU machines (TensorRT-LLM cannot be installed on them).
"""
from __future__ import annotations

import copy
import json
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


def _decoding_config(spec: dict):
    from tensorrt_llm.llmapi import Eagle3DecodingConfig, EagleDecodingConfig

    spec = dict(spec)
    kind = spec.pop("decoding_type", "Eagle3")
    cls = Eagle3DecodingConfig if kind == "Eagle3" else EagleDecodingConfig
    return cls(**spec)


def steps_from_stats(stats: Sequence) -> tuple:
    """IterationStats JSON (llm.get_stats) -> StepRecords. Field names as in TRT-LLM 1.x:
    numActiveRequests, iterLatencyMS, specDecodingStats.{numDraftTokens, numAcceptedTokens,
    numRequestsWithDraftTokens}. Missing fields give K = 0."""
    from dynspec.benchmarks.metrics import StepRecord

    out = []
    for s in stats:
        if isinstance(s, str):
            s = json.loads(s)
        b = int(s.get("numActiveRequests") or 0)
        if b < 1:
            continue
        sd = s.get("specDecodingStats") or {}
        drafted = int(sd.get("numDraftTokens") or 0)
        nreq = int(sd.get("numRequestsWithDraftTokens") or 0)
        k = round(drafted / nreq) if nreq else 0
        out.append(StepRecord(b, k, drafted, int(sd.get("numAcceptedTokens") or 0),
                              float(s.get("iterLatencyMS") or 0.0) / 1e3, 0.0))
    return tuple(out)


async def _closed_loop_async(llm, requests, concurrency: int, sampling_cls):
    import asyncio

    from dynspec.benchmarks.metrics import RequestTiming

    queue = list(requests)[::-1]
    done: list[RequestTiming] = []

    async def worker():
        while queue:
            r = queue.pop()
            sp = sampling_cls(max_tokens=r.output_tokens, ignore_eos=True)
            t_sub = time.perf_counter()
            first, out = None, None
            async for out in llm.generate_async(list(r.input_ids), sampling_params=sp, streaming=True):
                if first is None and out.outputs[0].token_ids:
                    first = time.perf_counter()
            n = len(out.outputs[0].token_ids) if out is not None else 0
            done.append(RequestTiming(r.input_len, n, t_sub, first, time.perf_counter()))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def _launch_line(argv: Sequence[str]) -> str:
    from dynspec.benchmarks.sweep import command_line

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

    from tensorrt_llm import LLM, SamplingParams

    from dynspec.benchmarks.engines import engine_choice, versions
    from dynspec.build.llm_api import read_options
    from dynspec.benchmarks.metrics import RunRecord, summarize
    from dynspec.benchmarks.report import write_all
    from dynspec.benchmarks.sweep import make_row, resolve
    from dynspec.benchmarks.workload import take
    from dynspec.runtime.acceptance import Greedy

    choice = engine_choice(args)
    cfg = choice.config
    w = World(0, 1, 0, None)          # the MPI world belongs to the LLM API here
    spec = resolve(args, w, cfg)
    if not isinstance(spec.acceptance, Greedy):
        raise DynspecError("--engine trtllm measures real acceptance only; use --acceptance real")
    opt_path = Path(args.trtllm_options or Path(args.engine_dir) / cfg.llm_api_options)
    base = read_options(opt_path)
    schedules = dict(spec.schedules)
    static_k = schedules["static"].max_draft_len if "static" in schedules else 0
    rows = []
    for m in spec.modes:
        opts = mode_options(base, m, schedules[m], static_k, cfg.trtllm_version)
        if "speculative_config" in opts:
            opts["speculative_config"] = _decoding_config(opts["speculative_config"])
        log(f"trtllm: starting LLM for mode {m}")
        llm = LLM(model=cfg.target_dir, **opts)
        try:
            for p in spec.points:
                if p.concurrency is None:
                    raise DynspecError("--engine trtllm supports closed-loop --concurrency only")
                reqs = take(spec.requests, spec.count.at(p))
                llm.get_stats(timeout=1)            # drain stats of earlier runs
                t0 = time.perf_counter()
                timings = asyncio.run(_closed_loop_async(llm, reqs, p.concurrency, SamplingParams))
                t1 = time.perf_counter()
                steps = steps_from_stats(llm.get_stats(timeout=5))
                met = summarize([RunRecord(tuple(timings), steps, t0, t1)])
                rows.append(make_row(p, m, spec, schedules[m], True, met, 1))
                log(f"trtllm {m} C={p.concurrency}: {met.output_tok_per_s:.1f} tok/s, mean K {met.mean_k:.2f}")
        finally:
            llm.shutdown()
    doc = {"env": {"name": Path(args.out).name, "device": "cuda (TensorRT-LLM)", "engine": "trtllm",
                   "engine_source": choice.source, "tp": base.get("tensor_parallel_size", cfg.tp),
                   "world_size": int(os.environ.get("tllm_mpi_size", "1")), "replicas": 1,
                   "versions": versions(), "command": _launch_line(argv),
                   "acceptance_model": str(spec.acceptance), "acceptance_lossless": True,
                   "schedules": {m: s.to_spec() for m, s in spec.schedules}, "workload": spec.workload,
                   "trtllm_version": cfg.trtllm_version, "seed": spec.seed},
           "rows": rows}
    write_all(doc, args.out)
    return 0
