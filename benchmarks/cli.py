"""`dynspec profile`, `dynspec tune` and `dynspec sweep` (= python -m dynspec.benchmarks.sweep).
Thin: parse flags, call the module that does the work, print."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def _command(word: str, args: argparse.Namespace) -> str:
    """The exact command line when run from a shell; rebuilt from the parsed flags when called in-process."""
    argv = sys.argv[1:]
    if word in argv and Path(sys.argv[0]).name in ("dynspec", "__main__.py", "cli.py"):
        return f"dynspec {word} " + shlex.join(argv[argv.index(word) + 1:])
    flags = []
    for k, v in sorted(vars(args).items()):
        if k in ("func", "command", "command_line") or k.startswith("_") or v is None or v is False:
            continue
        flags += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return f"dynspec {word} " + shlex.join(flags)


# ---- profile ----------------------------------------------------------------------------
def _cmd_profile(args: argparse.Namespace) -> int:
    from dynspec.artifacts import check_apart, check_writable, write_json
    from dynspec.benchmarks.engines import apply_bench_env, engine_choice, set_cpu_threads, versions
    from dynspec.runtime.generate.session import check_device
    from dynspec.benchmarks.mpi import log, world
    from dynspec.benchmarks.profile import run_profile
    from dynspec.benchmarks.flags import int_list
    from dynspec.benchmarks.sweep_plan import make_workload
    from dynspec.errors import DynspecError

    check_apart(args.out, {"--engine-dir": args.engine_dir, "--target": args.target, "--draft": args.draft,
                           "--dataset": args.dataset})
    check_writable(args.out)
    check_device(args.device)
    apply_bench_env()
    bs = int_list(args.batch_sizes, "--batch-sizes")
    try:
        ks = tuple(sorted({int(k) for k in args.draft_lens.split(",") if k.strip()}))
    except ValueError:
        raise DynspecError(f"--draft-lens {args.draft_lens!r} is not a comma-separated list of integers") from None
    if not ks or min(ks) < 0:
        raise DynspecError(f"--draft-lens {args.draft_lens!r} needs integers >= 0")
    ctxs = tuple(sorted(set(int_list(args.context_lens, "--context-lens"))))
    chunk_lens = tuple(sorted(set(int_list(args.chunk_lens, "--chunk-lens")))) if args.chunk_lens else ()
    if args.warmup < 0 or args.repeats < 1:
        raise DynspecError(f"--warmup {args.warmup} / --repeats {args.repeats}: need warmup >= 0 and repeats >= 1")
    set_cpu_threads(args.threads, args.device)
    choice = engine_choice(args)
    cfg = choice.config
    reqs, wdesc = None, None
    if args.measure_acceptance:
        reqs, wdesc = make_workload(cfg, args.dataset, args.prompts, args.input_len, args.output_len,
                                    args.num_requests, args.seed)
        reqs = reqs[: args.num_requests]
    bar = None
    if not args.no_progress and world().is_root:
        from tqdm import tqdm

        n_shapes = len(bs) * (len(set(ks) | {0}) * (1 + len(chunk_lens)) + 1)
        bar = tqdm(total=len(ctxs) * n_shapes * min(3, args.repeats), unit="run", desc="profile", file=sys.stderr)
    prof = run_profile(
        cfg, device=args.device, batch_sizes=bs, draft_lens=ks, context_lens=ctxs,
        warmup=args.warmup, repeats=args.repeats, acceptance_requests=reqs,
        acceptance_concurrency=args.acceptance_concurrency,
        meta={"engine_source": choice.source, "versions": versions(),
              "command": _command("profile", args),
              "acceptance_source": (None if reqs is None else
                                    f"greedy verification at static K={max(ks)} over {len(reqs)} requests: {wdesc}")},
        progress=bar.update if bar else None, max_seq_len=args.max_seq_len, floor=args.floor, tp=args.tp,
        allreduce=args.allreduce, chunk_lens=chunk_lens, catch_up=args.catch_up,
    )
    if bar:
        bar.close()
    if prof is None:              # a TP worker, or a leader other than world rank 0
        return 0
    write_json(args.out, prof.to_json())
    log(f"wrote {args.out}")
    for t in prof.tables:
        print(f"context {t.context_len}")
        print(f"{'b':>5} " + " ".join(f"{f'K={k} ms':>10}" for k in sorted(t.iteration_ms[min(t.iteration_ms)])))
        for b in sorted(t.iteration_ms):
            print(f"{b:>5} " + " ".join(f"{ms:>10.3f}" for _, ms in sorted(t.iteration_ms[b].items())))
        for c, rows in sorted((t.chunk_ms or {}).items()):
            print(f"  with a {c}-token chunk")
            for b in sorted(rows):
                print(f"{b:>5} " + " ".join(f"{ms:>10.3f}" for _, ms in sorted(rows[b].items())))
    if prof.per_position:
        print("acceptance per position:", ", ".join(f"{a:.3f}" for a in prof.per_position))
    _warn_falling(prof)
    floor = prof.meta.get("floor")
    if floor:
        print(f"GEMM floor {floor['gemm_floor_ms']:.3f} ms; decode at b=1, context {floor['context_len']}:"
              f" {floor['decode_ms']:.3f} ms = {floor['decode_vs_gemm_floor']:.2f}x the floor"
              + (f"; its graphs alone {floor['decode_graph_ms']:.3f} ms = {floor['decode_graph_vs_gemm_floor']:.2f}x"
                 if floor.get("decode_graph_ms") else ""))
    return 0


def _warn_falling(prof) -> None:
    """One stderr line per context whose steps fall as rows are added (ContextTable.falling)."""
    for t in prof.tables:
        if rows := t.falling():
            b, k, ms, b2, ms2 = max(rows, key=lambda r: r[2] / r[4])
            print(f"warning: profile context {t.context_len}: {len(rows)} (b, K) points take over 1.25x the step of "
                  f"a larger batch (worst b={b} K={k} {ms:.2f} ms against b={b2} {ms2:.2f} ms); a step does not "
                  f"get faster with more rows, so they were timed while the GPU was busy: profile again",
                  file=sys.stderr, flush=True)


# ---- tune -------------------------------------------------------------------------------
def _cmd_tune(args: argparse.Namespace) -> int:
    import json

    from dynspec.artifacts import check_apart, check_writable, read_json, write_json, write_text
    from dynspec.errors import DynspecError
    from dynspec.runtime.policy.cost_model import CostModel, Profile
    from dynspec.runtime.policy.tune import tune, with_chunks, with_prefill

    for flag, path in (("--out", args.out), ("--report", args.report), ("--vllm-grid", args.vllm_grid)):
        if path is not None:
            check_apart(path, {"--profile": args.profile}, out_flag=flag)
            check_writable(path, flag)
    raw = read_json(args.profile, "profile")
    prof = Profile.from_json(raw, where=str(args.profile))
    one = None if args.vllm_grid and args.context is None and not (args.out or args.report) \
        else prof.table(args.context, f"profile {args.profile}")       # the table --out / --report take
    budget = args.max_num_tokens if args.max_num_tokens is not None else raw.get("max_num_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        src = "--max-num-tokens" if args.max_num_tokens is not None else f"{args.profile}: field 'max_num_tokens'"
        raise DynspecError(f"{src} {budget!r} must be an integer of at least 1")
    acc, source = _tune_acceptance(args)
    _warn_falling(prof)
    tables = prof.tables if args.vllm_grid else (one,)
    prices = _tune_prices(args, prof.device)
    cost = None if args.chunk_share is None else CostModel.from_profile(prof, where=str(args.profile))

    def served(t):            # the steps as served: --chunk-share's chunks, or --prefill-ratio's prompts
        if prices is not None:
            return with_prefill(t.iteration_ms, acc, args.prefill_ratio, prices, raw.get("draft_sync") == "warm")
        return t.iteration_ms if cost is None else with_chunks(cost, t, args.chunk_share, args.chunk_tokens)

    results = [(t, tune(served(t), acc, args.max_draft_len, args.min_gain, budget, args.draft_margin))
               for t in tables]
    res = next((r for t, r in results if t is one), None)
    grid = _vllm_grid(results) if args.vllm_grid else None
    command = _command("tune", args)
    if args.json and grid is not None:
        print(json.dumps({"by_context": [r.to_json() | {"context_len": t.context_len} for t, r in results],
                          "vllm_grid": grid, "acceptance_source": source, "command": command}))
    elif args.json:
        print(json.dumps(res.to_json() | {"acceptance_source": source, "command": command}))
    else:
        for t, r in results:
            print(f"profile {args.profile} ({prof.device}, context {t.context_len}); acceptance from {source}")
            print(r.table())
        if grid is not None:
            print("vLLM speculative_config:", json.dumps(grid))
    if args.out:
        write_text(args.out, res.schedule.to_spec() + "\n")
    if args.report:
        write_json(args.report, res.to_json() | {"profile": str(args.profile), "device": prof.device,
                                                 "context_len": one.context_len, "acceptance_source": source,
                                                 "command": command})
    if args.vllm_grid:
        write_json(args.vllm_grid, grid)
    return 0


def _tune_prices(args: argparse.Namespace, device: str):
    """--prefill-ratio's step prices: --step-prices FILE, or the profile device's file in a folder."""
    from dynspec.errors import DynspecError
    from dynspec.runtime.policy.step_prices import for_device, profiled_device

    if args.prefill_ratio is None:
        if args.step_prices:
            raise DynspecError("--step-prices prices --prefill-ratio's prompts; give --prefill-ratio too")
        return None
    if args.chunk_share is not None:
        raise DynspecError("give one of --chunk-share (the profile's chunk axis) and --prefill-ratio (step prices)")
    if not args.step_prices:
        raise DynspecError("--prefill-ratio needs --step-prices FILE|DIR (the device's fitted step prices)")
    prices = for_device(args.step_prices, profiled_device(device))
    if prices is None:        # a folder without this device's file: the suite's configs run on any GPU
        print(f"--step-prices {args.step_prices}: no prices of {device!r}; --prefill-ratio ignored, decode steps"
              " priced alone", file=sys.stderr, flush=True)
    return prices


def _vllm_grid(results) -> dict:
    """vLLM's speculative_config fragment from [(ContextTable, TuneResult)], one per profiled context."""
    from dynspec.errors import DynspecError
    from dynspec.runtime.policy.schedule_vllm import to_vllm_grid

    if any(t.context_len is None for t, _ in results):
        raise DynspecError("--vllm-grid needs each table's context_len; the profile does not record it")
    grid = to_vllm_grid([(t.context_len, r.schedule) for t, r in results])
    return {"num_speculative_tokens": max(e[-1] for e in grid), "speculative_token_schedule": grid}


