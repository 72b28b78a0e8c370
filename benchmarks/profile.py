"""Measure the engine's iteration time for each (context, batch size b, draft length K); K = 0 is
plain decode. One engine, its graphs captured once, times every context's grid in turn.

profile.json (the format and its reader: runtime/cost_model.py):
    {"format": "dynspec-profile/2", "device": "cuda:0 (NVIDIA H200)", "context_lens": [512, 2048],
     "tables": [{"context_len": 512,
                 "iteration_ms": {"1": {"0": 4.4, "1": 4.9, "2": 5.3}, "8": {...}},   # median of repeats
                 "decode_ms": {"1": 4.2, ...}},      # K = 0 without the keep-warm draft extend
                {"context_len": 2048, ...}],
     "acceptance": {"per_position": [0.8, 0.7, 0.6]},      # optional: --measure-acceptance
     "target_weight_bytes": 16060522496, "keep_warm": true, "repeats": 20, "warmup": 5,
     "versions": {...}, "command": "dynspec profile ..."}

With --floor (run_profile(floor=True)) it also records, from the same engine in the same run:
     "gemm_floor_ms": 4.11,
     "floor": {"gemm_floor_ms": 4.11, "decode_ms": 6.21, "batch_size": 1, "context_len": 1024,
               "decode_vs_gemm_floor": 1.51, "method": "cuda graph of the GEMMs, 50 replays, median",
               "decode_graph_ms": 5.9, "decode_graph_vs_gemm_floor": 1.44,
               "decode_overlap_ms": 5.95, "decode_overlap_vs_gemm_floor": 1.45, "decode_overlap_vs_graph": 1.008,
               "decode_overlap": {"ms": 5.95, "mean_ms": 5.97, "steps": 20, "first_position": 999,
                                  "last_position": 1023}, ...}
gemm_floor_ms is the target's weight matrices multiplied alone, in the shapes of a b=1 decode
step (per layer qkv, o, gate_up, down; then the lm_head), with nothing between them: the time
weight streaming alone takes. decode_ms is plain decode (K=0, no keep-warm) at b=1 with 1024
tokens of context, timed like every other shape; decode_graph_ms is that step's CUDA graphs
replayed back to back (None without graphs: CPU, eager, TP leaders), the step less the host's
serial part. decode_overlap_ms (ms) is the same plain decode served by the overlapped executor loop
(Executor(overlap=True)): the median wall time between consecutive step results of one request
decoding up to position 1023, the host's planning hidden behind the GPU's step (overlap_decode_ms);
decode_overlap_vs_graph near 1.0 means nothing of the host's part is left. Every ratio is of two
times from the same engine in the same process; a None time gives a None ratio.

Each (b, K) runs engine.step on synthetic rows: b rows whose pending token sits at position
context_len (the KV cache contents do not change the cost), the same plan every repeat, so
the context length stays fixed; runs of consecutive steps per shape, spread over 3 passes,
median reported (see time_shapes). With CUDA graphs on, the graphs for every measured shape
are captured first, as serving would. On CPU the served spec step measured ~10% slower than
this synthetic one (executor work between steps evicts caches); on a GPU with graphs the
step does not depend on what runs between replays.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from dynspec.config import GraphMode
from dynspec.errors import DynspecError
from dynspec.runtime.cost_model import ContextTable, Profile

# ---- measurement ------------------------------------------------------------------------
def _sync(device) -> None:
    if getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Shape:
    batch_size: int
    k: int
    keep_warm: bool


def synthetic_plan(engine, shape: Shape, context_len: int, slots: Sequence[int], seed: int = 0):
    """b rows (in cache slots[:b]) whose pending token sits at position context_len (cache
    contents do not change the cost)."""
    import random

    from dynspec.runtime.plan import make_plan

    rng = random.Random(seed)
    b = shape.batch_size
    return make_plan(shape.k, positions=[context_len] * b, pending=[rng.randrange(2, 16) for _ in range(b)],
                     stale=[False] * b, keep_warm=shape.keep_warm, buckets=engine.buckets, slots=slots[:b])


class reserved_rows:
    """`with reserved_rows(engine, n, tokens) as slots:` n cache slots holding `tokens` positions each.
    A paged engine reserves their blocks (so attention reads real, owned blocks) and releases them
    on exit; an engine with one fixed cache row per slot (no `reserve`) uses rows 0..n-1."""

    def __init__(self, engine, n: int, tokens: int):
        self.engine, self.n, self.tokens, self.slots = engine, n, tokens, ()

    def __enter__(self) -> tuple[int, ...]:
        if not hasattr(self.engine, "reserve"):
            return tuple(range(self.n))
        for _ in range(self.n):
            s = self.engine.reserve(self.tokens)
            if s is None:
                self.__exit__()
                raise DynspecError(f"the KV cache has no room for {self.n} rows of {self.tokens} tokens")
            self.slots += (s,)
        return self.slots

    def __exit__(self, *exc) -> None:
        for s in self.slots:
            self.engine.release(s)
        self.slots = ()


def time_shapes(engine, shapes: Sequence[Shape], context_len: int, *, warmup: int, repeats: int, passes: int = 3,
                progress=None) -> dict[Shape, float]:
    """Median ms of engine.step per shape.

    Serving runs one shape for many consecutive steps, so each shape is timed in runs of
    consecutive steps (switching shape every step inflated a 1.3 ms CPU decode step to 2.0 ms).
    The repeats are split over `passes` passes through all shapes, each run starting with one
    untimed step, so a burst of machine noise spoils a part of every shape's samples rather
    than all of one shape's."""
    from dynspec.runtime.acceptance import Greedy

    with reserved_rows(engine, max(s.batch_size for s in shapes), context_len + max(s.k for s in shapes) + 1) as slots:
        plans = {s: synthetic_plan(engine, s, context_len, slots) for s in shapes}
        return _time_plans(engine, plans, Greedy(), warmup=warmup, repeats=repeats, passes=passes, progress=progress)


