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
import math
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from dynspec.benchmarks.engines import BENCH_ENV, add_engine_args, apply_bench_env
from dynspec.benchmarks.mpi import World, log, world
from dynspec.errors import DynspecError
from dynspec.runtime.overlap import cache_slack
from dynspec.runtime.policy import DraftSchedule

MODES = ("baseline", "static", "dynamic")            # the default --modes; TensorRT-LLM runs these alone
ALL_MODES = MODES + ("adaptive",)                     # and static:K, K in 1..MAX_STATIC_K
TRTLLM_MODES = MODES
OVERLAP = "+overlap"          # a mode's loop suffix: 'dynamic+overlap' runs Executor(overlap=True)
MAX_STATIC_K = 32
MAX_REQUESTS = 1_000_000      # per replica per load point: the workload is built in memory up front


def int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        xs = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DynspecError(f"{what} {text!r} is not a comma-separated list of integers") from None
    if not xs or min(xs) < 1:
        raise DynspecError(f"{what} {text!r} needs positive integers")
    return xs


def float_list(text: str, what: str) -> tuple[float, ...]:
    try:
        xs = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DynspecError(f"{what} {text!r} is not a comma-separated list of numbers") from None
    if not xs or min(xs) <= 0:
        raise DynspecError(f"{what} {text!r} needs positive numbers")
    return xs


