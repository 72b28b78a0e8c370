"""Concurrency sweep: baseline (K=0), static (fixed K) and dynamic (the schedule), side by side.

    mpirun -n N python -m dynspec.benchmarks.sweep --engine reference --engine-dir DIR \\
        --concurrency 1,2,4,8,16,32,64,128 --modes baseline,static,dynamic \\
        --acceptance bernoulli:0.7 --input-len 512 --output-len 512 --out results/NAME

Reference engine: every rank is one replica (data parallel) on its own device (cuda:<local
rank> with --device cuda). At each load point the replicas start together after a barrier and
each runs --num-requests requests of its own shard of one seeded workload; every mode sees
the very same requests. Rank 0 gathers the raw timings with mpi4py and writes NAME.json,
NAME.md and NAME.png. Without mpirun the world is one rank.

    --concurrency C   closed loop: C requests in flight per replica
    --request-rate R  open loop: Poisson arrivals at R req/s per replica
    --poisson-at C    open loop beside the closed loop at C, at the same mean load: the rate is
                      the baseline's closed-loop requests/s per replica at C (median of its trials)
    --trials N        runs per (load point, mode), mode order rotated; rows give the median run
                      and the min..max spread of throughput (default 3)
    --cases FILE      several sweeps in one process on one engine, opened and captured once; case
                      N writes NAME_N.json/.md/.png (benchmarks/sweep_cases.py)

TensorRT-LLM (`--engine trtllm`) runs as one TP instance of the LLM API:
    mpirun -n 8 trtllm-llmapi-launch python -m dynspec.benchmarks.sweep --engine trtllm --engine-dir DIR ...
(see benchmarks/trtllm_driver.py).

Tensor parallelism (`--tp N`, reference engine): `mpirun -n R*N` gives R replicas of N ranks.
Every rank holds its shard; only the R leaders drive load, time and report, gathered over a
communicator of the leaders alone (benchmarks/mpi.py split_leaders; docs/tensor_parallel.md).
"""
from __future__ import annotations

import argparse
import shlex
from typing import Sequence

from dynspec.benchmarks.engines import add_engine_args
from dynspec.runtime.policy.schedule_args import add_ttft_weight_arg


