"""The GEMM floor of a decode step and the times measured beside it (`profile --floor`): the
target's weight matrices multiplied alone in the shapes of a b=1 decode step, the same step's
CUDA graphs replayed alone, and the step served by the overlapped executor loop. The fields and
what each ratio means: benchmarks/profile.py's docstring."""
from __future__ import annotations

import statistics
import time
from typing import Sequence

from dynspec.benchmarks.step_timing import Shape, sync_device, reserved_rows, synthetic_plan, time_shapes
from dynspec.errors import DynspecError


def target_gemm_weights(target) -> list:
    """The weight matrices a b=1 decode step multiplies, in order: per layer [qkv, o, gate_up, down],
    then the lm_head. Llama-3.1-8B: 32 x ([6144, 4096], [4096, 4096], [28672, 4096], [4096, 14336])
    + [128256, 4096] -> 129 matrices, 16.06 GB in bf16 with the embedding, 15.0 GB without."""
    ws = []
    for layer in target.layers:
        ws += [layer.wqkv, layer.wo, layer.w13, layer.w2]
    return ws + [target.lm_head]


def gemm_floor_ms(weights: Sequence, *, warmup: int = 5, repeats: int = 50, graph: bool = True,
                  reduce=None) -> tuple[float, str]:
    """(median ms, method) of x_i @ W_i^T for every W_i [out, in] with x_i [1, in]: the GEMMs of a
    b=1 decode step alone. On CUDA (graph=True) all of them are captured in one CUDA graph and the
    graph is replayed `repeats` times; elsewhere they run eagerly (labelled so).
    reduce: (fn, positions): y_i = fn(y_i) after GEMM i when i % 4 is in positions, the lm_head
    excepted; (allreduce, (1, 3)) adds a TP step's all-reduces after o and down (tp_decode.py)."""
    import torch

    if not weights:
        raise DynspecError("no weight matrices to time")
    dev = weights[0].device
    with torch.no_grad():
        xs = [torch.randn(1, w.shape[1], device=dev, dtype=w.dtype) for w in weights]     # [1, in]
        ys = [torch.empty(1, w.shape[0], device=dev, dtype=w.dtype) for w in weights]     # [1, out]

        fn, at = reduce if reduce is not None else (None, ())
        last = len(weights) - 1

        def gemms() -> None:
            for i, (x, w, y) in enumerate(zip(xs, weights, ys)):
                torch.mm(x, w.t(), out=y)
                if i % 4 in at and i < last:
                    fn(y)

        cuda = dev.type == "cuda"
        run = gemms
        if cuda and graph:
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(3):
                    gemms()
            torch.cuda.current_stream(dev).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                gemms()
            run = g.replay
        for _ in range(warmup):
            run()
        sync_device(dev)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            sync_device(dev)
            times.append(time.perf_counter() - t0)
    where_ar = f" with an all-reduce after GEMMs i % 4 in {at}" if fn is not None else ""
    where = (f"cuda graph of the {len(weights)} GEMMs{where_ar}" if cuda and graph else
             f"{dev.type} eager (no CUDA graph), {len(weights)} GEMMs{where_ar}")
    return 1e3 * statistics.median(times), f"{where}, {repeats} runs, median"


def graph_replay_ms(engine, shape: Shape, context_len: int, *, repeats: int, passes: int = 3) -> float | None:
    """Median ms of one plain-decode step of `shape` as its captured graphs alone, replayed `repeats`
    times back to back after one engine.step has loaded the inputs (CUDA events; the median of
    `passes` such runs): time_shapes' step without the host's serial part (planning, the input copy,
    the first graph's launch, the result read), or None where no such graph exists (CPU, eager,
    TP leaders, K > 0)."""
    import torch

    from dynspec.runtime.policy.acceptance import Greedy

    chains = getattr(engine, "graph_chains", None)           # the reference engine's decode graphs by GraphKey
    if not chains or engine.device.type != "cuda" or shape.k:
        return None
    with reserved_rows(engine, shape.batch_size, context_len + 1) as slots:
        plan = synthetic_plan(engine, shape, context_len, slots)
        graphs = chains.get(engine.route(plan)[1][0])           # K = 0: the one decode key
        if graphs is None:
            return None
        engine.step(plan, Greedy())
        times = []
        for _ in range(passes + 1):                  # the first untimed
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                graphs.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / repeats)
    return statistics.median(times[1:])