def parse_modes(text: str) -> tuple[str, ...]:
    """'baseline,static:1,static:3,dynamic,adaptive' -> those five modes; each static:K is a mode of
    its own (K in 1..32), plain 'static' takes --static-k. Any of them may carry the loop suffix
    '+overlap' ('baseline,baseline+overlap'): the same policy through the overlapped executor loop."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if base_mode(m) not in ALL_MODES and static_k_of(base_mode(m)) is None]
    if bad or not modes:
        raise DynspecError(f"--modes {text!r}: unknown mode(s) {bad}; choose from {','.join(ALL_MODES)} or static:K"
                           f" (K in 1..{MAX_STATIC_K}), each optionally with {OVERLAP}")
    if len(set(modes)) != len(modes):
        raise DynspecError(f"--modes {text!r} repeats a mode")
    return modes


def base_mode(mode: str) -> str:
    """The policy part of a mode: 'static:3+overlap' -> 'static:3'; 'dynamic' -> 'dynamic'."""
    return mode[: -len(OVERLAP)] if mode.endswith(OVERLAP) else mode


def overlapped(mode: str) -> bool:
    """Does the mode run the overlapped executor loop ('dynamic+overlap')?"""
    return mode.endswith(OVERLAP)


def loop_of(mode: str) -> str:
    """'dynamic+overlap' -> 'overlap'; 'dynamic' -> 'serial' (the row's `loop`)."""
    return "overlap" if overlapped(mode) else "serial"


def static_k_of(mode: str) -> int | None:
    """'static:3' -> 3; anything else (plain 'static' too) -> None."""
    head, sep, k = mode.partition(":")
    if head != "static" or not sep or not k.isdigit() or not 1 <= int(k) <= MAX_STATIC_K:
        return None
    return int(k)


def read_schedule_arg(text: str) -> DraftSchedule:
    """'4:4,8:2' or '@schedule.txt' (the file `dynspec tune --out` writes)."""
    if text.startswith("@"):
        p = Path(text[1:])
        if not p.is_file():
            raise DynspecError(f"schedule file {p} does not exist")
        return DraftSchedule.parse(p.read_text().strip())
    return DraftSchedule.parse(text)


def mode_schedules(modes: Sequence[str], dynamic: DraftSchedule, static_k: int | None,
                   max_batch_size: int) -> dict[str, DraftSchedule]:
    """baseline: K=0 always; static: K for every batch size; static:K that K; dynamic: the engine's
    (or a tuned) schedule; a mode with the loop suffix ('static:3+overlap') its base mode's.
    Adaptive is not a schedule (adaptive_policy).

    static_k defaults to the dynamic schedule's max_draft_len: 'what if we never switched'."""
    out = {}
    for mode in modes:
        m = base_mode(mode)
        if m == "baseline":
            out[mode] = DraftSchedule()
        elif m == "static":
            k = dynamic.max_draft_len if static_k is None else static_k
            if k < 1:
                raise DynspecError("static mode needs --static-k K >= 1 (the dynamic schedule never speculates)")
            out[mode] = DraftSchedule.static(k, max_batch_size)
        elif static_k_of(m) is not None:
            out[mode] = DraftSchedule.static(static_k_of(m), max_batch_size)
        elif m == "dynamic":
            out[mode] = dynamic
    return out


def cost_model_path(args: argparse.Namespace) -> Path:
    """--cost-model, else ENGINE_DIR/cost_model.json; the adaptive mode's one source."""
    if args.cost_model:
        p = Path(args.cost_model)
    elif getattr(args, "engine_dir", None):
        p = Path(args.engine_dir) / "cost_model.json"
    else:
        raise DynspecError("adaptive mode needs a cost model: give --cost-model FILE (no --engine-dir to find"
                           " cost_model.json in)")
    if not p.is_file():
        raise DynspecError(f"adaptive mode needs a cost model and {p} does not exist: write it with"
                           f" `dynspec profile ... --out {p}` or give --cost-model FILE")
    return p


def adaptive_policy(path: Path, max_draft_len: int | None):
    """The adaptive mode's policy (runtime/adaptive.py): the cost model at `path`, K at most
    max_draft_len (None: every K the cost model profiled)."""
    from dynspec.runtime.adaptive import load_policy

    return load_policy(path, max_draft_len)


def policy_label(policy) -> str:
    """A schedule's CLI form ('24:3,179:1'); 'adaptive' for the adaptive policy."""
    return policy.to_spec() if isinstance(policy, DraftSchedule) else "adaptive"


def shift_of(model) -> dict | None:
    """{"key": K, "before": p0, "after": p1} of a shift resolved at a key; None for other models."""
    if all(hasattr(model, f) for f in ("before", "after", "at")) and isinstance(model.at, int):
        return {"key": model.at, "before": model.before, "after": model.after}
    return None


@dataclass(frozen=True)
class LoadPoint:
    concurrency: int | None = None       # closed loop
    request_rate: float | None = None    # open loop (req/s per replica)
    matched_concurrency: int | None = None   # open loop at the closed loop's measured load at this C

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"C={self.concurrency}"
        at = f" (~C={self.matched_concurrency})" if self.matched_concurrency is not None else ""
        return f"rate={self.request_rate:.3g}/s{at}"


def load_points(concurrency: Sequence[int], rates: Sequence[float]) -> tuple[LoadPoint, ...]:
    return tuple(LoadPoint(concurrency=c) for c in concurrency) + tuple(LoadPoint(request_rate=r) for r in rates)


@dataclass(frozen=True)
class RequestCount:
    """Requests per replica at a load point: `fixed`, else max(minimum, ceil(waves * C)), with
    waves_at's waves at its C's (((256, 3.0),): C=256 runs 3 waves, the rest `waves`).

    Closed loop with equal lengths: one wave of C requests runs at batch C throughout; the
    second wave lets finishing times desynchronise (Bernoulli / real acceptance).
    Open loop: max(minimum, ceil(waves * 10 * rate)) (about waves x 10 s of arrivals)."""

    fixed: int | None = None
    waves: float = 2.0
    minimum: int = 4
    waves_at: tuple[tuple[int, float], ...] = ()

    def at(self, p: LoadPoint) -> int:
        if self.fixed is not None:
            return self.fixed
        if p.matched_concurrency is not None:          # the closed loop's requests, now arriving
            return self.at(LoadPoint(concurrency=p.matched_concurrency))
        load = p.concurrency if p.concurrency is not None else 10 * p.request_rate
        waves = dict(self.waves_at).get(p.concurrency, self.waves) if p.concurrency is not None else self.waves
        return max(self.minimum, math.ceil(waves * load))

    def __str__(self) -> str:
        if self.fixed is not None:
            return str(self.fixed)
        at = "".join(f", {w:g} at C={c}" for c, w in self.waves_at)
        return f"max({self.minimum}, ceil({self.waves:g} x C){at})"


def parse_waves_at(spec: str | None, concurrencies: Sequence[int]) -> tuple[tuple[int, float], ...]:
    """'256:3' -> ((256, 3.0),); every C must be one of --concurrency, every waves positive."""
    if not spec:
        return ()
    out = {}
    for item in spec.split(","):
        c, sep, w = item.strip().partition(":")
        try:
            c_i, w_f = int(c), float(w)
        except ValueError:
            c_i, w_f = None, None
        if not sep or c_i is None or not math.isfinite(w_f) or w_f <= 0:
            raise DynspecError(f"--waves-at {spec!r}: {item.strip()!r} is not C:WAVES with WAVES > 0 (e.g. 256:3)")
        if c_i not in concurrencies:
            raise DynspecError(f"--waves-at {spec!r}: C={c_i} is not one of --concurrency {list(concurrencies)}")
        if c_i in out:
            raise DynspecError(f"--waves-at {spec!r}: C={c_i} given twice")
        out[c_i] = w_f
    return tuple(sorted(out.items()))


def make_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="python -m dynspec.benchmarks.sweep", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
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
                        " dynamic (the schedule) and adaptive (the cost model's policy, runtime/adaptive.py)")
    g.add_argument("--cost-model", metavar="FILE",
                   help="adaptive mode: the cost model, a profile.json (default: ENGINE_DIR/cost_model.json)")
    g.add_argument("--static-k", type=int, help="K of the static mode (default: the dynamic schedule's max K)")
    g.add_argument("--dynamic-schedule", metavar="SPEC|@FILE",
                   help="schedule of the dynamic mode, e.g. '4:4,8:2' or @schedule.txt from `dynspec tune`"
                        " (default: the engine's)")
    g.add_argument("--acceptance", default="real",
                   help="real (greedy, lossless) | bernoulli:P | bernoulli-mix:P1@W1,P2@W2 (each request's P by a hash"
                        " of its id) | shift:P1,P2@AT (P1 before request AT, a key or a fraction of the load"
                        " point's requests; P2 after): labelled models for random-weight checkpoints")
    g.add_argument("--keep-warm", choices=("engine", "on", "off"), default="engine",
                   help="dynamic mode: keep the draft warm while K=0 (default: the engine dir's setting)")
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