def _time_plans(engine, plans: dict, acc, *, warmup: int, repeats: int, passes: int, progress) -> dict[Shape, float]:
    shapes = list(plans)
    for s in shapes:
        for _ in range(warmup):
            engine.step(plans[s], acc)
    _sync(engine.device)
    times: dict[Shape, list[float]] = {s: [] for s in shapes}
    passes = max(1, min(passes, repeats))
    for p in range(passes):
        n = repeats // passes + (1 if p < repeats % passes else 0)
        for s in shapes:
            engine.step(plans[s], acc)               # untimed: back to this shape
            _sync(engine.device)
            for _ in range(n):
                t0 = time.perf_counter()
                engine.step(plans[s], acc)
                _sync(engine.device)
                times[s].append(time.perf_counter() - t0)
            if progress:
                progress(1)
    return {s: 1e3 * statistics.median(t) for s, t in times.items()}


def step_kernels(engine, plan, steps: int, top: int = 30) -> dict:
    """The GPU kernels of `steps` runs of engine.step(plan) under torch.profiler, per step:
    {"steps": 20, "wall_us_per_step": 5300.0, "kernels_per_step": 518, "kernel_us_per_step": 4600.0,
     "top": [{"name", "calls", "us"}, ...] by time}. Wall minus kernel time is what the GPU spent
    waiting (launch gaps, or the host when a step is host-bound) plus the profiler's own cost: a
    5.22 ms b=1 decode step took 6.39 ms under it. CUDA only."""
    from collections import defaultdict

    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from dynspec.runtime.acceptance import Greedy

    for _ in range(3):
        engine.step(plan, Greedy())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step(plan, Greedy())
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    us, calls = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            us[e.name[:160]] += e.time_range.elapsed_us()
            calls[e.name[:160]] += 1
    rows = sorted(({"name": n, "calls": calls[n] / steps, "us": us[n] / steps} for n in us), key=lambda r: -r["us"])
    return {"steps": steps, "wall_us_per_step": 1e6 * wall / steps, "kernels_per_step": sum(calls.values()) / steps,
            "kernel_us_per_step": sum(us.values()) / steps, "top": rows[:top]}


def trace_steps(engine, plans: dict, steps: int, path: str) -> str:
    """A gzipped Chrome trace (CPU ops + CUDA kernels, chrome://tracing or Perfetto) of `steps`
    runs of engine.step for each named plan, each step under a record_function range named
    "step:<name>": where the host keeps the GPU waiting shows as gaps between kernels under a
    range. Returns the path written (path + ".gz" unless it ends so). CUDA only."""
    import gzip
    import os
    import shutil
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from dynspec.runtime.acceptance import Greedy

    for plan in plans.values():
        for _ in range(2):
            engine.step(plan, Greedy())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for name, plan in plans.items():
            for _ in range(steps):
                with record_function(f"step:{name}"):
                    engine.step(plan, Greedy())
        torch.cuda.synchronize()
    out = path if path.endswith(".gz") else path + ".gz"
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as f, gzip.open(out + ".part", "wb") as g:
            shutil.copyfileobj(f, g)
    os.replace(out + ".part", out)
    return out


