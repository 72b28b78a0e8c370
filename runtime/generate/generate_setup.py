"""What `dynspec generate` runs on, resolved from its flags and checked before any model loads: the
engine config (engine.json or a pair), flag bounds and output paths, prompt bounds, the tokenizer,
the prompts and the cost-model policies."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from dynspec.errors import DynspecError
from dynspec.runtime.serving.loop import Loop
from dynspec.runtime.generate.session import check_device

PAIR_SCHEDULE = "4:4,8:2"     # a pair's schedule when --schedule is not given and none is tuned


def _engine_config(args):
    from dynspec.config import EngineConfig, check_batch_limit
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.policy.schedule_args import schedule_of
    from dynspec.runtime.generate.session import engine_config_for, tiny_pair_dirs

    if args.engine_dir:
        if args.target or args.draft:
            raise DynspecError("give --engine-dir or --target/--draft, not both")
        cfg = EngineConfig.load(args.engine_dir)
        check_batch_limit("--concurrency", max(args.concurrency), cfg, args.engine_dir)
    else:
        if bool(args.target) != bool(args.draft):
            raise DynspecError("--target and --draft go together")
        target, draft = (args.target, args.draft) if args.target else tiny_pair_dirs()
        cfg = engine_config_for(target, draft, DraftSchedule.parse(PAIR_SCHEDULE))
        cfg = replace(cfg, max_batch_size=max(cfg.max_batch_size, *args.concurrency))   # a pair: no engine dir limit
    sched = schedule_of(args)
    if args.engine_dir and sched is not None and sched.max_draft_len > cfg.schedule.max_draft_len:
        raise DynspecError(f"--schedule {sched.to_spec()}: K={sched.max_draft_len} is above the engine's "
                           f"max_draft_len {cfg.schedule.max_draft_len} ({_engine_bound(args.engine_dir, cfg)})")
    ref = cfg.reference
    if args.dtype:
        ref = replace(ref, dtype=args.dtype)
    if args.max_seq_len is not None:
        ref = replace(ref, max_seq_len=args.max_seq_len)
    elif not args.engine_dir:         # a pair: the default, capped by the target's positions
        from dynspec.runtime.generate.session import target_positions

        ref = replace(ref, max_seq_len=min(ref.max_seq_len, target_positions(cfg.target_dir)))
    if args.max_num_tokens is not None:
        window = (sched or cfg.schedule).max_draft_len + 1
        if args.max_num_tokens < window:
            raise DynspecError(f"--max-num-tokens {args.max_num_tokens} is smaller than one verify window "
                               f"(max K + 1 = {window})")
        ref = replace(ref, max_num_tokens=args.max_num_tokens)
    ref = replace(ref, max_batch_size=max(args.concurrency), draft_sync=_draft_sync(args, ref.draft_sync))   # C rows
    return replace(cfg, schedule=sched or cfg.schedule, reference=ref)


def _draft_sync(args, configured: str) -> str:
    """--draft-sync, else "off" for the deprecated --no-keep-warm (one line on stderr), else the
    engine's (engine.json reference.draft_sync, default "lazy")."""
    if args.no_keep_warm:
        print("dynspec generate: --no-keep-warm is deprecated; use --draft-sync off", file=sys.stderr)
        if args.draft_sync not in (None, "off"):
            raise DynspecError(f"--no-keep-warm (--draft-sync off) and --draft-sync {args.draft_sync} disagree; "
                               f"give --draft-sync alone")
        return "off"
    return args.draft_sync or configured


def _engine_bound(engine_dir: str, cfg) -> str:
    """Where an engine dir's max_draft_len comes from: 'E/engine.json schedule 4:4'."""
    return f"{Path(engine_dir) / 'engine.json'} schedule {cfg.schedule.to_spec()}"


def _check_flags(args) -> None:
    """Flag bounds and output paths, before any model is loaded; each error names the value."""
    from dynspec.artifacts import check_apart, check_writable

    for flag, v in (("--max-new-tokens", args.max_new_tokens), *(("--concurrency", c) for c in args.concurrency),
                    ("--num-prompts", args.num_prompts), ("--max-seq-len", args.max_seq_len),
                    ("--max-num-tokens", args.max_num_tokens), ("--tp", args.tp), ("--trials", args.trials)):
        if v is not None and v < 1:
            raise DynspecError(f"{flag}={v} must be at least 1")
    inputs = {"--prompts": args.prompts, "--engine-dir": args.engine_dir, "--target": args.target,
              "--draft": args.draft}
    outs = [(f, p) for f, p in (("--out", args.out), ("--stats", args.stats)) if p is not None]
    for flag, path in outs:
        check_apart(path, inputs, out_flag=flag)
        check_writable(path, flag)
    if len(outs) == 2 and Path(args.out).resolve() == Path(args.stats).resolve():
        raise DynspecError(f"--out and --stats are both {args.out}; give two files")
    if args.dtype == "float64" and args.device != "cpu":
        raise DynspecError(f"--dtype float64 is for CPU exactness tests; --device {args.device} takes "
                           f"float32, bfloat16 or float16")
    check_device(args.device)


