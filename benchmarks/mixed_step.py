"""Mixed iterations timed in one run, in each of the reference engine's two ways: `full`, the
whole-forward CUDA graph with attention inside (runtime/engines/reference/mixed_graphs.py), and
`eager`; beside them, the same (b, K) as a pure decode step (its graph).

    python -m dynspec.benchmarks.mixed_step --engine-dir E --device cuda --out mixed.json

A point b:K:L is b decode rows at K with `--context-len` tokens of context, plus one prompt
chunk of L tokens (the last of its prompt) riding in the same iteration, b x (K+1) + L tokens
in all. Modes alternate over --trials passes (order rotated); each trial is the median of
--repeats steps. The JSON:
    {"context_len": 512, "points": [{"point": "64:0:128", "tokens": 192, "eager_ms": 28.1,
      "full_ms": 10.4, "decode_ms": 7.6, "eager_vs_full": 2.7, "trials_ms": {...}}, ...]}
On CPU, under --graphs eager, and above the largest token bucket (1024) there is no whole
graph: full_ms is null. --trace DIR (CUDA) adds a Chrome trace per point of 4 mixed steps (full
where it runs) and 4 decode steps (step_timing.trace_steps): gaps between kernels under a step are
where the GPU waited for the host.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from contextlib import contextmanager

from dynspec.benchmarks.engines import add_engine_args, add_step_timing_args, apply_bench_env, engine_choice
from dynspec.errors import DynspecError
from dynspec.runtime.generate.session import check_device


def parse_points(text: str) -> tuple[tuple[int, int, int], ...]:
    """'64:0:128,16:2:64' -> ((64, 0, 128), (16, 2, 64)); b >= 1, K >= 0, L >= 1."""
    out = []
    for item in text.split(","):
        parts = item.split(":")
        try:
            b, k, chunk = (int(x) for x in parts)
        except ValueError:
            raise DynspecError(f"--points item {item!r} is not b:K:chunk (e.g. 64:0:128)") from None
        if b < 1 or k < 0 or chunk < 1:
            raise DynspecError(f"--points item {item!r}: need b >= 1, K >= 0 and chunk >= 1")
        out.append((b, k, chunk))
    return tuple(out)


def make_parser() -> argparse.ArgumentParser:
    from dynspec.parsers import DefaultsFormatter

    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.mixed_step", description=__doc__.splitlines()[0],
                                allow_abbrev=False, formatter_class=DefaultsFormatter)
    add_engine_args(p)
    p.add_argument("--points", default="1:0:128,16:0:128,64:0:128,64:2:64,128:0:256", help="b:K:chunk,...")
    p.add_argument("--context-len", type=int, default=512)
    p.add_argument("--draft-sync", choices=("lazy", "warm"), default="lazy",
                   help="K=0 points as this draft sync serves them: lazy stores the chunk's features (no draft "
                        "pass: plan.store_chunks), warm runs the draft over the chunk and keeps the rows' draft warm")
    add_step_timing_args(p, 20, "CUDA: also profile STEPS eager and STEPS full mixed steps per point, and "
                                "STEPS decode steps (kernel time against wall time: eager_kernels, "
                                "full_kernels, decode_kernels)")
    p.add_argument("--trace", metavar="DIR", help="CUDA: also write a Chrome trace (CPU + kernels) of 4 mixed steps "
                   "and 4 decode steps per point, DIR/trace_<b>_<K>_<chunk>.json.gz")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        doc = run(args, lambda d: _write(args.out, d))
    except DynspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _write(args.out, doc)
    return 0


def _write(path: str, doc: dict) -> None:
    """The JSON as it stands (rewritten after every point, so a run cut short keeps what it timed)."""
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


@contextmanager
def eager_mixed(engine):
    """Mixed iterations of `engine` on the eager path while inside (its whole graphs set aside)."""
    whole, engine.whole = engine.whole, None
    try:
        yield
    finally:
        engine.whole = whole


def point_plans(engine, point, sync: str, ctx: int, pending, slots, toks):
    """(mixed, decode) plans of point b:K:chunk: b rows at position ctx in slots[:b], the chunk's
    tokens in slots[b]; K = 0 under `sync` (lazy: the chunk stored, plan.store_chunks)."""
    from dynspec.runtime.serving.plan import PromptChunk, make_plan

    b, k, _ = point
    lazy = sync == "lazy" and k == 0
    common = dict(positions=[ctx] * b, pending=list(pending), stale=[False] * b, keep_warm=k == 0 and not lazy,
                  buckets=engine.buckets, slots=list(slots)[:b], lazy=lazy)
    mixed = make_plan(k, chunks=[PromptChunk(list(slots)[b], 0, tuple(toks), None)], store_chunks=lazy and b > 0,
                      **common)
    return mixed, make_plan(k, **common)


def capture(engine, points, cfg, sync: str) -> tuple[set, str | None]:
    """Under graphs "full" on CUDA: the points' decode graphs and one whole-forward graph per
    point's (Np, B, T) -> (the whole keys, None), or (set(), the error) when the whole capture
    fails (a finding, not a stop: eager still runs)."""
    from dynspec.config import GraphMode
    from dynspec.runtime.engines.reference.engine import reachable_graphs
    from dynspec.runtime.policy import ConstantK

    if engine.device.type != "cuda":
        return set(), None
    if cfg.reference.graphs is not GraphMode.FULL:
        engine.warm_chunks()
        return set(), None
    keys = set()
    for b, k, _ in points:
        keys |= set(reachable_graphs([ConstantK(k)], b, sync, engine.max_num_tokens))
    engine.capture_decode_graphs(keys)
    engine.warm_chunks()
    try:
        engine.capture_whole_graphs()                 # the buffers; the keys follow from their buckets
        plans = [point_plans(engine, (b, k, c), sync, 1, [0] * b, range(b + 1), (0,) * c)[0] for b, k, c in points]
        whole = {w for w in map(engine.whole.key, plans) if w}
        engine.capture_whole_graphs(exact=whole)
        return whole, None
    except Exception as e:
        import traceback

        engine.drop_whole()
        error = f"{type(e).__name__}: {str(e)[:500]}"
        print(f"whole-forward graphs failed: {error}\n{traceback.format_exc()}", file=sys.stderr)
        return set(), error


def run(args, on_point=None) -> dict:
    import random

    import torch

    from dynspec.benchmarks.engines import open_sized
    from dynspec.benchmarks.step_timing import reserved_rows

    apply_bench_env()
    check_device(args.device)
    points = parse_points(args.points)
    cfg = engine_choice(args).config
    ctx = args.context_len
    max_b, kmax, longest = max(b for b, _, _ in points), max(k for _, k, _ in points), max(c for _, _, c in points)
    engine = open_sized(cfg, device=args.device, max_batch_size=max_b + 1, max_seq_len=max(ctx + kmax + 1, longest) + 1,
                        max_draft_len=max(kmax, 1))
    need = max(b * (k + 1) + c for b, k, c in points)
    if need > engine.max_num_tokens:
        raise DynspecError(f"--points need {need} tokens in one iteration; max_num_tokens is {engine.max_num_tokens}")
    whole, whole_error = capture(engine, points, cfg, args.draft_sync)
    rng = random.Random(0)
    rows = []
    doc = {"context_len": ctx, "device": torch.cuda.get_device_name() if engine.device.type == "cuda" else "cpu",
           "dtype": cfg.reference.dtype, "graphs": cfg.reference.graphs.value if engine.device.type == "cuda" else "eager",
           "mixed_graph_buckets": list(engine.whole.buckets) if engine.whole else None,
           "whole_error": whole_error, "draft_sync": args.draft_sync, "points": rows,
           "capture": {name: dataclasses.asdict(c) for name, c in getattr(engine, "capture_costs", {}).items()},
           "statistic": f"median of {args.trials} trials, each the median of {args.repeats} steps",
           "command": " ".join(["python -m dynspec.benchmarks.mixed_step", *sys.argv[1:]])}
    with reserved_rows(engine, max_b + 1, max(ctx + kmax + 1, longest)) as slots:
        for b, k, chunk in points:
            pending = [rng.randrange(2, 16) for _ in range(b)]
            toks = tuple(rng.randrange(2, 16) for _ in range(chunk))
            mixed, decode = point_plans(engine, (b, k, chunk), args.draft_sync, ctx, pending, slots, toks)
            full = bool(whole) and engine.whole.key(mixed) in whole
            rows.append(_time_point(engine, args, (b, k, chunk), mixed, decode, full))
            print(json.dumps({m: rows[-1][m] for m in ("point", "eager_ms", "full_ms", "decode_ms")}), flush=True)
            if on_point:
                on_point(doc)
    return doc


def _time_point(engine, args, point, mixed, decode, full: bool) -> dict:
    """One point's row: its mixed step in each mode (trials rotated), its decode step, and with
    --kernels / --trace their kernel tables and Chrome traces."""
    import os

    from dynspec.benchmarks.step_timing import step_kernels, time_plans, trace_steps
    from dynspec.runtime.policy.acceptance import Greedy

    b, k, chunk = point
    modes = ["eager", "full"] if full else ["eager"]
    trials: dict[str, list[float]] = {m: [] for m in modes}

    def timed(mode: str, fn):
        if mode == "full":
            return fn()
        with eager_mixed(engine):
            return fn()

    for t in range(args.trials):
        for mode in modes[t % len(modes):] + modes[: t % len(modes)]:
            trials[mode].append(timed(mode, lambda: time_plans(engine, {mode: mixed}, Greedy(), warmup=2,
                                                                repeats=args.repeats, passes=1, progress=None)[mode]))
    dec = time_plans(engine, {"decode": decode}, Greedy(), warmup=2, repeats=args.repeats, passes=1,
                      progress=None)["decode"]
    kernels = {m: timed(m, lambda: step_kernels(engine, mixed, args.kernels, top=100))
               if args.kernels and m in modes else None for m in ("eager", "full")}
    kernels["decode"] = step_kernels(engine, decode, args.kernels, top=100) if args.kernels else None
    trace = None
    if getattr(args, "trace", None) and engine.device.type == "cuda":
        os.makedirs(args.trace, exist_ok=True)
        trace = timed("full" if full else "eager", lambda: trace_steps(
            engine, {"mixed": mixed, "decode": decode}, 4, os.path.join(args.trace, f"trace_{b}_{k}_{chunk}.json")))
    med = {m: statistics.median(v) for m, v in trials.items()}
    f = med.get("full")
    return {"point": f"{b}:{k}:{chunk}", "batch_size": b, "k": k, "chunk": chunk, "tokens": b * (k + 1) + chunk,
            "eager_ms": med["eager"], "full_ms": f, "decode_ms": dec, "eager_vs_full": med["eager"] / f if f else None,
            "trials_ms": trials, "eager_kernels": kernels["eager"], "full_kernels": kernels["full"],
            "decode_kernels": kernels["decode"], "trace": trace}


if __name__ == "__main__":
    sys.exit(main())