def measure_iteration_ms(engine, batch_sizes: Sequence[int], draft_lens: Sequence[int], context_len: int, *,
                         keep_warm: bool = True, warmup: int = 3, repeats: int = 10,
                         progress=None) -> tuple[dict[int, dict[int, float]], dict[int, float]]:
    """({b: {K: ms}}, {b: plain-decode ms without keep-warm}) for the engine as it is set up.

    K = 0 is timed as serving runs it (with keep-warm when the engine keeps the draft warm);
    decode_ms is the bare target step, what a no-speculation server pays."""
    bad = [b for b in batch_sizes if not 1 <= b <= engine.max_batch_size]
    if bad:
        raise DynspecError(f"batch sizes {bad} are outside 1..{engine.max_batch_size} (the engine's max_batch_size)")
    badk = [k for k in draft_lens if not 0 <= k <= engine.max_draft_len]
    if badk:
        raise DynspecError(f"draft lengths {badk} are outside 0..{engine.max_draft_len} (the engine's max_draft_len)")
    need = context_len + max(draft_lens) + 1
    if need > engine.max_seq_len:
        raise DynspecError(f"--context-lens: context {context_len} + K {max(draft_lens)} + 1 = {need} exceeds "
                           f"max_seq_len {engine.max_seq_len}")
    grid = [Shape(b, k, keep_warm and k == 0) for b in batch_sizes for k in draft_lens]
    bare = [Shape(b, 0, False) for b in batch_sizes]
    ms = time_shapes(engine, list(dict.fromkeys(grid + bare)), context_len, warmup=warmup, repeats=repeats,
                     progress=progress)
    table = {b: {k: ms[Shape(b, k, keep_warm and k == 0)] for k in draft_lens} for b in batch_sizes}
    decode = {b: ms[Shape(b, 0, False)] for b in batch_sizes}
    return table, decode


class _Recorder:
    """Wraps an engine: forwards everything, remembers each step's (K, per-row accepted)."""

    def __init__(self, engine):
        self._engine = engine
        self.accepted: list[tuple[int, tuple[int, ...]]] = []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, plan, acceptance):
        res = self._engine.step(plan, acceptance)
        self.accepted.append((plan.k, tuple(res.accepted)))
        return res


def per_position_rates(steps: Sequence[tuple[int, Sequence[int]]], k: int) -> tuple[float, ...]:
    """Conditional acceptance per draft position from per-row accepted counts of K=k steps.

    a_i = #(rows with n >= i) / #(rows with n >= i-1).  Rows [3, 1, 0, 3] at K=3:
        n>=0: 4, n>=1: 3, n>=2: 2, n>=3: 2  ->  (0.75, 0.667, 1.0)"""
    ns = [n for kk, rows in steps if kk == k for n in rows]
    if not ns:
        raise DynspecError(f"no K={k} steps to measure acceptance from")
    counts = [sum(1 for n in ns if n >= i) for i in range(k + 1)]
    return tuple(counts[i] / counts[i - 1] if counts[i - 1] else 0.0 for i in range(1, k + 1))


def measure_acceptance(engine, requests, k: int, concurrency: int) -> tuple[float, ...]:
    """Real (greedy) per-position acceptance at a static K over the requests."""
    from dynspec.benchmarks.loadgen import closed_loop
    from dynspec.runtime.executor import Executor
    from dynspec.runtime.policy import DraftSchedule

    rec = _Recorder(engine)
    ex = Executor(rec, DraftSchedule.static(k, engine.max_batch_size), keep_warm=True)
    closed_loop(ex, requests, concurrency)
    return per_position_rates(rec.accepted, k)


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
        _sync(dev)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            _sync(dev)
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

    from dynspec.runtime.acceptance import Greedy

    get = getattr(engine, "decode_graph", None)
    if get is None or engine.device.type != "cuda" or shape.k:
        return None
    with reserved_rows(engine, shape.batch_size, context_len + 1) as slots:
        plan = synthetic_plan(engine, shape, context_len, slots)
        graphs = get(plan.bucket, plan.keep_warm)
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