@dataclass(frozen=True)
class SweepSpec:
    """Everything the sweep was asked to do, resolved from flags (the same on every rank)."""

    engine: str
    modes: tuple[str, ...]
    points: tuple[LoadPoint, ...]
    schedules: tuple[tuple[str, DraftSchedule], ...]
    keep_warm: tuple[tuple[str, bool], ...]
    acceptance: object
    requests: tuple               # the whole seeded workload (BenchRequest)
    workload: str                 # description for the env block
    count: RequestCount
    poisson_at: tuple[int, ...]   # closed-loop C's that get a matched open-loop point
    trials: int
    warmup_requests: int
    seed: int
    max_batch_size: int
    max_seq_len: int
    max_draft_len: int
    cost_model: str | None = None   # the adaptive mode's profile.json


def check_flags(args: argparse.Namespace) -> None:
    """The cheap checks, before any model is touched."""
    from dynspec.benchmarks.workload import LengthDist
    from dynspec.runtime.acceptance import parse_acceptance

    modes = parse_modes(args.modes)
    if args.engine == "trtllm" and any(overlapped(m) for m in modes):
        raise DynspecError(f"--modes {args.modes!r}: {OVERLAP} is the reference executor's overlapped loop;"
                           f" --engine trtllm runs its own loop (modes {', '.join(TRTLLM_MODES)})")
    if args.engine == "trtllm" and set(modes) - set(TRTLLM_MODES):
        raise DynspecError(f"--modes {args.modes!r}: --engine trtllm runs {', '.join(TRTLLM_MODES)} only")
    if any(base_mode(m) == "adaptive" for m in modes):
        cost_model_path(args)
    if args.tp != 1 and args.engine == "trtllm":
        raise DynspecError(f"--tp {args.tp} is the reference engine's; TensorRT-LLM takes its TP from the engine dir "
                           f"(mpirun -n N trtllm-llmapi-launch ...)")
    if args.concurrency.strip():
        int_list(args.concurrency, "--concurrency")
    if args.request_rate.strip():
        float_list(args.request_rate, "--request-rate")
    if poisson_at(args) and args.engine == "trtllm":
        raise DynspecError(f"--poisson-at {args.poisson_at!r}: the TensorRT-LLM driver runs closed loops only")
    if not args.dataset:
        LengthDist.parse(args.input_len, "--input-len")
        LengthDist.parse(args.output_len, "--output-len")
    parse_acceptance(args.acceptance)
    if args.dynamic_schedule:
        read_schedule_arg(args.dynamic_schedule)


def poisson_at(args: argparse.Namespace) -> tuple[int, ...]:
    """--poisson-at C's, each one of the closed-loop --concurrency values."""
    if not args.poisson_at.strip():
        return ()
    cs = int_list(args.poisson_at, "--poisson-at")
    conc = int_list(args.concurrency, "--concurrency") if args.concurrency.strip() else ()
    missing = [c for c in cs if c not in conc]
    if missing:
        raise DynspecError(f"--poisson-at {args.poisson_at!r}: C={missing[0]} is not one of --concurrency {args.concurrency!r}")
    return tuple(dict.fromkeys(cs))


def matched_rate(trial_metrics: Sequence, world_size: int) -> float:
    """Poisson rate per replica at the closed loop's mean load: the median trial's requests/s
    over all replicas / replicas. Trials at 10.0, 12.0, 11.0 req/s on 2 replicas -> 5.5 req/s."""
    return median_trial(trial_metrics).requests_per_s / world_size


