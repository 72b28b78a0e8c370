"""What a sweep runs, resolved from its flags before any engine opens: the load points, the
requests per replica at each, the modes' policies and the seeded workload (SweepSpec, the same
on every rank). closed_loop_floor re-derives a recorded sweep's workload from its command line."""
from __future__ import annotations

import argparse
import math
import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

from dynspec.benchmarks.flags import float_list, int_list
from dynspec.benchmarks.mpi import World
from dynspec.benchmarks.sweep_args import make_parser
from dynspec.benchmarks.sweep_modes import (COST_MODES, LOOP_SUFFIXES, TRTLLM_MODES, base_mode, cost_model_path,
                                            mode_loops, mode_policies, parse_modes, price_catch_ups, read_schedule_arg,
                                            split_mode, policy_prices)
from dynspec.errors import DynspecError
from dynspec.runtime.serving.loop import Loop
from dynspec.runtime.serving.overlap import cache_slack
from dynspec.runtime.policy import DraftSchedule


MAX_REQUESTS = 1_000_000      # per replica per load point: the workload is built in memory up front


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


@dataclass(frozen=True)
class SweepSpec:
    """Everything the sweep was asked to do, resolved from flags (the same on every rank)."""

    engine: str
    modes: tuple[str, ...]
    points: tuple[LoadPoint, ...]
    schedules: tuple[tuple[str, DraftSchedule], ...]
    draft_sync: tuple[tuple[str, str], ...]   # mode -> "lazy" | "warm" | "off" (baseline: off)
    loops: tuple[tuple[str, Loop], ...]       # the executor loop each mode runs (sweep_modes.mode_loop)
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
    step_prices: object = None           # the cost-model modes' StepPrices (sweep_modes.policy_prices; None: none)
    ttft_weight: float | None = None     # the cost-model modes' weight of a finishing prompt (None: default)


def check_flags(args: argparse.Namespace) -> None:
    """The cheap checks, before any model is touched."""
    from dynspec.benchmarks.workload import LengthDist
    from dynspec.runtime.policy.acceptance import parse_acceptance

    modes = parse_modes(args.modes)
    named = [split_mode(m)[1] for m in modes if split_mode(m)[1]]
    if args.engine == "trtllm" and named:
        raise DynspecError(f"--modes {args.modes!r}: {named[0]} is the reference executor's "
                           f"{LOOP_SUFFIXES[named[0]].value} loop; --engine trtllm runs its own loop"
                           f" (modes {', '.join(TRTLLM_MODES)})")
    if args.engine == "trtllm" and set(modes) - set(TRTLLM_MODES):
        raise DynspecError(f"--modes {args.modes!r}: --engine trtllm runs {', '.join(TRTLLM_MODES)} only")
    if any(base_mode(m) in COST_MODES for m in modes):
        cost_model_path(args)
    if args.tp != 1 and args.engine == "trtllm":
        raise DynspecError(f"--tp {args.tp} is the reference engine's; TensorRT-LLM takes its TP from the engine dir "
                           f"(mpirun -n N trtllm-llmapi-launch ...)")
    if args.prefill_k is not None:
        from dynspec.runtime.policy.prefill_cap import parse_cap

        if args.engine == "trtllm":
            raise DynspecError(f"--prefill-k {args.prefill_k}: TensorRT-LLM's dynamic draft length reads the batch"
                               " size alone (reference engine only)")
        parse_cap(args.prefill_k)
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


def draft_sync_of(args: argparse.Namespace, engine_sync: str) -> str:
    """The drafting modes' draft sync from the sweep's flags: --keep-warm on/off (the former flag:
    on = warm, off = off), else --draft-sync, whose "engine" is the engine dir's (`engine_sync`)."""
    if args.keep_warm != "engine":
        return "warm" if args.keep_warm == "on" else "off"
    return engine_sync if args.draft_sync == "engine" else args.draft_sync