def overlap_decode_ms(engine, context_len: int, *, warmup: int, repeats: int) -> dict | None:
    """Plain decode at b=1 through the overlapped executor loop (Executor(overlap=True), K=0, no
    keep-warm): one request whose decode steps end at position context_len, its prompt prefilled
    first. Each step launches iteration i+1, then reads iteration i's result (the loop's one host
    sync), so the wall time between consecutive results is the served step in steady state, the
    host's work hidden behind the GPU's wherever it is shorter. The first `warmup` intervals are
    dropped. {"ms": median interval, "mean_ms": their mean, "steps": intervals, "first_position",
    "last_position"}; None for an engine without launch/result."""
    import random

    from dynspec.runtime.executor import Executor
    from dynspec.runtime.overlap import cache_slack
    from dynspec.runtime.policy import DraftSchedule

    if not (hasattr(engine, "launch") and hasattr(engine, "result")):
        return None
    n_new = warmup + repeats + 2               # the first token comes with the prefill, one more to close
    prompt_len = context_len - n_new
    need = context_len + cache_slack(engine.max_draft_len, True)
    if prompt_len < 1 or need > engine.max_seq_len:
        raise DynspecError(f"--floor times overlapped decode up to context {context_len}: it needs max_seq_len"
                           f" {need} (the engine has {engine.max_seq_len}) and a context above its {n_new} decode steps")
    rng = random.Random(0)
    ex = Executor(engine, DraftSchedule(), keep_warm=False, overlap=True)
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
    ov = None if over is None else over["ms"]
    wbytes = sum(w.numel() * w.element_size() for w in ws)
    return {"gemm_floor_ms": floor, "decode_ms": decode, "batch_size": 1, "context_len": context_len,
            "decode_vs_gemm_floor": decode / floor, "method": method, "gemm_weight_bytes": wbytes,
            "decode_graph_ms": graphs, "decode_graph_vs_gemm_floor": None if graphs is None else graphs / floor,
            "decode_overlap_ms": ov, "decode_overlap_vs_gemm_floor": None if ov is None else ov / floor,
            "decode_overlap_vs_graph": None if ov is None or graphs is None else ov / graphs,
            "decode_overlap": over,
            "gemm_tb_per_s": wbytes / (floor / 1e3) / 1e12, "engine_max_seq_len": engine.max_seq_len,
            "device_kind": engine.device.type}


def weight_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def run_profile(cfg, *, device: str, batch_sizes: Sequence[int], draft_lens: Sequence[int], context_lens: Sequence[int],
                warmup: int = 3, repeats: int = 10, acceptance_requests=None, acceptance_concurrency: int = 4,
                meta: Mapping[str, object] | None = None, progress=None, max_seq_len: int | None = None,
                floor: bool = False, tp: int = 1, allreduce: str = "auto") -> Profile | None:
    """Open cfg's reference engine sized for the grid, capture its graphs on CUDA once, time every
    (b, K) at each context in context_lens (ascending, one table each).

    max_seq_len: the cache length (default: just enough for the largest context). Give the sweep's
    when comparing with it: captured graphs are sized for the whole cache, so it sets part of their cost.
    floor: also measure_floor (gemm_floor_ms and decode at b=1, 1024 context) on the same engine;
    under TP its GEMMs are one rank's shard, without the collectives.
    tp: under `mpirun -n R*tp`, every rank loads its shard and the R leaders time (each step
    broadcast to its workers, as in serving); world rank 0 returns replica 0's profile with every
    replica's decode_ms in meta, the other ranks None (docs/tensor_parallel.md)."""
    from dynspec.runtime.engines.reference.engine import reachable_graphs
    from dynspec.runtime.overlap import cache_slack

    batch_sizes = sorted(set(batch_sizes))
    draft_lens = sorted(set(draft_lens))
    context_lens = sorted(set(context_lens))
    if not context_lens or context_lens[0] < 1:
        raise DynspecError(f"--context-lens {context_lens} needs one or more contexts >= 1")
    if 0 not in draft_lens:
        draft_lens = [0] + draft_lens          # plain decode is the baseline every gain is measured against
    kmax = max(draft_lens)
    max_b = max(batch_sizes + ([acceptance_concurrency] if acceptance_requests else []))
    seq = context_lens[-1] + kmax + 1
    if floor:                                  # the overlapped decode's verify windows past FLOOR_CONTEXT
        seq = max(seq, FLOOR_CONTEXT + cache_slack(max(kmax, 1), True))
    if acceptance_requests:
        seq = max(seq, max(r.input_len + r.output_tokens for r in acceptance_requests) + kmax + 1)
    if max_seq_len is not None:
        if max_seq_len < seq:
            raise DynspecError(f"--max-seq-len {max_seq_len} is below the {seq} positions this profile needs")
        seq = max_seq_len
    keep_warm = cfg.reference.keep_warm

    def load(ctx=None):
        engine = open_sized(cfg, device=device, tp=ctx, max_batch_size=max_b, max_seq_len=seq,
                            max_draft_len=max(kmax, 1))
        if device.startswith("cuda") and cfg.reference.graphs is GraphMode.FULL:
            policies = [(lambda b, k=k: k) for k in draft_lens]
            keys = (set(reachable_graphs(policies, max_b, keep_warm, engine.max_num_tokens))
                    | set(reachable_graphs([lambda b: 0], max_b, False, engine.max_num_tokens)))
            engine.capture_decode_graphs(keys)          # timed steps are pure decode
        return engine

    if tp == 1:
        return _measure(load(), cfg, device, batch_sizes, draft_lens, context_lens, keep_warm, seq, max_b, warmup,
                        repeats, acceptance_requests, acceptance_concurrency, meta, progress, floor)
    from dynspec.benchmarks.mpi import split_leaders, world
    from dynspec.runtime.distributed import run_replica

    leaders = split_leaders(world(), tp)                     # collective: every rank, before the groups
    meta = dict(meta or {}, tp=tp)
    ctx, _, prof = run_replica(tp, load, lambda engine, ctx: _measure(
        engine, cfg, device, batch_sizes, draft_lens, context_lens, keep_warm, seq, max_b, warmup, repeats,
        acceptance_requests, acceptance_concurrency, meta, progress, floor), device=device, allreduce=allreduce)
    if leaders is None:
        return None
    every = leaders.gather([t.decode_ms for t in prof.tables])          # per replica: one dict per context
    if not leaders.is_root:
        return None
    used = {"allreduce": ctx.reducer.mode, "allreduce_requested": allreduce,   # auto may have fallen back
            "allreduce_fallback": ctx.reducer.fallback or None}
    return Profile(prof.device, prof.tables, prof.per_position,
                   dict(prof.meta, replicas=leaders.size, replica_decode_ms=every, **used))