def load_plan(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[LoadPoint, ...], RequestCount]:
    """(--concurrency, the load points, the requests per replica at each): what resolve() sweeps
    and closed_loop_floor() re-derives from a recorded command."""
    conc = int_list(args.concurrency, "--concurrency") if args.concurrency.strip() else ()
    rates = float_list(args.request_rate, "--request-rate") if args.request_rate.strip() else ()
    points = load_points(conc, rates)
    if not points:
        raise DynspecError("nothing to sweep: give --concurrency and/or --request-rate")
    if args.num_requests is not None and args.num_requests < 1:
        raise DynspecError(f"--num-requests {args.num_requests} must be at least 1")
    if args.waves <= 0 or args.min_requests < 1:
        raise DynspecError(f"--waves {args.waves} must be positive and --min-requests {args.min_requests} at least 1")
    if args.num_requests is not None and args.waves_at:
        raise DynspecError(f"--waves-at {args.waves_at!r} with --num-requests {args.num_requests}: a fixed count has no waves")
    return conc, points, RequestCount(args.num_requests, args.waves, args.min_requests,
                                      parse_waves_at(args.waves_at, conc))


def resolve(args: argparse.Namespace, w: World, cfg) -> SweepSpec:
    from dynspec.benchmarks.engines import target_vocab_size
    from dynspec.benchmarks.workload import check_fits, write_jsonl
    from dynspec.runtime.acceptance import parse_acceptance

    modes = parse_modes(args.modes)
    conc, points, count = load_plan(args)
    if args.trials < 1:
        raise DynspecError(f"--trials {args.trials} must be at least 1")
    max_b = max(conc) if conc else cfg.reference.max_batch_size
    dynamic = read_schedule_arg(args.dynamic_schedule) if args.dynamic_schedule else cfg.schedule
    schedules: dict = mode_schedules(modes, dynamic, args.static_k, max_b)
    kmax = max([s.max_draft_len for s in schedules.values()] + [1])
    cost_model = None
    if any(base_mode(m) == "adaptive" for m in modes):
        cost_model = cost_model_path(args)
        kmax = max([kmax, *adaptive_policy(cost_model, None).candidates])
        for m in modes:
            if base_mode(m) == "adaptive":
                schedules[m] = adaptive_policy(cost_model, kmax)     # kmax: the engine's max_draft_len
        schedules = {m: schedules[m] for m in modes}
    engine_warm = cfg.reference.keep_warm if args.keep_warm == "engine" else args.keep_warm == "on"
    # baseline never drafts, so it never keeps the draft warm (it still runs the draft over prompt
    # chunks: the mixed graphs are shared between modes); static never reaches K=0
    keep_warm = {m: (False if base_mode(m) == "baseline" else engine_warm) for m in modes}
    acceptance = parse_acceptance(args.acceptance, seed=args.seed)

    per_point = max(count.at(p) for p in points)
    if per_point > MAX_REQUESTS:
        raise DynspecError(f"{per_point} requests per replica at one load point ({count}) exceed {MAX_REQUESTS}; "
                           f"lower --waves, --concurrency or --num-requests")
    vocab = target_vocab_size(cfg)
    reqs, desc = make_workload(cfg, args.dataset, args.prompts, args.input_len, args.output_len,
                               per_point * w.size, args.seed)
    if args.save_workload and w.is_root:
        write_jsonl(args.save_workload, reqs)
    desc += f"; {count} requests per replica per load point"
    longest = max(r.input_len + r.output_tokens for r in reqs)
    max_seq = longest + cache_slack(kmax, any(overlapped(m) for m in modes))
    if args.max_seq_len is not None:
        check_overlap_fits(modes, longest, kmax, args.max_seq_len)
        if args.max_seq_len < max_seq:
            raise DynspecError(f"--max-seq-len {args.max_seq_len} is below the {max_seq} positions the workload needs")
        max_seq = args.max_seq_len
    check_fits(reqs, max_seq, kmax, vocab, where=args.dataset or "synthetic workload")
    return SweepSpec(args.engine, modes, points, tuple(schedules.items()), tuple(keep_warm.items()), acceptance,
                     reqs, desc, count, poisson_at(args), args.trials, args.warmup_requests, args.seed, max_b, max_seq, kmax,
                     None if cost_model is None else str(cost_model))


