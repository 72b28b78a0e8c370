"""`dynspec generate`: run prompts through the reference engine under a draft-length policy."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from dynspec.errors import DynspecError

MODES = ("baseline", "static", "dynamic")


def register(sub) -> None:
    from dynspec.cli import add_schedule_args

    p = sub.add_parser("generate", help="generate with the reference engine (default: the embedded tiny pair)")
    src = p.add_argument_group("model (default: the embedded tiny trained pair)")
    src.add_argument("--engine-dir", help="ENGINE_DIR from `dynspec build` (reads its engine.json)")
    src.add_argument("--target", help="HF target folder (instead of --engine-dir)")
    src.add_argument("--draft", help="EAGLE-3 draft folder (with --target)")
    add_schedule_args(p, required=False)
    p.add_argument("--no-keep-warm", action="store_true", help="do not extend the draft's KV while K=0")
    p.add_argument("--prompts", help="JSONL: {'id', 'input_ids'} or {'id', 'prompt'} (default: built-in code prompts)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8, help="closed loop: requests in flight")
    p.add_argument("--num-prompts", type=int, default=24, help="built-in prompts to run (without --prompts)")
    p.add_argument("--modes", default="dynamic",
                   help="comma list of baseline (K=0), static (K=max everywhere), dynamic (the schedule)")
    p.add_argument("--out", help="output JSONL (of the last mode): {'id', 'output_ids', 'text'}")
    p.add_argument("--stats", help="per-iteration stats JSONL (of the last mode)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--max-seq-len", type=int, help="cache length per request (default: engine.json or 1024)")
    p.set_defaults(func=cmd_generate)


def _engine_config(args):
    from dynspec.cli import schedule_of
    from dynspec.config import EngineConfig
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.session import engine_config_for, tiny_pair_dirs

    if args.engine_dir:
        if args.target or args.draft:
            raise DynspecError("give --engine-dir or --target/--draft, not both")
        cfg = EngineConfig.load(args.engine_dir)
    else:
        if bool(args.target) != bool(args.draft):
            raise DynspecError("--target and --draft go together")
        target, draft = (args.target, args.draft) if args.target else tiny_pair_dirs()
        cfg = engine_config_for(target, draft, DraftSchedule.parse("4:4,8:2"))
    sched = schedule_of(args)
    ref = cfg.reference
    if args.dtype:
        ref = replace(ref, dtype=args.dtype)
    if args.max_seq_len:
        ref = replace(ref, max_seq_len=args.max_seq_len)
    ref = replace(ref, max_batch_size=max(args.concurrency, 1), keep_warm=not args.no_keep_warm)
    return replace(cfg, schedule=sched or cfg.schedule, reference=ref)


def _tokenizer(target_dir: str):
    if not any((Path(target_dir) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target_dir)


def default_prompts(tokenizer, n: int = 16, length: int = 48) -> list[tuple[int, ...]]:
    """Deterministic windows of Python standard-library source (text every machine has)."""
    import textwrap, shlex, string  # noqa: E401  (sources only)

    text = "\n".join(Path(m.__file__).read_text() for m in (textwrap, shlex, string))
    ids = tokenizer(text)["input_ids"] if tokenizer is not None else list(text.encode())
    stride = max(1, (len(ids) - length) // n)
    return [tuple(ids[i * stride: i * stride + length]) for i in range(n)]


def cmd_generate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from dynspec.runtime.driver import read_prompts, run_closed_loop
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.session import open_reference_engine
    from dynspec.runtime.executor import Executor

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise DynspecError(f"--modes {args.modes!r}: unknown mode(s) {bad}; choose from {MODES}")
    if args.max_new_tokens < 1:
        raise DynspecError(f"--max-new-tokens={args.max_new_tokens} must be at least 1")
    cfg = _engine_config(args)
    tok = _tokenizer(cfg.target_dir)
    if args.prompts:
        prompts = read_prompts(args.prompts, (lambda s: tok(s)["input_ids"]) if tok else None)
        ids, names = [p.input_ids for p in prompts], [p.id for p in prompts]
    else:
        ids = default_prompts(tok, n=args.num_prompts)
        names = [str(i) for i in range(len(ids))]
    kmax = max(cfg.schedule.max_draft_len, 1)
    policies = {
        "baseline": DraftSchedule(),
        "static": DraftSchedule.static(kmax, cfg.reference.max_batch_size),
        "dynamic": cfg.schedule,
    }
    engine = open_reference_engine(cfg, device=args.device)
    stop = [tok.eos_token_id] if tok is not None and tok.eos_token_id is not None else []
    report = {}
    run_closed_loop(Executor(engine, policies[modes[0]]), ids[:2], 4, 2)   # warm-up, untimed
    for mode in modes:
        ex = Executor(engine, policies[mode], keep_warm=cfg.reference.keep_warm)
        with tqdm(total=len(ids), desc=f"{mode:>8}", file=sys.stderr, leave=False) as bar:
            results = run_closed_loop(ex, ids, args.max_new_tokens, args.concurrency, stop, progress=bar)
        report[mode] = summarize(ex.stats, results)
        last = (results, ex.stats)
    results, stats = last
    if args.out:
        _write_jsonl(args.out, ({"id": n, "output_ids": list(r.output_ids),
                                 **({"text": tok.decode(list(r.output_ids))} if tok else {})}
                                for n, r in zip(names, results)))
    if args.stats:
        from dataclasses import asdict

        _write_jsonl(args.stats, (asdict(s) for s in stats))
    print(format_report(cfg.schedule, report, args.concurrency))
    return 0


def summarize(stats, results) -> dict:
    """K per batch size as it happened, mean accepted length, tokens per second."""
    k_by_b: dict[int, set] = {}
    for s in stats:
        k_by_b.setdefault(s.batch_size, set()).add(s.k)
    spec = [s for s in stats if s.k > 0]
    tokens = sum(len(r.output_ids) for r in results)
    wall = max(r.finish_s for r in results) - min(r.submit_s for r in results)
    return {
        "k_by_batch_size": {b: sorted(ks) for b, ks in sorted(k_by_b.items())},
        "mean_accepted_len": (sum(s.accepted for s in spec) / sum(s.batch_size for s in spec)) if spec else 0.0,
        "tokens": tokens,
        "tok_per_s": tokens / wall if wall > 0 else float("nan"),
        "iterations": len(stats),
    }


def format_report(schedule, report: dict, concurrency: int) -> str:
    lines = [f"schedule {schedule}  concurrency {concurrency}"]
    for mode, r in report.items():
        ks = ", ".join(f"b={b}:K={'/'.join(map(str, k))}" for b, k in r["k_by_batch_size"].items())
        lines.append(f"{mode:>8}: {r['tok_per_s']:8.1f} tok/s  {r['tokens']} tokens in {r['iterations']} iterations"
                     f"  mean accepted drafts/step {r['mean_accepted_len']:.2f}")
        lines.append(f"{'':>10}K per batch size: {ks}")
    return "\n".join(lines)


def _write_jsonl(path, rows) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