def open_sized(cfg, *, device: str, max_batch_size: int, max_seq_len: int, max_draft_len: int, tp=None):
    """benchmarks.engines.open_reference's engine, or (tp: this rank's TpContext) its shard on tp.device."""
    from dataclasses import replace

    from dynspec.benchmarks.engines import open_reference
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.session import open_reference_engine

    sizes = dict(max_batch_size=max_batch_size, max_seq_len=max_seq_len, max_draft_len=max_draft_len)
    if tp is None:
        return open_reference(cfg, device=device, **sizes)
    return open_reference_engine(replace(cfg, schedule=DraftSchedule()), tp=tp, **sizes)


def _measure(engine, cfg, device, batch_sizes, draft_lens, context_lens, keep_warm, seq, max_b, warmup, repeats,
             acceptance_requests, acceptance_concurrency, meta, progress, floor) -> Profile:
    """run_profile's measurements on an open engine (a TP leader's LeaderEngine under TP)."""
    from dynspec.benchmarks.engines import device_name, graphs_run

    kmax = max(draft_lens)
    tables = []
    for ctx in context_lens:
        table, decode = measure_iteration_ms(engine, batch_sizes, draft_lens, ctx, keep_warm=keep_warm,
                                             warmup=warmup, repeats=repeats, progress=progress)
        tables.append(ContextTable(ctx, table, decode))
    pp = None
    if acceptance_requests and kmax > 0:
        pp = measure_acceptance(engine, acceptance_requests, kmax, acceptance_concurrency)
    info = {"max_seq_len": seq, "max_batch_size": max_b, "keep_warm": keep_warm, "dtype": cfg.reference.dtype, "warmup": warmup, "repeats": repeats,
            "statistic": "median", "target_weight_bytes": weight_bytes(engine.target),
            "graphs": graphs_run(cfg, device), "cuda_graphs": graphs_run(cfg, device) == GraphMode.FULL.value}
    budget = getattr(cfg.reference, "max_num_tokens", None)
    if budget is not None:
        info["max_num_tokens"] = budget          # the token budget `dynspec tune` must respect
    if floor:
        fl = measure_floor(engine, warmup=max(warmup, 3), repeats=max(repeats, 20))
        info.update(gemm_floor_ms=fl["gemm_floor_ms"], floor=fl)
    info.update(meta or {})
    return Profile(device_name(device), tuple(tables), pp, info)