def overlap_decode_ms(engine, context_len: int, *, warmup: int, repeats: int) -> dict:
    """Plain decode at b=1 through the overlapped executor loop (Executor(loop=Loop.OVERLAPPED), K=0, no
    keep-warm): one request whose decode steps end at position context_len, its prompt prefilled
    first. Each step launches iteration i+1, then reads iteration i's result (the loop's one host
    sync), so the wall time between consecutive results is the served step in steady state, the
    host's work hidden behind the GPU's wherever it is shorter. The first `warmup` intervals are
    dropped. {"ms": median interval, "mean_ms": their mean, "steps": intervals, "first_position",
    "last_position"}."""
    import random

    from dynspec.runtime.serving.executor import Executor
    from dynspec.runtime.serving.loop import Loop
    from dynspec.runtime.serving.overlap import cache_slack
    from dynspec.runtime.policy import DraftSchedule

    n_new = warmup + repeats + 2               # the first token comes with the prefill, one more to close
    prompt_len = context_len - n_new
    need = context_len + cache_slack(engine.max_draft_len, Loop.OVERLAPPED)
    if prompt_len < 1 or need > engine.max_seq_len:
        raise DynspecError(f"--floor times overlapped decode up to context {context_len}: it needs max_seq_len"
                           f" {need} (the engine has {engine.max_seq_len}) and a context above its {n_new} decode steps")
    rng = random.Random(0)
    ex = Executor(engine, DraftSchedule(), keep_warm=False, loop=Loop.OVERLAPPED)
    h = ex.submit([rng.randrange(2, engine.vocab_size) for _ in range(prompt_len)], n_new)
    ends = []
    while not h.done:
        st = ex.step()
        if st is not None and st.batch_size == 1 and not st.prefill_tokens and st.overlapped:
            ends.append(time.perf_counter())
    ex.run_until_idle()
    gaps = [b - a for a, b in zip(ends, ends[1:])][warmup:]
    if not gaps:
        raise DynspecError("overlapped decode ran no steady-state steps to time")
    return {"ms": 1e3 * statistics.median(gaps), "mean_ms": 1e3 * statistics.fmean(gaps), "steps": len(gaps),
            "first_position": prompt_len, "last_position": context_len - 1}


FLOOR_CONTEXT = 1024


def measure_floor(engine, *, warmup: int = 5, repeats: int = 50, context_len: int = FLOOR_CONTEXT) -> dict:
    """The GEMM floor of engine.target and plain decode at b=1 with `context_len` of context,
    from the same engine: their ratio is how far the decode step is from weight streaming.
    decode_graph_ms (CUDA graphs only, else None): the same step's graphs replayed back to back, so
    decode_ms - decode_graph_ms is the host's serial part of a step and decode_graph_ms - gemm_floor_ms
    the GPU's work besides the GEMMs (attention, norms, glue, launch gaps). decode_overlap_ms: the
    step served by the overlapped loop (overlap_decode_ms), what is left of the host's part there."""
    need = context_len + 1
    if engine.max_seq_len < need:
        raise DynspecError(f"--floor times decode at context {context_len}: the engine's max_seq_len "
                           f"{engine.max_seq_len} is below {need}")
    ws = target_gemm_weights(engine.target)
    floor, method = gemm_floor_ms(ws, warmup=warmup, repeats=repeats)
    bare = Shape(1, 0, False)
    decode = time_shapes(engine, [bare], context_len, warmup=warmup, repeats=repeats)[bare]
    graphs = graph_replay_ms(engine, bare, context_len, repeats=repeats)
    over = overlap_decode_ms(engine, context_len, warmup=warmup, repeats=repeats)
    ov = over["ms"]
    wbytes = sum(w.numel() * w.element_size() for w in ws)
    return {"gemm_floor_ms": floor, "decode_ms": decode, "batch_size": 1, "context_len": context_len,
            "decode_vs_gemm_floor": decode / floor, "method": method, "gemm_weight_bytes": wbytes,
            "decode_graph_ms": graphs, "decode_graph_vs_gemm_floor": None if graphs is None else graphs / floor,
            "decode_overlap_ms": ov, "decode_overlap_vs_gemm_floor": ov / floor,
            "decode_overlap_vs_graph": None if graphs is None else ov / graphs,
            "decode_overlap": over,
            "gemm_tb_per_s": wbytes / (floor / 1e3) / 1e12, "engine_max_seq_len": engine.max_seq_len,
            "device_kind": engine.device.type}
