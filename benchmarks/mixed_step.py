"""Mixed iterations timed in one run: the target forward eager, as piecewise CUDA graphs cut at
attention (runtime/engines/reference/piecewise.py), piecewise with the prompt chunks' attention as
gathered SDPA instead of PackedChunks (piecewise_sdpa; CUDA flex only), and as one whole-forward
graph with attention inside (whole: mixed_graphs.py). Issue 11 asks to measure eager and piecewise
and choose; beside them, the same (b, K) as a pure decode step (its graph).

    python -m dynspec.benchmarks.mixed_step --engine-dir E --device cuda --out mixed.json

A point b:K:L is b decode rows at K with `--context-len` tokens of context, plus one prompt
chunk of L tokens (the last of its prompt) riding in the same iteration, b x (K+1) + L tokens
in all. Modes alternate over --trials passes (order rotated); each trial is the median of
--repeats steps. The JSON:
    {"context_len": 512, "points": [{"point": "64:0:128", "tokens": 192, "eager_ms": 9.1,
      "piecewise_ms": 5.2, "decode_ms": 4.4, "eager_vs_piecewise": 1.75, "trials_ms": {...}}, ...]}
On CPU, with --no-mixed-graphs, and above the largest token bucket (1024) there are no
piecewise graphs: piecewise_ms is null. --trace DIR (CUDA) adds a Chrome trace per point of 4
whole-graph mixed steps and 4 decode steps (profile.trace_steps): gaps between kernels under a
step are where the GPU waited for the host.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from dynspec.benchmarks.engines import add_engine_args, add_step_timing_args, apply_bench_env, engine_choice
from dynspec.errors import DynspecError


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.mixed_step", description=__doc__.splitlines()[0])
    add_engine_args(p)
    p.add_argument("--points", default="1:0:128,16:0:128,64:0:128,64:2:64,128:0:256", help="b:K:chunk,...")
    p.add_argument("--context-len", type=int, default=512)
    add_step_timing_args(p, 20, "CUDA: also profile STEPS piecewise and STEPS whole-graph steps per point "
                                "(kernel time against wall time: piecewise_kernels, whole_kernels)")
    p.add_argument("--trace", metavar="DIR", help="CUDA: also write a Chrome trace (CPU + kernels) of 4 whole-graph "
                   "mixed steps and 4 decode steps per point, DIR/trace_<b>_<K>_<chunk>.json.gz")
    args = p.parse_args(argv)
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


def run(args, on_point=None) -> dict:
    import random

    from dynspec.benchmarks.profile import _time_plans, open_sized, reserved_rows, step_kernels, trace_steps
    from dynspec.runtime.acceptance import Greedy
    from dynspec.runtime.engines.reference.engine import reachable_graphs
    from dynspec.runtime.plan import PromptChunk, bucket_for, make_plan

    apply_bench_env()
    points = parse_points(args.points)
    cfg = engine_choice(args).config
    ctx = args.context_len
    max_b, kmax, longest = max(b for b, _, _ in points), max(k for _, k, _ in points), max(c for _, _, c in points)
    engine = open_sized(cfg, device=args.device, max_batch_size=max_b + 1, max_seq_len=max(ctx + kmax + 1, longest) + 1,
                        max_draft_len=max(kmax, 1))
    need = max(b * (k + 1) + c for b, k, c in points)
    if need > engine.max_num_tokens:
        raise DynspecError(f"--points need {need} tokens in one iteration; max_num_tokens is {engine.max_num_tokens}")
    graphs = engine.device.type == "cuda" and cfg.reference.cuda_graphs
    if graphs:
        keys = set()
        for b, k, _ in points:
            keys |= set(reachable_graphs([lambda n, k=k: k], b, True, engine.max_num_tokens))
        engine.capture_graphs(keys, mixed=cfg.reference.mixed_graphs)
    graphed = graphs and cfg.reference.mixed_graphs and engine.piecewise is not None
    packed = engine.packed_chunks
    whole, whole_error = set(), None
    if graphed:                   # mixed_graphs.py: one whole-forward graph per point's (Np, B, T)
        try:
            engine.capture_whole()
            whole = {k for k in (engine.whole.key(bucket_for(b, engine.buckets), k + 1, c) for b, k, c in points) if k}
            engine.capture_whole(exact=whole)
        except Exception as e:    # a finding, not a stop: the other modes still run
            whole, whole_error = set(), f"{type(e).__name__}: {str(e)[:500]}"
            engine.whole = None
            import traceback

            print(f"whole-forward graphs failed: {whole_error}\n{traceback.format_exc()}", file=sys.stderr)
    import torch

    rng = random.Random(0)
    rows = []
    doc = {"context_len": ctx, "device": torch.cuda.get_device_name() if engine.device.type == "cuda" else "cpu",
           "dtype": cfg.reference.dtype, "mixed_graph_buckets": list(engine.piecewise.buckets) if engine.piecewise else None,
           "whole_error": whole_error, "points": rows,
           "statistic": f"median of {args.trials} trials, each the median of {args.repeats} steps",
           "command": " ".join(["python -m dynspec.benchmarks.mixed_step", *sys.argv[1:]])}
    with reserved_rows(engine, max_b + 1, max(ctx + kmax + 1, longest)) as slots:
        for b, k, chunk in points:
            pending = [rng.randrange(2, 16) for _ in range(b)]
            toks = tuple(rng.randrange(2, 16) for _ in range(chunk))
            common = dict(positions=[ctx] * b, pending=pending, stale=[False] * b, keep_warm=k == 0,
                          buckets=engine.buckets, slots=slots[:b])
            mixed = make_plan(k, chunks=[PromptChunk(slots[b], 0, toks, None)], **common)
            decode = make_plan(k, **common)
            # above the largest token bucket the engine runs a mixed step eagerly: nothing to compare
            modes = ["eager", "piecewise"] if graphed and engine.piecewise.fits(b * (k + 1) + chunk) else ["eager"]
            if "piecewise" in modes and packed:
                modes.append("piecewise_sdpa")
            if whole and engine.whole.key(bucket_for(b, engine.buckets), k + 1, chunk) in whole:
                modes.append("whole")
            trials: dict[str, list[float]] = {m: [] for m in modes}
            for t in range(args.trials):
                for mode in modes[t % len(modes):] + modes[: t % len(modes)]:
                    engine.mixed_graphs = mode != "eager"
                    engine.packed_chunks = packed and mode != "piecewise_sdpa"
                    engine.whole_mixed = mode == "whole"
                    trials[mode].append(_time_plans(engine, {mode: mixed}, Greedy(), warmup=2, repeats=args.repeats,
                                                    passes=1, progress=None)[mode])
            engine.mixed_graphs, engine.packed_chunks, engine.whole_mixed = True, packed, False
            dec = _time_plans(engine, {"decode": decode}, Greedy(), warmup=2, repeats=args.repeats, passes=1,
                              progress=None)["decode"]
            kernels = whole_kernels = None
            if args.kernels and "piecewise" in modes:
                kernels = step_kernels(engine, mixed, args.kernels, top=12)
            if args.kernels and "whole" in modes:        # what a whole-graph mixed step still runs outside it
                engine.whole_mixed = True
                whole_kernels = step_kernels(engine, mixed, args.kernels, top=12)
                engine.whole_mixed = False
            trace = None
            if getattr(args, "trace", None) and engine.device.type == "cuda":
                import os

                os.makedirs(args.trace, exist_ok=True)
                engine.whole_mixed = "whole" in modes
                trace = trace_steps(engine, {"mixed": mixed, "decode": decode}, 4,
                                    os.path.join(args.trace, f"trace_{b}_{k}_{chunk}.json"))
                engine.whole_mixed = False
            med = {m: statistics.median(v) for m, v in trials.items()}
            pw = med.get("piecewise")
            rows.append({"point": f"{b}:{k}:{chunk}", "batch_size": b, "k": k, "chunk": chunk,
                         "tokens": b * (k + 1) + chunk, "eager_ms": med["eager"], "piecewise_ms": pw,
                         "piecewise_sdpa_ms": med.get("piecewise_sdpa"), "whole_ms": med.get("whole"),
                         "decode_ms": dec, "eager_vs_piecewise": med["eager"] / pw if pw else None,
                         "trials_ms": trials, "piecewise_kernels": kernels, "whole_kernels": whole_kernels,
                         "trace": trace})
            print(json.dumps({m: rows[-1][m] for m in ("point", "eager_ms", "piecewise_ms", "piecewise_sdpa_ms",
                                                        "whole_ms", "decode_ms")}), flush=True)
            if on_point:
                on_point(doc)
    return doc


if __name__ == "__main__":
    sys.exit(main())