def check_overlap_fits(modes: Sequence[str], longest: int, max_draft_len: int, max_seq_len: int) -> None:
    """An overlapped mode's requests need cache_slack(K, True) = 2 (K + 1) positions past prompt +
    output (runtime/overlap.py), K the engine's max_draft_len: longest 416, K 7, --max-seq-len 424 ->
    "... needs --max-seq-len 432 ...". One line, before anything runs."""
    over = [m for m in modes if overlapped(m)]
    need = longest + cache_slack(max_draft_len, True)
    if over and max_seq_len < need:
        raise DynspecError(f"--max-seq-len {max_seq_len} is too short for the overlapped loop of {over[0]}: its requests"
                           f" need prompt + output {longest} + {cache_slack(max_draft_len, True)} (2 x (K {max_draft_len}"
                           f" + 1)) = {need} positions; give --max-seq-len {need}")


def check_engine_overlap(plans: Sequence["PlannedSweep"]) -> None:
    """check_overlap_fits for every planned sweep at the one engine's K and cache length (the
    largest of any case's: sweep_cases.engine_sizes), naming the case."""
    kmax = max(p.spec.max_draft_len for p in plans)
    seq = max(p.spec.max_seq_len for p in plans)
    for p in plans:
        try:
            check_overlap_fits(p.spec.modes, max(r.input_len + r.output_tokens for r in p.spec.requests), kmax, seq)
        except DynspecError as e:
            raise DynspecError(f"case {p.case.name!r}: {e}" if p.case.name else str(e)) from None


def make_workload(cfg, dataset: str | None, prompts: str, input_len: str, output_len: str, n: int,
                  seed: int) -> tuple[tuple, str]:
    """(requests, description): a JSONL dataset, or n seeded synthetic requests whose tokens are
    uniform random ids ('random') or windows of held-out Python stdlib text ('stdlib')."""
    from dynspec.benchmarks.engines import target_tokenizer, target_vocab_size
    from dynspec.benchmarks.workload import LengthDist, load_jsonl, synthetic

    if dataset:
        reqs = load_jsonl(dataset, target_tokenizer(cfg))
        return reqs, f"dataset {dataset} ({len(reqs)} requests)"
    il = LengthDist.parse(input_len, "--input-len")
    ol = LengthDist.parse(output_len, "--output-len")
    if prompts == "stdlib":
        from dynspec.benchmarks.workload import stdlib_token_streams, text_windows

        tok = target_tokenizer(cfg)
        if tok is None:
            raise DynspecError(f"--prompts stdlib needs a tokenizer in the target dir {cfg.target_dir}")
        reqs = text_windows(stdlib_token_streams(tok), n, il, ol, seed=seed)
        return reqs, f"held-out Python stdlib text windows: input_len {il}, output_len {ol}, seed {seed}"
    vocab = target_vocab_size(cfg)
    if vocab is None:
        raise DynspecError(f"target {cfg.target_dir}/config.json has no vocab_size; give --dataset instead")
    return synthetic(n, il, ol, vocab, seed=seed), \
        f"synthetic: input_len {il}, output_len {ol}, seed {seed}, uniform random token ids"


def closed_loop_floor(env: Mapping, row: Mapping) -> int | None:
    """The fewest iterations a sweep row's closed loop could have run (workload.closed_loop_iterations,
    lag 1 in the overlapped loop), from the seeded workload its env["command"] names: the lengths
    follow from the request count and the seed. None for a dataset, an open loop, more than one
    replica, TensorRT-LLM, a row that drafted or does not say (mean_k > 0 or absent: more than one
    token a row an iteration), or a command this parser does not read.
    Example: outputs 32:224 over 6 waves, --concurrency 64,256 -> 1536 requests drawn, C=64 runs the
    first 384: 912 iterations (917 overlapped)."""
    import contextlib
    import io

    from dynspec.benchmarks.workload import LengthDist, closed_loop_iterations, synthetic_lengths, take

    cmd = shlex.split(env.get("command") or "")
    c = row.get("concurrency")
    if (c is None or row.get("replicas", 1) != 1 or row.get("mean_k") != 0 or env.get("engine", "reference") != "reference"
            or "dynspec.benchmarks.sweep" not in cmd):
        return None
    try:
        with contextlib.redirect_stderr(io.StringIO()):           # argparse's usage text, on a refusal
            args = make_parser().parse_args(cmd[cmd.index("dynspec.benchmarks.sweep") + 1:])
    except SystemExit:
        return None
    if args.dataset or args.engine != "reference":
        return None
    try:
        _, points, count = load_plan(args)
        _, outs, _ = synthetic_lengths(max(count.at(p) for p in points), LengthDist.parse(args.input_len),
                                       LengthDist.parse(args.output_len), args.seed)
    except DynspecError:
        return None
    mine = take(outs.tolist(), count.at(LoadPoint(concurrency=c)))     # rank 0's shard, as run_reference takes it
    return closed_loop_iterations(mine, c, lag=int(row.get("loop") == "overlap"))