def make_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="python -m dynspec.benchmarks.sweep", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__,
                                     allow_abbrev=False)
    p.add_argument("--engine", choices=("reference", "trtllm"), default="reference")
    add_engine_args(p)
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="reference engine: tensor parallel ranks per replica (mpirun -n R*N -> R replicas)")
    p.add_argument("--allreduce", choices=("auto", "nccl", "one-shot"), default="auto",
                   help="tensor parallel all-reduce (docs/tensor_parallel.md): auto = the one-shot NVLink kernel on CUDA, NCCL if it cannot be set up; gloo on CPU")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency", default="1,2,4,8", help="closed-loop concurrencies per replica, e.g. 1,2,4,8")
    g.add_argument("--request-rate", default="", help="open-loop Poisson rates per replica (req/s), e.g. 0.5,1,2")
    g.add_argument("--poisson-at", default="", metavar="C,...",
                   help="also run open-loop Poisson arrivals at these closed-loop C's, at the rate the baseline"
                        " sustained there (median of its trials; else the first mode's)")
    g.add_argument("--modes", default="baseline,static,dynamic",
                   help="comma list of baseline, static (K = --static-k), static:K (e.g. static:1,static:5),"
                        " dynamic (the schedule) and adaptive (the cost model's policy, runtime/policy/adaptive.py)")
    g.add_argument("--cost-model", metavar="FILE",
                   help="adaptive mode: the cost model, a profile.json (default: ENGINE_DIR/cost_model.json)")
    g.add_argument("--step-prices", metavar="FILE|DIR",
                   help="cost-model modes: price per-row K vectors, and prompt chunks where the profile has no"
                        " chunk axis, with this device's fitted step prices (runtime/policy/step_prices.py); a folder"
                        " gives the file of the running device, if any (default: ENGINE_DIR/step_prices.json beside"
                        " the cost model, else neither is priced)")
    add_ttft_weight_arg(g, "the policy's")
    g.add_argument("--catch-up-price", choices=("on", "off"), default="on",
                   help="cost-model modes under lazy draft sync: price the catch-up a drafting step runs first and"
                        " the one a K=0 step leaves to the next (runtime/policy/adaptive.py, step 6; default: on)")
    g.add_argument("--prefill-k", metavar="K|TIERS|@FILE",
                   help="dynamic mode: K at most this (tiers: at the batch size, e.g. 32:1; @FILE: a file"
                        " holding one) on iterations that end a prompt's prefill, for time to first"
                        " token (runtime/policy/prefill_cap.py; default: engine.json prefill_k; reference engine only)")
    g.add_argument("--static-k", type=int, help="K of the static mode (default: the dynamic schedule's max K)")
    g.add_argument("--dynamic-schedule", metavar="SPEC|@FILE",
                   help="schedule of the dynamic mode, e.g. '4:4,8:2' or @schedule.txt from `dynspec tune`"
                        " (default: the engine's)")
    g.add_argument("--acceptance", default="real",
                   help="real (greedy, lossless) | bernoulli:P | bernoulli-mix:P1@W1,P2@W2 (each request's P by a hash"
                        " of its id) | shift:P1,P2@AT (P1 before request AT, a key or a fraction of the load"
                        " point's requests; P2 after): labelled models for random-weight checkpoints")
    g.add_argument("--draft-sync", choices=("engine", "lazy", "warm", "off"), default="engine",
                   help="drafting modes: what the draft does while K=0 (docs/design.md, \"Draft sync\"; default: the"
                        " engine dir's reference.draft_sync)")
    g.add_argument("--keep-warm", choices=("engine", "on", "off"), default="engine",
                   help="the former --draft-sync: on = warm, off = off (engine: --draft-sync decides)")
    w = p.add_argument_group("workload")
    w.add_argument("--dataset", metavar="FILE.jsonl", help="trtllm-bench JSONL (task_id, input_ids|prompt, output_tokens)")
    w.add_argument("--prompts", choices=("random", "stdlib"), default="random",
                   help="synthetic prompt tokens: uniform random ids, or windows of held-out Python stdlib text"
                        " (tokenized by the target's tokenizer: real acceptance for the tiny pair)")
    w.add_argument("--input-len", default="64:192", help="synthetic prompt length N or LO:HI, uniform (default 64:192)")
    w.add_argument("--output-len", default="32:224", help="synthetic output length N or LO:HI, uniform (default 32:224)")
    w.add_argument("--num-requests", type=int, help="requests per replica per load point (fixed; default: waves)")
    w.add_argument("--waves", type=float, default=2.0, help="requests per replica = max(--min-requests, waves x C)")
    w.add_argument("--waves-at", metavar="C:W,...",
                   help="other waves at some concurrencies, e.g. 256:3 (one process for points of other lengths)")
    w.add_argument("--min-requests", type=int, default=4)
    w.add_argument("--warmup-requests", type=int, default=2,
                   help="untimed requests per mode at C=1 before the sweep (plus one wave at the largest C; 0: none)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--trials", type=int, default=3,
                   help="runs per (load point, mode), mode order rotated; the median-throughput run is reported"
                        " with the min..max spread (default 3)")
    w.add_argument("--max-seq-len", type=int, help="cache length per row (default: longest request + K + 1)")
    w.add_argument("--save-workload", metavar="FILE.jsonl", help="also write the synthetic workload as trtllm-bench JSONL")
    t = p.add_argument_group("trtllm")
    t.add_argument("--trtllm-options", metavar="YAML", help="LLM API options (default: ENGINE_DIR/llm_api_options.yaml)")
    o = p.add_argument_group("output")
    o.add_argument("--out", required=True, help="results/NAME -> NAME.json, NAME.md, NAME.png")
    o.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    o.add_argument("--cases", metavar="FILE.json",
                   help="several sweeps on one engine (benchmarks/sweep_cases.py): case N runs these flags + its"
                        " own and writes --out's NAME_N.json/.md/.png")
    return p


def command_line(argv: Sequence[str], world_size: int) -> str:
    """How this run was launched, as a copy-pasteable line (mpirun's own flags are not visible here)."""
    base = "python -m dynspec.benchmarks.sweep " + shlex.join(list(argv))
    return f"mpirun -n {world_size} {base}" if world_size > 1 else base
