"""The main job's schedule tuned where it runs (`dynspec generate` on the embedded pair, no
--schedule): `dynspec profile` then `dynspec tune` on the open engine, in seconds."""
from __future__ import annotations

import time
from dataclasses import dataclass

from dynspec.errors import DynspecError

TUNE_PROMPTS = 4              # tuning at start: acceptance is measured on this many of the job's prompts,
TUNE_NEW_TOKENS = 64          # generating at most this many tokens each (at most --max-new-tokens) at static K=max
TUNE_PASSES, TUNE_STEPS = 8, 3     # profiled (b, K): passes over the grid, consecutive timed steps per pass


@dataclass(frozen=True)
class Tuned:
    """A schedule tuned at start (tune_here) and what it was tuned from."""
    schedule: object                      # DraftSchedule
    batch_sizes: tuple[int, ...]
    max_k: int
    context: int
    acceptance: tuple[float, ...]         # per draft position, measured
    prompts: int                          # prompts the acceptance was measured on
    host_ms: float                        # the executor's time per iteration outside engine.step
    seconds: float

    def __str__(self) -> str:
        rates = ", ".join(f"{a:.2f}" for a in self.acceptance)
        return (f"tuned here in {self.seconds:.1f} s: acceptance per draft position {rates} on {self.prompts} prompts, "
                f"iteration ms of b={','.join(map(str, self.batch_sizes))} x K=0..{self.max_k} at context "
                f"{self.context} + {self.host_ms:.2f} ms executor time, `dynspec tune` rule")


def fastest_step_ms(engine, batch_sizes, ks, context: int, *, keep_warm: bool = True,
                    passes: int = TUNE_PASSES, steps: int = TUNE_STEPS) -> dict[int, dict[int, float]]:
    """{b: {K: ms}}: the fastest engine.step of each (b, K) on synthetic rows at `context` (K=0 with
    keep-warm when the engine keeps the draft warm, as a schedule serves it). Each pass runs every
    shape for one untimed and `steps` timed consecutive steps. On a shared machine other processes
    only ever add time to a step, so the minimum, not the median, is the step's own cost."""
    from dynspec.benchmarks.step_timing import Shape, reserved_rows, synthetic_plan, time_plans
    from dynspec.runtime.acceptance import Greedy

    shapes = [Shape(b, k, keep_warm and k == 0) for b in batch_sizes for k in ks]
    with reserved_rows(engine, max(batch_sizes), context + max(ks) + 1) as slots:
        plans = {s: synthetic_plan(engine, s, context, slots) for s in shapes}
        ms = time_plans(engine, plans, Greedy(), warmup=0, repeats=passes * steps, passes=passes, progress=None,
                        statistic=min)
    return {b: {k: ms[Shape(b, k, keep_warm and k == 0)] for k in ks} for b in batch_sizes}


def typical_context(prompts, max_new_tokens: int) -> int:
    """The KV length a decode row has on average: mean prompt length + half the new tokens."""
    return max(1, round(sum(map(len, prompts)) / max(len(prompts), 1)) + max_new_tokens // 2)


def tune_here(engine, prompts, *, concurrency: int, max_k: int, context: int, new_tokens: int,
              keep_warm: bool = True) -> Tuned | None:
    """`dynspec profile` then `dynspec tune` on the open engine, in seconds.
    1. Sample: the first TUNE_PROMPTS prompts (new_tokens tokens each) served at static K=max_k give
       the per-position acceptance and the executor's own time per iteration outside engine.step.
    2. Profile: the fastest engine step of every (b, K), b in {1, 2, 4, ..., concurrency} and K in
       0..max_k, at `context` (capped by the cache), plus that per-iteration time: what a served
       iteration costs.
    3. Tune: the goodput rule of benchmarks/tune.py (no draft margin: the acceptance is this job's own).
    The engine's cache is left as it was. None when no prompt leaves room for the sample or the
    sample ran no K=max_k step."""
    from dynspec.benchmarks.profile import per_position_rates
    from dynspec.benchmarks.tune import tune
    from dynspec.runtime.driver import run_closed_loop
    from dynspec.runtime.executor import Executor
    from dynspec.runtime.policy import DraftSchedule

    t0 = time.perf_counter()
    room = engine.max_seq_len - max_k - 1
    sample = [p for p in prompts if len(p) + new_tokens <= room][:TUNE_PROMPTS]
    if not sample or max_k < 1:
        return None
    rec = AcceptanceRecorder(engine)
    ex = Executor(rec, DraftSchedule.static(max_k, engine.max_batch_size), keep_warm=keep_warm, stats_limit=None)
    t1 = time.perf_counter()
    run_closed_loop(ex, sample, new_tokens, min(concurrency, len(sample)))
    wall = time.perf_counter() - t1
    try:
        acceptance = per_position_rates(rec.steps, max_k)
    except DynspecError:                  # every row finished before a K=max_k step
        return None
    host_ms = 1e3 * max(0.0, wall - sum(s.seconds for s in ex.stats)) / max(len(ex.stats), 1)
    batch_sizes = sorted({1 << i for i in range(concurrency.bit_length())} | {concurrency})
    context = min(context, room)
    table = fastest_step_ms(engine, batch_sizes, range(max_k + 1), context, keep_warm=keep_warm)
    served = {b: {k: ms + host_ms for k, ms in row.items()} for b, row in table.items()}
    res = tune(served, acceptance, max_k, max_num_tokens=getattr(engine, "max_num_tokens", None))
    return Tuned(res.schedule, tuple(batch_sizes), max_k, context, tuple(acceptance), len(sample), host_ms,
                 time.perf_counter() - t0)


class AcceptanceRecorder:
    """Wraps an engine: forwards everything, keeps each step's (K, per-row accepted drafts),
    whether the executor runs it whole (step) or launches it and reads it back (launch / result)."""

    def __init__(self, engine):
        self._engine, self.steps = engine, []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, plan, acceptance):
        return self.result(self.launch(plan, acceptance))

    def launch(self, plan, acceptance):
        return plan.k, self._engine.launch(plan, acceptance)       # (K, the engine's handle)

    def result(self, handle):
        k, inner = handle
        res = self._engine.result(inner)
        self.steps.append((k, tuple(res.accepted)))
        return res
