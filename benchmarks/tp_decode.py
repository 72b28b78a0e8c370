"""Plain decode at b=1 with 1024 tokens of context under tensor parallelism, beside its floors,
per all-reduce mode, in one run (the TP=2 vs TP=1 figures of tp_summary; docs/tensor_parallel.md).

    python -m dynspec.benchmarks.tp_decode --engine-dir E --device cuda --out tp1.json            # TP=1
    mpirun -n 2 python -m dynspec.benchmarks.tp_decode --engine-dir E --device cuda --tp 2 --out tp2.json

Every rank loads its shard and runs the same steps itself (SPMD: no leader channel, so the
step is the engine's alone, as at TP=1). For each mode in --modes the b=1 decode graph is
captured again with that all-reduce, then timed (step_timing.time_shapes, median); the modes
rotate over --trials passes so drift hits all of them. Modes: nccl, one-shot
(runtime/tp/allreduce.py: torch's one-shot kernel, then the norm, as served), one-shot-fused (the sum
fused into the residual add and RMSNorm after it: fused_allreduce_norm.py, not yet served), skip (no
communication: wrong sums; the step without its collectives, so comm_fraction = 1 - skip / mode).

Floors, from the same engine in the same run (gemm_floor.gemm_floor_ms, one CUDA graph each):
    gemm_floor_ms                 this rank's GEMMs alone (TP=2: half of every matrix)
    gemm_floor_allreduce_ms[mode] the same GEMMs with the 2 all-reduces per layer after o and
                                  down (a [1, hidden] row each), captured in the same graph
The JSON (world rank 0):
    {"tp": 2, "context_len": 1024, "decode_ms": {"nccl": 3.9, ...}, "trials_ms": {mode: [...]},
     "gemm_floor_ms": 2.47, "gemm_floor_allreduce_ms": {"nccl": 3.0, ...},
     "comm_fraction": {"nccl": 0.2, ...}, "decode_vs_floor": {mode: decode / gemm_floor}, ...}
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from dynspec.benchmarks.engines import add_engine_args, add_step_timing_args, apply_bench_env, engine_choice
from dynspec.benchmarks.gemm_floor import FLOOR_CONTEXT as CONTEXT      # profile --floor's context, 1024
from dynspec.errors import DynspecError
from dynspec.runtime.generate.session import check_device


def make_parser() -> argparse.ArgumentParser:
    from dynspec.parsers import DefaultsFormatter

    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.tp_decode", description=__doc__.splitlines()[0],
                                allow_abbrev=False, formatter_class=DefaultsFormatter)
    add_engine_args(p)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--modes", default="nccl,one-shot,one-shot-fused,skip", help="all-reduce modes to time (TP > 1)")
    add_step_timing_args(p, 60, "also list the GPU kernels of STEPS decode steps (torch.profiler), per step")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    from dynspec.runtime.tp.tp_lifecycle import exit_status

    try:
        return exit_status(run(args))
    except DynspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_status(2)


def run(args) -> int:
    from dynspec.benchmarks.engines import open_sized
    from dynspec.benchmarks.gemm_floor import gemm_floor_ms, target_gemm_weights
    from dynspec.benchmarks.step_timing import Shape, sync_device, time_shapes
    from dynspec.runtime.engines.reference.engine import reachable_graphs
    from dynspec.runtime.policy import ConstantK
    from dynspec.runtime.tp.tp_groups import abort_on_error, init_tp
    from dynspec.runtime.tp.tp_layout import log
    from dynspec.runtime.tp.tp_lifecycle import shutdown

    apply_bench_env()
    check_device(args.device)
    if args.tp < 1:
        raise DynspecError(f"--tp {args.tp} must be at least 1")
    modes = [m for m in args.modes.split(",") if m] if args.tp > 1 else ["none"]
    one_shot = {"one-shot", "one-shot-fused"}
    ctx = init_tp(args.tp, device=args.device, allreduce="auto" if one_shot & set(modes) else "nccl")
    fallback = None
    if ctx.reducer is not None and ctx.reducer.mode != "one-shot" and one_shot & set(modes):
        fallback = ctx.reducer.fallback or f"not on {ctx.device.type}"     # time the other modes
        modes = [m for m in modes if m not in one_shot]
    with abort_on_error(ctx):
        cfg = engine_choice(args).config
        engine = open_sized(cfg, device=args.device, tp=ctx if args.tp > 1 else None, max_batch_size=1,
                            max_seq_len=CONTEXT + 2, max_draft_len=1)
        keys = reachable_graphs([ConstantK(0)], 1, False, engine.max_num_tokens)
        bare = Shape(1, 0, False)
        reducer = ctx.reducer

        def use(mode: str) -> None:
            if reducer is not None:
                reducer.use(mode.removesuffix("-fused"), fuse_norm=mode.endswith("-fused"))

        def serve_with(mode: str) -> None:
            """The all-reduce mode, and the decode graph captured again with it (graphs bake it in)."""
            use(mode)
            engine.drop_graphs()
            engine.capture_decode_graphs(keys)

        trials: dict[str, list[float]] = {m: [] for m in modes}
        for t in range(args.trials):
            order = modes[t % len(modes):] + modes[: t % len(modes)]
            for mode in order:
                serve_with(mode)
                trials[mode].append(time_shapes(engine, [bare], CONTEXT, warmup=5, repeats=args.repeats)[bare])
                log(f"tp={args.tp} {mode}: {trials[mode][-1]:.3f} ms")
        ws = target_gemm_weights(engine.target)
        floor, method = gemm_floor_ms(ws, repeats=args.repeats)
        floor_ar = {}
        if args.tp > 1:
            for mode in (m for m in modes if m not in ("skip", "one-shot-fused")):    # no norms in the floor
                use(mode)
                floor_ar[mode] = gemm_floor_ms(ws, repeats=args.repeats, reduce=(reducer, (1, 3)))[0]
        kernels = None
        if args.kernels and engine.device.type == "cuda":
            serve_with(modes[0] if modes[0] != "skip" else modes[-1])
            kernels = kernel_table(engine, args.kernels)
        sync_device(engine.device)
        doc = result_doc(args, cfg, trials, (floor, method, floor_ar), fallback, kernels)
        decode = doc["decode_ms"]
        if ctx.layout.rank == 0:
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)
            log(f"wrote {args.out}: {json.dumps(decode)}")
        shutdown(ctx)
    return 0


def result_doc(args, cfg, trials: dict, floors: tuple, fallback, kernels) -> dict:
    """The result file's fields: the trials' medians and spreads against the GEMM floor."""
    import torch

    floor, method, floor_ar = floors
    decode = {m: statistics.median(v) for m, v in trials.items()}
    return {
        "tp": args.tp, "context_len": CONTEXT, "batch_size": 1, "device": torch.cuda.get_device_name()
        if torch.cuda.is_available() else "cpu", "dtype": cfg.reference.dtype,
        "decode_ms": decode, "trials_ms": trials,
        "spread_ms": {m: [min(v), max(v)] for m, v in trials.items()},
        "gemm_floor_ms": floor, "gemm_floor_method": method, "gemm_floor_allreduce_ms": floor_ar,
        "decode_vs_floor": {m: d / floor for m, d in decode.items()},
        "comm_fraction": ({m: 1 - decode["skip"] / d for m, d in decode.items() if m != "skip"}
                          if "skip" in decode else {}),
        "one_shot_unavailable": fallback,
        "kernels": kernels,
        "statistic": f"median of {args.trials} trials, each the median of {args.repeats} steps",
        "command": " ".join(["python -m dynspec.benchmarks.tp_decode", *sys.argv[1:]]),
    }


def kernel_table(engine, steps: int, top: int = 30) -> dict:
    """step_timing.step_kernels of `steps` b=1 decode steps (graph replays) with 1024 tokens of context."""
    from dynspec.benchmarks.step_timing import Shape, reserved_rows, step_kernels, synthetic_plan

    with reserved_rows(engine, 1, CONTEXT + 2) as slots:
        return step_kernels(engine, synthetic_plan(engine, Shape(1, 0, False), CONTEXT, slots), steps, top)


if __name__ == "__main__":
    sys.exit(main())
