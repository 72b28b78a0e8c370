"""The main job's schedule tuned where it runs (`dynspec generate` on the embedded pair, no
--schedule): every load of the job served for a moment at every K, then the `dynspec tune` rule on
what those served iterations cost, in seconds.

Served runs, not engine steps alone: at a high load a row that speculates finishes apart from its
neighbours, so the next prompt joins in a chunk beside the decoding rows (a mixed iteration, about
1 in 4 at C=16 on the embedded pair) and the run's last rows drain at a smaller batch, while at K=0
the rows finish together and their prompts are prefilled as one batch. A profile of decode steps
prices none of that: on 2 CPU cores it kept K=3-4 at C=16, where K=4 served 0.86-0.99x K=0's tok/s."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from dynspec.errors import DynspecError
from dynspec.runtime.policy.expected_tokens import expected_tokens
from dynspec.runtime.generate.generate_report import TIE
from dynspec.runtime.policy.tune import per_position_rates, tune

TUNE_WAVES = 2          # a load C is served on at most 2 x C of the job's prompts: the second wave joins beside rows
TUNE_NEW_TOKENS = 64    # tokens a prompt generates while tuning (at most --max-new-tokens)
TUNE_TRIALS = 2         # runs of every (load, K), the K's order rotated
SHAPE_QUANTILE = 0.25   # an iteration's price: this quantile of its shape's iterations over the trials (priced)
PAYS = 1 + TIE          # K > 0 only where it serves this many times K=0's tok/s: where the verdict says static pays


@dataclass(frozen=True)
class Tuned:
    """A schedule tuned at start (tune_here) and what it was tuned from."""
    schedule: object                             # DraftSchedule
    max_k: int
    tok_per_s: dict[int, dict[int, float]]       # {load C: {K: served tok/s, as priced}}
    clock: str                                   # what timed them: "CPU" (this thread's) or "wall"
    acceptance: tuple[float, ...]                # per draft position, measured in the K=max_k runs
    seconds: float

    def __str__(self) -> str:
        rates = ", ".join(f"{a:.2f}" for a in self.acceptance)
        served = "; ".join(f"C={c} {' '.join(f'{v:.0f}' for v in row.values())}" for c, row in self.tok_per_s.items())
        return (f"tuned here in {self.seconds:.1f} s: each load served at K=0..{self.max_k}, {self.clock} tok/s "
                f"{served}; acceptance per draft position {rates}; `dynspec tune` rule, K > 0 where it serves "
                f">= {PAYS:.2f}x K=0")


def tune_prompts(prompts, sizes: dict[int, int]) -> dict[int, list]:
    """{C: the prompts load C is tuned on}: the first min(TUNE_WAVES x C, prompts the job runs at C)."""
    return {c: list(prompts[:min(TUNE_WAVES * c, n)]) for c, n in sizes.items()}


def tuning_clock(device, loop) -> tuple[Callable[[], float], str]:
    """(clock, its name) the served runs are timed by: this thread's CPU time where every step runs
    on it (CPU, one torch thread, the serial loop), so that a neighbour who takes the CPU away adds
    nothing; wall time elsewhere."""
    import torch

    from dynspec.runtime.serving.loop import Loop

    if str(device).startswith("cpu") and torch.get_num_threads() == 1 and loop in (None, Loop.SERIAL):
        return time.thread_time, "CPU"
    return time.perf_counter, "wall"


def serve_every_k(engine, by_load: dict[int, list], max_k: int, new_tokens: int, *, stop_ids=(),
                  draft_sync: str = "lazy", loop=None, trials: int = TUNE_TRIALS,
                  clock: Callable[[], float] = time.perf_counter, progress=None):
    """Serve each load's prompts in a closed loop at C at K = 0..max_k as the job's modes do (K=0: the
    target alone, as baseline; K > 0: static K), `trials` times (trial t starts the K's at t) ->
    ({C: {K: tok/s}} (priced), the acceptance recorder's steps), after a short warm-up at the largest
    load; every iteration timed by `clock`."""
    from dynspec.runtime.serving.driver import closed_loop, run_closed_loop
    from dynspec.runtime.serving.executor import Executor
    from dynspec.runtime.serving.gc_heap import freeze_heap
    from dynspec.runtime.generate.generate_report import signature
    from dynspec.runtime.policy import DraftSchedule

    def policy(k):
        return DraftSchedule.static(k, engine.max_batch_size) if k else DraftSchedule()

    rec = AcceptanceRecorder(engine)
    runs: dict = {(c, k): [] for c in by_load for k in range(max_k + 1)}
    tokens: dict = {}
    kw = {} if loop is None else {"loop": loop}
    top = max(by_load)
    for k in (0, max_k):        # warm-up: the largest load's prompt batch and decode rows, at both ends of K
        run_closed_loop(Executor(engine, policy(k), draft_sync=draft_sync, **kw), by_load[top][:top], 4, top, stop_ids)
    for t in range(trials):
        for c, prompts in by_load.items():
            for k in [*range(t % (max_k + 1), max_k + 1), *range(t % (max_k + 1))]:
                ex = Executor(rec if k == max_k else engine, policy(k), draft_sync=draft_sync, stats_limit=None, **kw)
                freeze_heap()
                marks, stats = [clock()], []
                handles = closed_loop(ex, [(p, new_tokens) for p in prompts], c, stop_ids,
                                      on_step=lambda st: (marks.append(clock()), stats.append(st)))
                runs[(c, k)].append((signature(stats), [b - a for a, b in zip(marks, marks[1:])]))
                tokens[(c, k)] = sum(len(h.result().output_ids) for h in handles)
                if progress is not None:
                    progress.update(1)
    return {c: priced({k: (tokens[(c, k)], runs[(c, k)]) for k in range(max_k + 1)}) for c in by_load}, rec.steps


def priced(by_k: dict[int, tuple[int, list]], q: float = SHAPE_QUANTILE) -> dict[int, float]:
    """One load's {K: (tokens, trials [(signature, seconds of each iteration)])} -> {K: tok/s}: every
    iteration of the first trial priced at the lower quartile of its shape's iterations (decode
    rows, K, prompt tokens) over all the trials. The iterations of one shape cost the same up to
    their rows' context, and other processes only add time: to move a shape's price a neighbour has
    to slow three in four of its iterations over all the trials (each iteration's fastest trial
    moves as soon as both trials of that one are slowed), and a shape run 100 times is not priced
    lower than one run 10 times, as its minimum would be."""
    out = {}
    for k, (tok, trials) in by_k.items():
        pool: dict = {}
        for sig, secs in trials:
            for s, dt in zip(sig, secs):
                pool.setdefault(s[:3], []).append(dt)
        price = {s: sorted(v)[int(q * (len(v) - 1))] for s, v in pool.items()}
        out[k] = tok / sum(price[s[:3]] for s in trials[0][0])
    return out


def served_table(served: dict[int, dict[int, float]], acceptance) -> dict[int, dict[int, float]]:
    """{b: {K: ms}} for the tune rule: at b = min(C, prompts) the served price of an iteration of b
    rows at K, b x E(K) tokens at the load's served tok/s, so the rule's gain at b is served
    tok/s at K over served tok/s at K=0."""
    return {b: {k: 1e3 * b * expected_tokens(k, acceptance) / tps for k, tps in row.items()}
            for b, row in served.items()}


def tune_here(engine, by_load: dict[int, list], *, max_k: int, new_tokens: int, stop_ids=(),
              draft_sync: str = "lazy", loop=None, progress=None) -> Tuned | None:
    """The job's own serving, priced, then `dynspec tune`, in seconds.
    1. Serve: each load C's prompts (tune_prompts) in a closed loop at C at every static K = 0..max_k,
       TUNE_TRIALS times (serve_every_k, timed by tuning_clock): served tok/s per (C, K) (priced: each
       iteration at the lower quartile of its shape), prompt chunks beside decoding rows, a draining
       batch and prefill batches priced as the job meets them.
    2. Tune: the goodput rule of runtime/policy/tune.py on those prices (served_table), K > 0 only where
       it serves PAYS x K=0's tok/s; between loads the prices are interpolated in b, above the
       largest K=0. The acceptance (K=max_k runs) is reported.
    None when max_k < 1, no load has a prompt, or no row ran a K=max_k step."""
    t0 = time.perf_counter()
    loads = {min(c, len(p)): p for c, p in sorted(by_load.items()) if p}   # a load with fewer prompts runs fewer rows
    if max_k < 1 or not loads:
        return None
    clock, clock_name = tuning_clock(engine.device, loop)
    served, steps = serve_every_k(engine, loads, max_k, new_tokens, stop_ids=stop_ids, draft_sync=draft_sync,
                                  loop=loop, clock=clock, progress=progress)
    try:
        acceptance = per_position_rates(steps, max_k)
    except DynspecError:                  # every row finished before a K=max_k step
        return None
    res = tune(served_table(served, acceptance), acceptance, max_k, min_gain=PAYS,
               max_num_tokens=getattr(engine, "max_num_tokens", None))
    return Tuned(res.schedule, max_k, served, clock_name, tuple(acceptance), time.perf_counter() - t0)


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