def command_line(argv: Sequence[str], world_size: int) -> str:
    """How this run was launched, as a copy-pasteable line (mpirun's own flags are not visible here)."""
    base = "python -m dynspec.benchmarks.sweep " + shlex.join(list(argv))
    return f"mpirun -n {world_size} {base}" if world_size > 1 else base


def open_engine(specs: Sequence[SweepSpec], cfg, device: str, tp=None):
    """The reference engine sized for every spec (sweep_cases.engine_sizes; tp: this rank's
    TpContext, for its shard), with the union of every spec's modes' reachable CUDA graphs
    captured once (every mode's executor shares it). Under TP every rank of a replica captures
    the same keys in the same order."""
    from dynspec.benchmarks.profile import open_sized
    from dynspec.benchmarks.sweep_cases import engine_sizes, graph_keys
    from dynspec.runtime.session import capture

    sizes = engine_sizes(specs)
    engine = open_sized(cfg, device=device, tp=tp, **sizes)
    log(f"opened the reference engine: max batch {sizes['max_batch_size']}, cache {sizes['max_seq_len']} positions,"
        f" K <= {sizes['max_draft_len']}" + (f", for {len(specs)} sweeps" if len(specs) > 1 else ""))
    if str(engine.device).startswith("cuda"):
        n = capture(engine, graph_keys(specs, engine.max_batch_size, engine.max_num_tokens), cfg.reference)
        log(f"captured {n} CUDA graphs per replica")
    return engine


def open_for_rank(specs: Sequence[SweepSpec], cfg, device: str, w: World, threads: int | None = None):
    """This rank's engine without TP: its device (cuda:<local rank> for --device cuda), its CPU threads."""
    import torch

    from dynspec.benchmarks.engines import device_for_rank, set_cpu_threads

    dev = device_for_rank(device, w.local_rank)
    set_cpu_threads(threads, dev)
    if dev.startswith("cuda"):
        torch.cuda.set_device(torch.device(dev))
    return open_engine(specs, cfg, dev)


