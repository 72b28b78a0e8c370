"""Single engine steps timed on synthetic rows: b rows whose pending token sits at a fixed
position, the same plan every repeat (the KV cache contents do not change the cost). Shared by
profile, mixed_step and tp_decode; the kernel table and the Chrome trace are CUDA only."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

from dynspec.errors import DynspecError


def sync_device(device) -> None:
    if getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Shape:
    batch_size: int
    k: int
    keep_warm: bool
    chunk: int = 0           # tokens of one prompt chunk riding in the step (its prompt's last), in slot slots[b]
    lazy: bool = False       # K=0 with lazy draft sync: the rows' features stored for a later catch-up
    catch_up: int = 0        # lazy draft sync: draft entries each row catches up before the step's draft work


def synthetic_plan(engine, shape: Shape, context_len: int, slots: Sequence[int], seed: int = 0):
    """b rows (in cache slots[:b]) whose pending token sits at position context_len (cache
    contents do not change the cost); with shape.chunk, a last chunk of that many tokens of a
    prompt at position context_len in slots[b]."""
    import random

    from dynspec.runtime.serving.plan import CatchUp, PromptChunk, make_plan

    rng = random.Random(seed)
    b, c = shape.batch_size, shape.chunk
    chunks = [PromptChunk(slots[b], context_len, tuple(rng.randrange(2, 16) for _ in range(c)), None)] if c else []
    n = shape.catch_up                   # entries context_len - n .. context_len - 1 of every row
    spans = [CatchUp(s, context_len - n, tuple(rng.randrange(2, 16) for _ in range(n))) for s in slots[:b]] if n else []
    return make_plan(shape.k, positions=[context_len] * b, pending=[rng.randrange(2, 16) for _ in range(b)],
                     stale=[False] * b, keep_warm=shape.keep_warm, buckets=engine.buckets, slots=slots[:b],
                     chunks=chunks, lazy=shape.lazy, catch_up=spans, store_chunks=shape.lazy and bool(b and c))


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
    from dynspec.runtime.policy.acceptance import Greedy

    rows = max(s.batch_size + (1 if s.chunk else 0) for s in shapes)
    span = context_len + max(max(s.k + 1, s.chunk) for s in shapes)
    with reserved_rows(engine, rows, span) as slots:
        plans = {s: synthetic_plan(engine, s, context_len, slots) for s in shapes}
        return time_plans(engine, plans, Greedy(), warmup=warmup, repeats=repeats, passes=passes, progress=progress)


def time_plans(engine, plans: dict, acc, *, warmup: int, repeats: int, passes: int, progress,
               statistic=statistics.median) -> dict[Shape, float]:
    """ms of each plan's step, `statistic` over its timed steps (time_shapes' docstring: the passes)."""
    shapes = list(plans)
    for s in shapes:
        for _ in range(warmup):
            engine.step(plans[s], acc)
    sync_device(engine.device)
    times: dict[Shape, list[float]] = {s: [] for s in shapes}
    passes = max(1, min(passes, repeats))
    for p in range(passes):
        n = repeats // passes + (1 if p < repeats % passes else 0)
        for s in shapes:
            engine.step(plans[s], acc)               # untimed: back to this shape
            sync_device(engine.device)
            for _ in range(n):
                t0 = time.perf_counter()
                engine.step(plans[s], acc)
                sync_device(engine.device)
                times[s].append(time.perf_counter() - t0)
            if progress:
                progress(1)
    return {s: 1e3 * statistic(t) for s, t in times.items()}


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

    from dynspec.runtime.policy.acceptance import Greedy

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

    from dynspec.runtime.policy.acceptance import Greedy

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
