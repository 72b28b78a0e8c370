"""`dynspec generate`: run prompts through the reference engine under a draft-length policy."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dynspec.config import DTYPES
from dynspec.runtime.serving.plan import DRAFT_SYNCS
from dynspec.errors import DynspecError
from dynspec.runtime.generate.generate_report import interleave, mode_figures, render, write_jsonl
from dynspec.runtime.generate.generate_setup import (PAIR_SCHEDULE, _adaptive, _check_flags, _config_vocab, _engine_config,
                                            _prompts, _tokenizer, check_prompt_bounds, load_sizes, parse_loads)
from dynspec.runtime.policy import POLICIES
from dynspec.runtime.generate.tune_at_start import PAYS, TUNE_NEW_TOKENS, TUNE_TRIALS, TUNE_WAVES, tune_here, tune_prompts

# the served cost-model policies of runtime/policy/__init__.py POLICIES ("adaptive", "per-request")
COST_MODES = tuple(n for n, p in POLICIES.items() if p.cost_model and not p.benchmark_only)
MODES = ("baseline", "static", "dynamic") + COST_MODES


def register(sub) -> None:
    from dynspec.runtime.policy.schedule_args import add_schedule_args, add_ttft_weight_arg

    p = sub.add_parser(
        "generate", help="generate with the reference engine (default: the embedded tiny pair)",
        description="Run prompts through the reference engine at each --concurrency load under each --modes "
                    "policy and print per load and mode tok/s, tokens a step, accepted drafts and the K each "
                    "batch size got; then whether every mode wrote the same text and, with baseline, static "
                    "and dynamic, a verdict line. The first stdout line names the schedule and the policy. "
                    "Schedule: --schedule, else engine.json's; on the embedded pair in one process it is tuned at "
                    f"start for this machine: each load C served on up to {TUNE_WAVES} x C of its prompts at every "
                    f"K = 0..4, {TUNE_TRIALS} runs each, then the `dynspec tune` rule on the served tok/s, K > 0 "
                    f"where it serves {PAYS:.2f}x K=0's (seconds); under mpirun, or with --target/--draft, "
                    f"{PAIR_SCHEDULE}. Ctrl-C stops it (exit status 130).")
    src = p.add_argument_group("model (default: the embedded tiny trained pair)")
    src.add_argument("--engine-dir", help="ENGINE_DIR from `dynspec build` (reads its engine.json)")
    src.add_argument("--target", help="HF target folder (instead of --engine-dir)")
    src.add_argument("--draft", help="EAGLE-3 draft folder (with --target)")
    add_schedule_args(p, required=False)
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--trials", type=int, default=3, metavar="N",
                   help="runs of every mode at every load, their order rotated from trial to trial; tok/s: each "
                        "iteration at its fastest trial (runtime/generate/generate_report.py)")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch CPU threads (default 1: on a shared machine one thread is disturbed least; "
                        "0: torch's own default)")
    p.add_argument("--draft-sync", choices=DRAFT_SYNCS,
                   help="the draft while a row runs at K=0 (docs/design.md, \"Draft sync\"): lazy = keep the "
                        "target's features, catch the draft's KV up when K resumes; warm = extend the draft's KV "
                        "every K=0 step; off = neither (default: engine.json's reference.draft_sync, else lazy)")
    p.add_argument("--no-keep-warm", action="store_true", help="deprecated: --draft-sync off")
    p.add_argument("--prompts", help="JSONL: {'id', 'input_ids'} or {'id', 'prompt'}, run whole at every load "
                                      "(default: built-in prompts; the embedded pair's are its own training text)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt, at most")
    p.add_argument("--concurrency", type=parse_loads, default=(1, 16), metavar="C[,C...]",
                   help="the loads: a closed loop at each, C requests in flight (default 1,16)")
    p.add_argument("--num-prompts", type=int, metavar="N",
                   help="built-in prompts run at each load (default: 3 x C, three waves; they repeat past the last)")
    p.add_argument("--modes", default="dynamic",
                   help="comma list of baseline (K=0), static (K=max everywhere), dynamic (the schedule), "
                        "adaptive (K from the cost model and the measured acceptance: runtime/policy/adaptive.py), "
                        "per-request (each row's own K: runtime/policy/per_request.py)")
    add_ttft_weight_arg(p, "engine.json ttft_weight, else the policy's")
    p.add_argument("--cost-model", metavar="FILE",
                   help="adaptive and per-request modes' cost model, a `dynspec profile` JSON "
                        "(default: ENGINE_DIR/cost_model.json)")
    p.add_argument("--out", help="output JSONL (of the last mode): {'id', 'output_ids', 'text'}")
    p.add_argument("--stats", help="per-iteration stats JSONL (of the last mode)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", choices=DTYPES, help="float64: CPU only, for exactness tests (TP=N against TP=1)")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallel ranks per replica: mpirun -n R*N gives R replicas of N ranks "
                        "(docs/tensor_parallel.md)")
    p.add_argument("--allreduce", choices=("auto", "nccl", "one-shot"), default="auto",
                   help="tensor parallel all-reduce (docs/tensor_parallel.md): auto = the one-shot NVLink kernel on CUDA, NCCL if it cannot be set up; gloo on CPU")
    p.add_argument("--max-seq-len", type=int,
                   help="cache length per request (default: engine.json, else the smaller of 1024 and the "
                        "target's max_position_embeddings)")
    p.add_argument("--max-num-tokens", type=int, metavar="N",
                   help="tokens per iteration: decode rows x (K+1) + prompt chunks (default: engine.json or 8192)")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    """The job; Ctrl-C ends it with one line and exit status 130 (the shell's for SIGINT)."""
    import torch

    threads = torch.get_num_threads()
    try:
        if args.threads < 0:
            raise DynspecError(f"--threads={args.threads} must be 0 (torch's default) or more")
        if args.threads and args.device == "cpu":
            torch.set_num_threads(args.threads)
        return _generate(args)
    except KeyboardInterrupt:
        print("dynspec generate: interrupted", file=sys.stderr, flush=True)
        return 130
    finally:
        torch.set_num_threads(threads)


def _generate(args: argparse.Namespace) -> int:
    from dynspec.runtime.serving.driver import read_prompt_lines
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.policy.prefill_cap import capped
    from dynspec.runtime.generate.session import open_reference_engine
    from dynspec.runtime.tp.tp_lifecycle import run_replica

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise DynspecError(f"--modes {args.modes!r}: unknown mode(s) {bad}; choose from {MODES}")
    _check_flags(args)
    cfg = _engine_config(args)
    lines = read_prompt_lines(args.prompts) if args.prompts else None      # the whole file, before any work
    tok = _tokenizer(cfg.target_dir)
    sizes = load_sizes(args, len(lines) if lines is not None else None)    # {C: prompts run at C}
    ids, names, wheres = _prompts(args, lines, tok, max(sizes.values()))
    kmax = max(cfg.schedule.max_draft_len, 1)
    policies = {
        "baseline": DraftSchedule(),
        "static": DraftSchedule.static(kmax, cfg.reference.max_batch_size),
        "dynamic": capped(cfg.schedule, cfg.prefill_k),
    }
    for m in COST_MODES:
        if m in modes:
            policies[m] = _adaptive(args, cfg, m)
    engine_k = max(kmax, *(p.max_draft_len for p in policies.values()))
    vocab = _config_vocab(cfg.target_dir)
    if vocab is not None:          # before the weights load; the same numbers open_reference_engine uses
        check_prompt_bounds(ids, wheres, vocab=vocab, max_seq_len=cfg.reference.max_seq_len,
                            max_draft_len=engine_k, max_new_tokens=args.max_new_tokens,
                            loop=cfg.reference.loop(args.device))
    source = _schedule_source(args, modes)

    def load(ctx):
        # a world of one keeps --device as given; under mpirun each rank takes its TpContext's device
        engine = open_reference_engine(cfg, device=args.device, max_draft_len=engine_k,
                                       tp=ctx if ctx.layout.size > 1 else None)
        check_prompt_bounds(ids, wheres, vocab=engine.vocab_size, max_seq_len=engine.max_seq_len,
                            max_draft_len=engine.max_draft_len, max_new_tokens=args.max_new_tokens,
                            loop=cfg.reference.loop(engine.device))
        return engine

    def lead(engine, ctx):
        """This replica's share of every load's prompts under every mode ->
        {C: {mode: [(results, stats, start_s) per trial]}}."""
        mine = {c: ids[:n][ctx.layout.replica::ctx.layout.replicas] for c, n in sizes.items()}
        nonlocal source
        if source == "tune" and ctx.layout.size > 1:
            source = "the pair's default; tuned only when one process runs"
        elif source == "tune":
            tuned = _tune(engine, tune_prompts(ids, sizes), kmax, cfg, args, stop)
            if tuned is not None:
                policies["dynamic"], source = tuned.schedule, str(tuned)
            else:
                source = f"the pair's default; the prompts ran no K={kmax} step to tune from"
        if ctx.layout.rank == 0:
            print(header(policies, modes, tuple(sizes), source, args.cost_model or cfg.cost_model), flush=True)
        return _run_modes(engine, ctx, mine, modes, policies, cfg, args, stop)

    stop = [tok.eos_token_id] if tok is not None and tok.eos_token_id is not None else []
    ctx, _, mine = run_replica(args.tp, load, lead, device=args.device, allreduce=args.allreduce)
    shares = ctx.comm.gather(mine if ctx.layout.is_leader else None, root=0) if ctx.comm is not None else [mine]
    if ctx.layout.rank != 0:
        return 0
    shares = [shares[r * args.tp] for r in range(ctx.layout.replicas)]          # leaders, in replica order
    _write_outputs(args, modes, shares, names, sizes, tok, policies)
    return 0


def _tune(engine, by_load, kmax, cfg, args, stop):
    """tune_here on the job's loads, a progress bar on stderr unless --no-progress."""
    from tqdm import tqdm

    runs = TUNE_TRIALS * len(by_load) * (kmax + 1)
    with tqdm(total=runs, desc="tuning", file=sys.stderr, leave=False, disable=args.no_progress) as bar:
        return tune_here(engine, by_load, max_k=kmax, new_tokens=min(TUNE_NEW_TOKENS, args.max_new_tokens),
                         stop_ids=stop, draft_sync=cfg.reference.draft_sync, loop=cfg.reference.loop(engine.device),
                         progress=bar)


def _run_modes(engine, ctx, mine, modes, policies, cfg, args, stop) -> dict:
    """Every load and mode over this replica's prompts, --trials times, after a short warm-up; trial t
    runs the modes from modes[t % M] on at each load, so drift falls on every mode ->
    {C: {mode: [(results, stats, start_s) per trial]}}."""
    import time

    from tqdm import tqdm

    from dynspec.runtime.serving.driver import run_closed_loop
    from dynspec.runtime.serving.executor import Executor
    from dynspec.runtime.serving.gc_heap import freeze_heap

    out: dict = {c: {mode: [] for mode in modes} for c in mine}
    first = next((p for p in mine.values() if p), [])
    if first:
        run_closed_loop(Executor(engine, policies[modes[0]]), first[:2], min(4, args.max_new_tokens), 2)  # warm-up
    for t in range(args.trials):
        for c, prompts in mine.items():
            for mode in modes[t % len(modes):] + modes[:t % len(modes)]:
                ex = Executor(engine, policies[mode], draft_sync=cfg.reference.draft_sync, stats_limit=None,
                              loop=cfg.reference.loop(engine.device))  # whole run
                freeze_heap()     # runtime/serving/gc_heap.py: what the run meets is built; no full collection walks it
                desc = f"C={c} {mode:>8}" + (f" {t + 1}/{args.trials}" if args.trials > 1 else "")
                with tqdm(total=len(prompts), desc=desc, file=sys.stderr, leave=False,
                          disable=ctx.layout.rank != 0 or args.no_progress) as bar:
                    t0 = time.perf_counter()          # the executor's clock: iteration times start here
                    results = run_closed_loop(ex, prompts, args.max_new_tokens, c, stop, progress=bar)
                out[c][mode].append((results, list(ex.stats), t0))
    return out


def _write_outputs(args, modes, shares, names, sizes: dict, tok, policies) -> None:
    """World rank 0: --out and --stats of the last load's last mode's last trial, and the report of
    every load and mode on stdout."""
    blocks, outputs = [], {}
    for c, n in sizes.items():
        report = {mode: mode_figures([sh[c][mode] for sh in shares]) for mode in modes}
        blocks.append((c, n, args.max_new_tokens, report))
        for mode in modes:
            for t in range(args.trials):
                res = interleave([sh[c][mode][t][0] for sh in shares], n)
                outputs[(c, mode, t)] = [r.output_ids for r in res]
    c_last = list(sizes)[-1]
    last = [sh[c_last][modes[-1]][-1] for sh in shares]
    results = interleave([res for res, _, _ in last], sizes[c_last])
    if args.out:
        write_jsonl(args.out, ({"id": name, "output_ids": list(r.output_ids),
                                 **({"text": tok.decode(list(r.output_ids))} if tok else {})}
                                for name, r in zip(names, results)))
    if args.stats:
        from dataclasses import asdict

        tag = (lambda r: {"replica": r}) if len(shares) > 1 else (lambda r: {})
        write_jsonl(args.stats, ({**asdict(s), **tag(r)} for r, (_, stats, _) in enumerate(last) for s in stats))
    dynamic = policies["dynamic"]
    print(render(blocks, {c: max(dynamic.choices(c)) for c in sizes}, outputs, policies["static"].max_draft_len))


def _schedule_source(args, modes) -> str:
    """Where the dynamic mode's schedule comes from: '--schedule', 'ENGINE_DIR/engine.json', 'tune'
    (the embedded pair, no --schedule, a dynamic mode: tune_here decides, in a world of one process)
    or "the pair's default"."""
    from dynspec.runtime.policy.schedule_args import schedule_of

    if schedule_of(args) is not None:
        return "--schedule" if args.schedule is not None else "--threshold / --max-draft-len"
    if args.engine_dir:
        return str(Path(args.engine_dir) / "engine.json")
    if args.target is None and "dynamic" in modes:
        return "tune"
    return "the pair's default"


def header(policies: dict, modes, loads: tuple[int, ...], source: str, cost_model) -> str:
    """The first stdout line: the resolved schedule and policy, e.g.
    'schedule 4:4,8:2  concurrency 8  (K=4 for b<=4, K=2 for b<=8, K=0 above); policy: schedule (--schedule)'.
    The schedule shown is the dynamic mode's (static runs its largest K at every batch size);
    with an adaptive mode the policy names its cost model and K range."""
    from dynspec.runtime.policy.prefill_cap import PrefillCap
    from dynspec.runtime.serving.driver import describe_policy, schedule_words

    dyn = policies["dynamic"]
    has_cap = isinstance(dyn, PrefillCap)             # engine.json prefill_k: the schedule it caps
    sched = dyn.schedule if has_cap else dyn
    cap = f", {dyn.limit} on steps that end a prefill" if has_cap else ""
    kinds = []
    if any(m not in COST_MODES for m in modes):
        kinds.append(f"schedule ({source})")
    for m in COST_MODES:
        if m in modes:
            kinds.append(describe_policy(policies[m], cost_model))
    return (f"schedule {sched}  concurrency {','.join(map(str, loads))}  ({schedule_words(sched)}{cap}); "
            f"policy: {' + '.join(kinds)}")