def run_reference(spec: SweepSpec, cfg, device: str, w: World, progress: bool, threads: int | None = None,
                  on_rows=None, engine=None, label: str = "sweep") -> list[dict]:
    """Every rank of w: run every (load point, mode); w's rank 0 returns the rows (others return []).
    on_rows(rows so far) runs on rank 0 after each load point (a killed sweep keeps what finished).
    engine: already open (a TP leader's LeaderEngine, w then holds the leaders only; or one engine
    shared by several sweeps, open_engine). label: the progress bar's."""
    import torch

    from dynspec.benchmarks.loadgen import closed_loop, open_loop
    from dynspec.benchmarks.metrics import summarize
    from dynspec.benchmarks.workload import take
    from dynspec.runtime.acceptance import resolve as resolve_acceptance
    from dynspec.runtime.executor import Executor
    from dynspec.runtime.gc_heap import freeze_heap

    schedules, warm = dict(spec.schedules), dict(spec.keep_warm)
    if engine is None:
        engine = open_for_rank([spec], cfg, device, w, threads)

    def executor(mode: str, n: int) -> "StepTrace":
        """A fresh executor (its request ids, the acceptance keys, count from 0) for a run of n
        requests, through the mode's loop (serial, or overlapped for a '+overlap' mode)."""
        return StepTrace(Executor(engine, schedules[mode], keep_warm=warm[mode],
                                  acceptance=resolve_acceptance(spec.acceptance, n), allow_lossy=True,
                                  overlap=overlapped(mode)), adaptive=base_mode(mode) == "adaptive")

    def closed(ex, reqs, c, progress=None):
        """closed_loop, then (overlapped) the iteration still in flight read back, outside the timing."""
        rec = closed_loop(ex, reqs, c, progress=progress)
        ex.run_until_idle()
        return rec

    if spec.warmup_requests > 0:
        # untimed: every mode at batch 1 and at the largest concurrency (short outputs), so
        # first-use costs (allocator growth, kernel selection) stay out of the first timed run
        top = max([p.concurrency for p in spec.points if p.concurrency is not None] + [1])
        short = [replace(r, output_tokens=min(r.output_tokens, 8)) for r in spec.requests]
        for m in spec.modes:
            closed(executor(m, spec.warmup_requests), take(short, spec.warmup_requests), 1)
            if top > 1:
                closed(executor(m, top), take(short, top), top)
        log(f"warmed up: {spec.warmup_requests} requests at C=1" + (f" and {top} at C={top}" if top > 1 else "")
            + " per mode")

    bar = None
    if progress and w.is_root:
        from tqdm import tqdm

        total = (sum(spec.count.at(p) for p in spec.points)
                 + sum(spec.count.at(LoadPoint(concurrency=c)) for c in spec.poisson_at)) * len(spec.modes) * spec.trials
        bar = tqdm(total=total, unit="req", desc=label, dynamic_ncols=True, file=sys.stderr)

    def run_point(p: LoadPoint) -> list:
        """Every trial of every mode at p on this rank: [(p, mode, trial, RunRecord, steps)], steps the
        adaptive mode's per-iteration records (ADAPTIVE_FIELDS), () for the other modes."""
        n = spec.count.at(p)
        mine = take(spec.requests, n, w.rank * n)
        out = []
        for t in range(spec.trials):
            # rotate the mode order per trial, so drift over time does not favour one mode
            for m in spec.modes[t % len(spec.modes):] + spec.modes[: t % len(spec.modes)]:
                if bar is not None:
                    bar.set_postfix_str(f"{p.label} {m}" + (f" trial {t + 1}" if spec.trials > 1 else ""))
                torch.manual_seed(spec.seed + w.rank)     # Bernoulli draws: the same stream for every run
                traced = executor(m, n)
                freeze_heap()       # untimed: earlier runs' records out of the collector's walk (runtime/gc_heap.py)
                w.barrier()
                cb = bar.update if bar is not None else None
                if p.concurrency is not None:
                    rec = closed_loop(traced, mine, p.concurrency, progress=cb)
                else:
                    rec = open_loop(traced, mine, p.request_rate, seed=spec.seed + w.rank, progress=cb)
                traced.run_until_idle()          # overlapped: the last launch read back, after the timing
                out.append((p, m, t, rec, traced.steps, traced.overlapped))
        return out

    def point_rows(records: list) -> list[dict]:
        """Rows of the finished load points (rank 0; [] elsewhere): the median trial + spread per mode."""
        gathered = w.gather(records)
        if not w.is_root:
            return []
        trials: dict[tuple, list] = {}
        steps: dict[tuple, list] = {}
        overlapped_its: dict[tuple, list] = {}
        for i, (p, m, t, *_) in enumerate(records):
            trials.setdefault((p, m), []).append(summarize((rank_records[i][3] for rank_records in gathered),
                                                           p.concurrency))
            steps.setdefault((p, m), []).append([list(rank_records[i][4]) for rank_records in gathered])
            overlapped_its.setdefault((p, m), []).append(sum(rank_records[i][5] for rank_records in gathered))
        rows = []
        for p in dict.fromkeys(p for p, _ in trials):
            for m in spec.modes:
                mets = trials[(p, m)]
                med = median_trial(mets)
                row = make_row(p, m, spec, schedules[m], warm[m], med, w.size)
                row.update(trial_fields(mets), overlapped_iterations=overlapped_its[(p, m)][mets.index(med)])
                if base_mode(m) == "adaptive":
                    row.update(adaptive_fields(steps[(p, m)], resolve_acceptance(spec.acceptance, spec.count.at(p))))
                rows.append(row)
        return rows

    rows: list[dict] = []
    ref_mode = "baseline" if "baseline" in spec.modes else spec.modes[0]
    for p in spec.points:
        done = run_point(p)
        if p.concurrency in spec.poisson_at:
            # rate = what the reference mode sustained here, agreed on by every rank
            ref = w.gather([rec for q, m, _, rec, *_ in done if m == ref_mode])
            rate = w.bcast(matched_rate([summarize(trial) for trial in zip(*ref)], w.size) if w.is_root else None)
            done += run_point(LoadPoint(request_rate=rate, matched_concurrency=p.concurrency))
        rows += point_rows(done)
        if on_rows is not None and w.is_root:
            on_rows(rows)
    if bar is not None:
        bar.close()
    return rows


# one adaptive iteration: K, the acceptance estimate's position 1 the decision used (None before any),
# 1 for a probe step, the policy's host time (us), the smallest request key among the decode rows,
# the engine step (us), the decode rows
ADAPTIVE_FIELDS = ("k", "acceptance1", "probe", "policy_us", "oldest_key", "step_us", "batch_size", "policy_exposed_us")