def check_prompt_bounds(ids, wheres, *, vocab: int, max_seq_len: int, max_draft_len: int, max_new_tokens: int,
                        loop: Loop = Loop.SERIAL) -> None:
    """Every prompt fits the engine with the user's --max-new-tokens; the error names FILE:LINE.
    Room needed: prompt + max_new_tokens + one verify window (max K + 1; two in the overlapped
    loop, engine.json reference.overlap: runtime/serving/overlap.py) <= max_seq_len."""
    from dynspec.runtime.serving.overlap import cache_slack

    slack = cache_slack(max_draft_len, loop)
    for where, p in zip(wheres, ids):
        if not p:
            raise DynspecError(f"{where}: the prompt tokenizes to no tokens")
        bad = next((t for t in p if not 0 <= t < vocab), None)
        if bad is not None:
            raise DynspecError(f"{where}: token id {bad} is outside the vocabulary 0..{vocab - 1}")
        need = len(p) + max_new_tokens + slack
        if need > max_seq_len:
            raise DynspecError(
                f"{where}: prompt of {len(p)} tokens + --max-new-tokens {max_new_tokens} (+{slack} verify"
                f" slack) = {need} exceeds max_seq_len {max_seq_len} (--max-seq-len or engine.json reference)")


def _config_vocab(target_dir: str) -> int | None:
    """vocab_size from the target's config.json, or None where it is not plainly there."""
    try:
        v = json.loads((Path(target_dir) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _tokenizer(target_dir: str):
    if not any((Path(target_dir) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target_dir)


def _adaptive(args, cfg, mode: str = "adaptive"):
    """--modes ...,adaptive (or another cost-model policy of runtime/policy/__init__.py POLICIES): the policy
    on --cost-model, else on the engine dir's cost_model.json."""
    from dynspec.runtime.policy.cost_model import CostModel
    from dynspec.runtime.policy import MAX_DRAFT_LEN, POLICIES

    path = args.cost_model or (cfg.cost_model if args.engine_dir else None)
    if path is None:
        raise DynspecError(f"--modes {mode} needs --cost-model FILE (a `dynspec profile` JSON) or an --engine-dir "
                           "that carries cost_model.json")
    if not Path(path).is_file():
        raise DynspecError(f"--modes {mode}: cost model {path} does not exist; write it with "
                           f"`dynspec profile --context-lens ... --out {path}`")
    if args.engine_dir:               # engine.json's own schedule, whatever --schedule says
        from dynspec.config import EngineConfig

        eng = EngineConfig.load(args.engine_dir)
        kmax, bound = eng.schedule.max_draft_len, _engine_bound(args.engine_dir, eng)
        weight = eng.ttft_weight
    else:                             # a pair: the engine is sized for the policy, up to MAX_DRAFT_LEN
        kmax, bound = MAX_DRAFT_LEN, "MAX_DRAFT_LEN, the largest K the reference engine runs"
        weight = None
    from dynspec.runtime.policy.step_prices import prices_beside

    cost = CostModel.load(path, kmax, bound)
    return POLICIES[mode].make(cost, prices=prices_beside(path),
                               ttft_weight=args.ttft_weight if args.ttft_weight is not None else weight)


def parse_loads(text: str) -> tuple[int, ...]:
    """--concurrency: '1,16' -> (1, 16); each load once, in the order given (bounds: _check_flags)."""
    import argparse

    try:
        loads = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers, e.g. 1,16") from None
    if len(set(loads)) != len(loads):
        raise argparse.ArgumentTypeError(f"{text!r} names a load twice")
    return loads


def load_sizes(args, file_prompts: int | None) -> dict[int, int]:
    """{C: prompts run at C}: a --prompts file whole at every load, else --num-prompts, else 3 x C
    (three waves of a closed loop at C)."""
    if file_prompts is not None:
        return {c: file_prompts for c in args.concurrency}
    return {c: args.num_prompts or 3 * c for c in args.concurrency}


def pair_prompts(tok) -> list[tuple[str, tuple[int, ...]]] | None:
    """The embedded pair's built-in prompts [(id, token ids)] (assets/tiny/prompts.json: windows of
    its own training text on which it writes rather than repeats), or None when `tok` is not the
    embedded pair's tokenizer."""
    from dynspec.corpus import ASSET_DIR

    mine = ASSET_DIR / "target" / "tokenizer.json"
    theirs = Path(getattr(tok, "name_or_path", "") or ".") / "tokenizer.json"
    if tok is None or not theirs.is_file() or theirs.read_bytes() != mine.read_bytes():
        return None
    doc = json.loads((ASSET_DIR / "prompts.json").read_text())
    return [(p["id"], tuple(tok(p["prompt"])["input_ids"])) for p in doc["prompts"]]


def _prompts(args, lines, tok, n: int):
    """(token ids, names, where each came from) of --prompts, or n built-in prompts: the embedded
    pair's own (repeated past the last), else windows of its held-out text."""
    from dynspec.corpus import default_prompts
    from dynspec.runtime.serving.driver import tokenized

    if lines is not None:
        prompts = tokenized(lines, (lambda s: tok(s)["input_ids"]) if tok else None)
        return [p.input_ids for p in prompts], [p.id for p in prompts], [ln.where for ln in lines]
    own = pair_prompts(tok)
    if own is not None:
        picks = [own[i % len(own)] for i in range(n)]
        return [ids for _, ids in picks], [str(i) for i in range(n)], [f"built-in prompt {i} ({name})"
                                                                       for i, (name, _) in enumerate(picks)]
    ids = default_prompts(tok, n=n)
    names = [str(i) for i in range(len(ids))]
    return ids, names, [f"built-in prompt {n}" for n in names]
