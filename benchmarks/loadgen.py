"""Drive an Executor with a fixed concurrency (closed loop) or Poisson arrivals (open loop).

Both run on the calling thread: the load generator calls executor.step() itself and looks at
its handles after every iteration, so there is no client thread and no lock contention in
the measurement.

Closed loop at C: submit C requests; whenever one finishes, submit the next, until the
list is exhausted; then drain. With fixed lengths every iteration runs at batch C except
the drain.

Open loop at rate R req/s: arrival i is at sum of i+1 exponential gaps (seeded). A request's
latency is measured from its scheduled arrival, not from when the loop got to submit it.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from dynspec.benchmarks.metrics import RequestTiming, RunRecord, StepRecord
from dynspec.benchmarks.workload import BenchRequest
from dynspec.runtime.serving.driver import closed_loop as closed_loop_jobs

Progress = Callable[[int], None]     # called with the number of requests that just finished


def closed_loop(executor, requests: Sequence[BenchRequest], concurrency: int, *,
                clock: Callable[[], float] = time.perf_counter, progress: Progress | None = None) -> RunRecord:
    """Keep `concurrency` requests in flight until every request has finished.

    `clock` must be the executor's clock (time.perf_counter unless it was given another)."""
    finished: list[RequestTiming] = []
    steps: list[StepRecord] = []          # from step()'s own return value: the executor keeps a bounded log

    def done(handles: list) -> None:
        finished.extend(RequestTiming.of(h.result()) for h in handles)
        if progress is not None:
            progress(len(handles))

    start = clock()
    closed_loop_jobs(executor, [(r.input_ids, r.output_tokens) for r in requests], concurrency,
                     on_step=lambda st: steps.append(StepRecord.of(st)), on_done=done)
    end = clock()
    return RunRecord(tuple(finished), tuple(steps), start, end)


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """[n] arrival offsets in seconds: cumulative exponential gaps with mean 1/rate."""
    if rate <= 0:
        raise ValueError(f"request rate {rate} must be positive")
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=n))


def open_loop(executor, requests: Sequence[BenchRequest], rate: float, *, seed: int = 0,
              clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
              progress: Progress | None = None) -> RunRecord:
    """Submit request i at its Poisson arrival time; step while anything is in flight."""
    arrivals = poisson_arrivals(len(requests), rate, seed)
    inflight: list = []                       # (handle, scheduled arrival on the clock)
    finished: list[RequestTiming] = []
    steps: list[StepRecord] = []
    start = clock()
    i = 0
    while i < len(requests) or inflight:
        now = clock()
        while i < len(requests) and start + arrivals[i] <= now:
            r = requests[i]
            inflight.append((executor.submit(r.input_ids, r.output_tokens), start + float(arrivals[i])))
            i += 1
        if not inflight:
            sleep(max(0.0, start + float(arrivals[i]) - clock()))
            continue
        st = executor.step()
        if st is not None:
            steps.append(StepRecord.of(st))
        still = []
        for h, t_arr in inflight:
            if h.done:
                finished.append(replace(RequestTiming.of(h.result()), submit_s=t_arr))   # latency from its arrival
            else:
                still.append((h, t_arr))
        if progress is not None and len(still) < len(inflight):
            progress(len(inflight) - len(still))
        inflight = still
    end = clock()
    return RunRecord(tuple(finished), tuple(steps), start, end)