class StepTrace:
    """Wraps an Executor: forwards everything; step() counts the iterations the overlapped loop
    ran (`overlapped`) and, with adaptive=True, keeps each decode iteration's ADAPTIVE_FIELDS
    (IterationStats of the adaptive policy) in `steps`, compact tuples."""

    def __init__(self, executor, adaptive: bool = True):
        self._ex, self._adaptive = executor, adaptive
        self.steps: list[tuple] = []
        self.overlapped = 0

    def __getattr__(self, name):
        return getattr(self._ex, name)

    def step(self):
        st = self._ex.step()
        if st is not None:
            self.overlapped += bool(getattr(st, "overlapped", False))
            if self._adaptive and st.batch_size > 0:
                self.steps.append(adaptive_record(st))
        return st




def adaptive_record(st) -> tuple:
    """IterationStats -> (k, acceptance1, probe, policy_us, oldest_key, step_us, batch_size,
    policy_exposed_us): K=2, acceptance (0.61234, 0.4), probe False, policy 21.5e-6 s, oldest 7,
    step 0.0123 s, b=4, exposed 9.25e-6 s -> (2, 0.6123, 0, 21.5, 7, 12300.0, 4, 9.2)."""
    acc = tuple(getattr(st, "acceptance", ()) or ())
    return (st.k, round(float(acc[0]), 4) if acc else None, int(bool(getattr(st, "probe", False))),
            round(1e6 * float(getattr(st, "policy_seconds", 0.0)), 1), getattr(st, "oldest_key", None),
            round(1e6 * st.seconds, 1), st.batch_size,
            round(1e6 * float(getattr(st, "policy_exposed_seconds", getattr(st, "policy_seconds", 0.0))), 1))


def adaptive_fields(trial_steps: Sequence, acceptance) -> dict:
    """The adaptive row's per-iteration records: {"adaptive_steps": {"fields", "trials": [trial
    [replica [iteration record]]]}} and, under a shift, "shift": its key and rates at this point."""
    out = {"adaptive_steps": {"fields": list(ADAPTIVE_FIELDS), "trials": [list(t) for t in trial_steps]}}
    sh = shift_of(acceptance)
    if sh is not None:
        out["shift"] = sh
    return out


def trial_fields(mets: Sequence) -> dict:
    """Per-mode spread over trials: tok/s of every trial, min and max (the row itself is the median trial).

    Trials at 90, 100, 95 tok/s -> output_tok_per_s 95 (median run), tok_per_s_min 90, tok_per_s_max 100."""
    tps = [x.output_tok_per_s for x in mets]
    return {"trials": len(mets), "trial_tok_per_s": tps, "tok_per_s_min": min(tps), "tok_per_s_max": max(tps),
            "trial_p99_ttft_s": [x.p99_ttft_s for x in mets],
            "trial_steady_tok_per_s": [x.steady_tok_per_s for x in mets],
            "trial_sustained_tok_per_s": [x.sustained_tok_per_s for x in mets]}


def median_trial(mets: Sequence):
    """The trial with the median throughput (the lower middle one for an even count)."""
    return sorted(mets, key=lambda x: x.output_tok_per_s)[(len(mets) - 1) // 2]


def make_row(p: LoadPoint, mode: str, spec: SweepSpec, schedule: DraftSchedule, keep_warm: bool, met, world_size: int) -> dict:
    row = {
        "mode": mode,
        "loop": loop_of(mode),             # serial | overlap: the executor loop the mode ran
        "concurrency": p.concurrency,
        "total_concurrency": None if p.concurrency is None else p.concurrency * world_size,
        "request_rate": p.request_rate,
        "matched_concurrency": p.matched_concurrency,
        "acceptance_model": str(spec.acceptance),
        "schedule": policy_label(schedule),
        "policy": "schedule" if isinstance(schedule, DraftSchedule) else "adaptive",
        "keep_warm": keep_warm,
    }
    row.update(met.to_json())
    return row


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
        "schedules": {m: s.to_spec() for m, s in spec.schedules if isinstance(s, DraftSchedule)},
        "adaptive": None if spec.cost_model is None else {"cost_model": spec.cost_model},
        "keep_warm": dict(spec.keep_warm),
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
    from dynspec.runtime.distributed import layout, run_replica

    apply_bench_env()
    runs = case_runs(args, argv)                           # every case's flags checked, before any model
    if args.engine == "trtllm":
        from dynspec.benchmarks.trtllm_driver import run_trtllm_sweep

        return run_trtllm_sweep(args, argv)
    t0 = time.perf_counter()
    first = runs[0].args                                   # its SHARED_FLAGS are every case's
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    try:
        code = run(args, argv)
    except DynspecError as e:
        log(f"error: {e}", all_ranks=True)
        code = 2
    from dynspec.runtime.distributed import exit_status

    return exit_status(code)


if __name__ == "__main__":
    sys.exit(main())