def resolve(args: argparse.Namespace, w: World, cfg) -> SweepSpec:
    from dynspec.benchmarks.engines import target_vocab_size
    from dynspec.benchmarks.workload import check_fits, write_jsonl
    from dynspec.runtime.policy.acceptance import parse_acceptance

    modes = parse_modes(args.modes)
    conc, points, count = load_plan(args)
    if args.trials < 1:
        raise DynspecError(f"--trials {args.trials} must be at least 1")
    max_b = max(conc) if conc else cfg.reference.max_batch_size
    dynamic = read_schedule_arg(args.dynamic_schedule) if args.dynamic_schedule else cfg.schedule
    cost_model = cost_model_path(args) if any(base_mode(m) in COST_MODES for m in modes) else None
    prices = policy_prices(args, cost_model) if cost_model is not None else None
    cap = None if args.engine == "trtllm" else cfg.prefill_k if args.prefill_k is None else args.prefill_k
    schedules, kmax = mode_policies(modes, dynamic, args.static_k, max_b, cost_model, prices, args.ttft_weight,
                                    cap)   # kmax: the engine's max_draft_len
    price_catch_ups(schedules, args.catch_up_price)
    sync = draft_sync_of(args, cfg.reference.draft_sync)
    # baseline never drafts, so it never keeps the draft warm (it still runs the draft over prompt
    # chunks: the mixed graphs are shared between modes); static never reaches K=0
    draft_sync = {m: ("off" if base_mode(m) == "baseline" else sync) for m in modes}
    # a mode without a loop suffix runs the executor's serving loop on this device (TensorRT-LLM: its own)
    loops = mode_loops(modes, Loop.SERIAL if args.engine == "trtllm" else cfg.reference.loop(args.device))
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
    max_seq = longest + cache_slack(kmax, widest_loop(loops))
    if args.max_seq_len is not None:
        check_overlap_fits(loops, longest, kmax, args.max_seq_len)
        if args.max_seq_len < max_seq:
            raise DynspecError(f"--max-seq-len {args.max_seq_len} is below the {max_seq} positions the workload needs")
        max_seq = args.max_seq_len
    check_fits(reqs, max_seq, kmax, vocab, where=args.dataset or "synthetic workload")
    return SweepSpec(args.engine, modes, points, tuple(schedules.items()), tuple(draft_sync.items()),
                     tuple(loops.items()), acceptance,
                     reqs, desc, count, poisson_at(args), args.trials, args.warmup_requests, args.seed, max_b, max_seq, kmax,
                     None if cost_model is None else str(cost_model), prices,
                     None if cost_model is None else _ttft_weight(schedules))


def widest_loop(loops: Mapping[str, Loop]) -> Loop:
    """The loop whose cache slack the engine needs (runtime/serving/overlap.py): OVERLAPPED if any mode runs it."""
    return Loop.OVERLAPPED if Loop.OVERLAPPED in loops.values() else Loop.SERIAL


def check_overlap_fits(loops: Mapping[str, Loop], longest: int, max_draft_len: int, max_seq_len: int) -> None:
    """A mode of the overlapped loop (loops: mode -> its loop) needs cache_slack(K, OVERLAPPED) =
    2 (K + 1) positions past prompt + output (runtime/serving/overlap.py), K the engine's max_draft_len:
    longest 416, K 7, --max-seq-len 424 -> "... needs --max-seq-len 432 ...". One line, before
    anything runs."""
    over = [m for m, loop in loops.items() if loop is Loop.OVERLAPPED]
    slack = cache_slack(max_draft_len, Loop.OVERLAPPED)
    need = longest + slack
    if over and max_seq_len < need:
        raise DynspecError(f"--max-seq-len {max_seq_len} is too short for the overlapped loop of {over[0]}: its requests"
                           f" need prompt + output {longest} + {slack} (2 x (K {max_draft_len}"
                           f" + 1)) = {need} positions; give --max-seq-len {need}")


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


def _ttft_weight(policies: dict) -> float | None:
    """The finishing-prompt weight the cost-model modes run with (prefill_price.py), as recorded."""
    return next((float(p.settings.ttft_weight) for p in policies.values() if hasattr(p, "settings")), None)