def _tune_acceptance(args: argparse.Namespace):
    """(--acceptance RATE, "--acceptance RATE") or the file's measured rates and what they came from:
    one fitted rate stays a float (valid at every profiled K), per-position rates a tuple."""
    from dynspec.benchmarks.acceptance_sources import read_measured_acceptance
    from dynspec.errors import DynspecError

    if (args.acceptance is None) == (not args.acceptance_from):
        raise DynspecError("give exactly one of --acceptance RATE and --acceptance-from FILE")
    if args.acceptance is not None:
        return args.acceptance, f"--acceptance {args.acceptance:g}"
    path = args.profile if args.acceptance_from == "profile" else args.acceptance_from
    m = read_measured_acceptance(path)
    return (m.rate if m.fitted else m.per_position), m.source


# ---- sweep alias ---------------------------------------------------------------
def _cmd_sweep(args: argparse.Namespace) -> int:
    from dynspec.benchmarks.sweep_run import run

    argv = sys.argv[1:]
    return run(args, argv[argv.index("sweep") + 1:] if "sweep" in argv else _command("sweep", args).split()[2:])


def register(sub) -> None:
    from dynspec.benchmarks.engines import add_engine_args
    from dynspec.runtime.policy.tune import DRAFT_MARGIN

    p = sub.add_parser("profile", help="measure iteration time per (batch size, K) -> profile.json")
    add_engine_args(p)
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="e.g. 1,2,4,8,16,32,64,128,256")
    p.add_argument("--draft-lens", default="0,1,2,3,4", help="K values; 0 (plain decode) is always added")
    p.add_argument("--context-lens", default="128", metavar="N[,N...]",
                   help="KV length of every row while timing; several (512,1024,2048) give one table each")
    p.add_argument("--chunk-lens", metavar="N[,N...]", help="also time every (b, K) with a prompt chunk of N tokens "
                   "riding (e.g. 128,512): the policies then price the chunk of the step they decide")
    p.add_argument("--catch-up", type=int, default=0, metavar="N",
                   help="lazy draft sync: also time the K=1 step of b rows that each catch up N draft entries first "
                        "(profile.json's catch_up; the engine's draft_sync must be lazy)")
    p.add_argument("--max-seq-len", type=int, help="cache length (default: context + K + 1); CUDA graphs attend"
                   " over all of it, so pass the sweep's to predict the sweep")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per shape")
    p.add_argument("--repeats", type=int, default=10, help="timed steps per shape (median reported)")
    p.add_argument("--measure-acceptance", action="store_true",
                   help="also measure real per-position acceptance at K=max(--draft-lens) with greedy verification")
    p.add_argument("--dataset", metavar="FILE.jsonl", help="prompts for --measure-acceptance")
    p.add_argument("--prompts", choices=("random", "stdlib"), default="stdlib",
                   help="--measure-acceptance prompts: held-out stdlib text (default) or random ids")
    p.add_argument("--input-len", default="64", help="synthetic prompts for --measure-acceptance")
    p.add_argument("--output-len", default="64")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--acceptance-concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--floor", action="store_true",
                   help="also time the target's GEMMs alone (CUDA graph on a GPU) and plain decode at b=1;"
                        " the profile records gemm_floor_ms")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallel ranks (mpirun -n N): the leader times, every rank runs each step")
    p.add_argument("--allreduce", choices=("auto", "nccl", "one-shot"), default="auto",
                   help="tensor parallel all-reduce (docs/tensor_parallel.md): auto = the one-shot NVLink kernel on CUDA, NCCL if it cannot be set up; gloo on CPU")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", required=True, help="profile.json")
    p.set_defaults(func=_cmd_profile)

    t = sub.add_parser("tune", help="choose a draft-length schedule from a profile (goodput per batch size)")
    t.add_argument("--profile", required=True, help="profile.json from `dynspec profile`")
    t.add_argument("--acceptance", type=float, metavar="RATE", help="one per-draft acceptance rate, e.g. 0.7")
    t.add_argument("--acceptance-from", metavar="FILE",
                   help="measured acceptance: a sweep result JSON, TensorRT-LLM iteration stats (*.jsonl,"
                        " specDecodingStats) or a profile.json with acceptance.per_position; 'profile' = --profile")
    t.add_argument("--context", type=int, metavar="N", help="the profiled context whose table to tune"
                   " (default: the profile's only one)")
    t.add_argument("--vllm-grid", metavar="FILE.json", help="tune every profiled context and write vLLM's"
                   " 5-item [bs_lo, bs_hi, ctx_lo, ctx_hi, K] speculative_token_schedule (context buckets split"
                   " at the midpoints between profiled contexts) with its num_speculative_tokens")
    t.add_argument("--max-draft-len", type=int, metavar="K", help="largest K to consider (default: largest profiled)")
    t.add_argument("--min-gain", type=float, default=1.0, metavar="X",
                   help="speculate only where the predicted gain over K=0 is at least X (margin for profile error)")
    t.add_argument("--draft-margin", type=float, default=DRAFT_MARGIN, metavar="X",
                   help="each further draft position must add a factor X to the predicted gain (default %(default)g)"
                        " (margin for acceptance error; K=4 over K=3 then needs 1%% more)")
    t.add_argument("--chunk-share", type=float, metavar="F",
                   help="price the steps as served: a share F of iterations carry a prompt chunk (the iteration "
                        "stats' prefill_tokens > 0), priced by the profile's chunk axis (dynspec profile --chunk-lens)")
    t.add_argument("--chunk-tokens", type=int, default=128, metavar="T", help="--chunk-share's mean chunk tokens")
    t.add_argument("--prefill-ratio", type=float, metavar="R",
                   help="price the steps as served under sustained load: R prompt tokens per generated token (mean"
                        " prompt / mean output length) ride in each step's chunks, priced by --step-prices")
    t.add_argument("--step-prices", metavar="FILE|DIR", help="--prefill-ratio's per-token chunk prices: a step-prices"
                   " file, or a folder holding the profile device's (benchmarks/sim_data)")
    t.add_argument("--max-num-tokens", type=int, metavar="N",
                   help="token budget: never pick K with b x (K+1) > N"
                        " (default: the profile's 'max_num_tokens', if any)")
    t.add_argument("--out", metavar="schedule.txt", help="write the schedule's CLI form ('4:4,8:2')")
    t.add_argument("--report", metavar="tune.json", help="write the table, the inputs and the command as JSON")
    t.add_argument("--json", action="store_true", help="print JSON instead of the table")
    t.set_defaults(func=_cmd_tune)

    from dynspec.benchmarks.sweep_args import make_parser as sweep_parser

    s = sub.add_parser("sweep", help="concurrency sweep baseline/static/dynamic (= python -m dynspec.benchmarks.sweep)")
    sweep_parser(s)
    s.set_defaults(func=_cmd_sweep)
