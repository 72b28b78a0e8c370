"""One TP run under mpirun, for tests/test_tp.py:

    mpirun -n N python tests/mpi/tp_run.py --tp N --target T --draft D --prompts P.json \
        --schedule 5:15 --concurrency 10 --dtype float64 --out OUT.json

OUT.json (written by world rank 0): {"outputs": [[ids...] per prompt of replica 0],
"steps": {world rank: [[iteration, b, K, [graph keys]], ...]}, "finish": [reasons]}.
--fault kill|hang|raise makes TP rank 1 of replica 0 SIGKILL or SIGSTOP itself, or raise, when
engine step --fault-at arrives (a step of the serial loop, a launch of the overlapped one); the
job must end with an error, never hang.
"""
import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass

from dynspec.runtime.engines.reference.tp import load_tp_engine
from dynspec.runtime.engines.reference.tp_stats import StepRecorder
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.loop import Loop
from dynspec.runtime.serving.overlap import cache_slack
from dynspec.runtime.serving.plan_channel import LeaderEngine
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.tp.tp_groups import TpFault
from dynspec.runtime.tp.tp_layout import log
from dynspec.runtime.tp.tp_lifecycle import exit_status, run_replica


class FaultAt:
    """Worker-side engine wrapper that kills, stops or raises in this process at engine step `at`,
    counting the serial loop's steps and the overlapped loop's launches alike."""

    def __init__(self, engine, kind: str, at: int):
        self._engine, self.kind, self.at, self.n = engine, kind, at, 0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def _count(self, what: str) -> None:
        if self.n == self.at:
            log(f"fault: {self.kind} at engine step {self.n} ({what})", all_ranks=True)
            if self.kind == "raise":
                raise RuntimeError(f"injected fault at engine step {self.n}")
            os.kill(os.getpid(), signal.SIGKILL if self.kind == "kill" else signal.SIGSTOP)
        self.n += 1

    def step(self, *args, **kwargs):
        self._count("step")
        return self._engine.step(*args, **kwargs)

    def launch(self, *args, **kwargs):
        self._count("launch")
        return self._engine.launch(*args, **kwargs)


def loop_of(a) -> Loop:
    """--overlap -> Loop.OVERLAPPED, else Loop.SERIAL."""
    return Loop.OVERLAPPED if a.overlap else Loop.SERIAL


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", required=True, help='JSON list of {"ids": [...], "max_new": n, "at": iteration}')
    ap.add_argument("--schedule", required=True)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--device", default="cpu", help="cuda: one GPU per rank (tests/test_gpu_tp.py)")
    ap.add_argument("--graphs", action="store_true",
                    help="capture every reachable decode graph and the whole-forward mixed graphs first (CUDA)")
    ap.add_argument("--allreduce", default="auto")
    ap.add_argument("--draft-sync", choices=("lazy", "warm", "off"), default="warm")
    ap.add_argument("--max-num-tokens", type=int, default=8192)
    ap.add_argument("--sync-cap", type=int, default=256, help="the engine's lazy sync store, tokens a slot")
    ap.add_argument("--whole-mixed", action="store_true",
                    help="mixed iterations through mixed_graphs.py's functions (uncaptured on CPU)")
    ap.add_argument("--overlap", action="store_true", help="the executor's overlapped loop (Executor(loop=Loop.OVERLAPPED))")
    ap.add_argument("--per-row", type=int, metavar="SEED",
                    help="each row's K drawn afresh every iteration (FlipRows, seeded), up to the schedule's max K")
    ap.add_argument("--out")
    ap.add_argument("--fault", choices=("kill", "hang", "raise"))
    ap.add_argument("--fault-at", type=int, default=3)
    ap.add_argument("--idle", type=float, default=0.0, help="leader sleeps this long before the first job")
    a = ap.parse_args()
    sched = DraftSchedule.parse(a.schedule)
    jobs = [Job(tuple(j["ids"]), int(j["max_new"]), int(j.get("at", 0))) for j in json.load(open(a.prompts))]

    captured = [0]            # graphs this rank captured (capture's count)
    wholes = [0]              # mixed forwards this rank ran through mixed_graphs.py
    from dynspec.runtime.engines.reference.mixed_graphs import WholeMixed

    real_whole = WholeMixed.run
    WholeMixed.run = lambda self, *args: wholes.__setitem__(0, wholes[0] + 1) or real_whole(self, *args)

    def load(ctx):
        engine = load_tp_engine(a.target, a.draft, ctx, dtype=a.dtype, max_batch_size=a.concurrency,
                                max_seq_len=max(len(j.ids) + j.max_new for j in jobs)
                                + cache_slack(sched.max_draft_len, loop_of(a)) + 1,
                                max_draft_len=max(sched.max_draft_len, 1), max_num_tokens=a.max_num_tokens,
                                draft_sync_cap=a.sync_cap)
        if a.graphs:                                  # every rank captures the same keys in the same order
            from dynspec.runtime.engines.reference.graph_keys import reachable_graphs
            from dynspec.runtime.generate.session import capture

            captured[0] = capture(engine, reachable_graphs([sched], a.concurrency, a.draft_sync,
                                                           engine.max_num_tokens))
        if a.whole_mixed:
            engine.capture_whole_graphs()
        rec = StepRecorder(engine)
        return FaultAt(rec, a.fault, a.fault_at) if a.fault and ctx.layout.rank == 1 else rec

    ctx, engine, result = run_replica(a.tp, load, lambda leader, ctx: lead(leader, sched, jobs, a),
                                      device=a.device, allreduce=a.allreduce)
    rec = engine._engine if isinstance(engine, FaultAt) else engine
    steps = [[s.iteration, s.batch_size, s.k, [list(g) for g in s.graphs]] for s in rec.steps]
    everyone = ctx.comm.gather(steps, root=0) if ctx.comm is not None else [steps]
    all_wholes = ctx.comm.gather(wholes[0], root=0) if ctx.comm is not None else [wholes[0]]
    if ctx.layout.rank == 0 and a.out:
        with open(a.out, "w") as f:
            json.dump({**result, "steps": {str(r): s for r, s in enumerate(everyone)},
                       "allreduce": ctx.reducer.mode if ctx.reducer is not None else None,
                       "eager_fallbacks": rec.eager_fallbacks, "graphs": captured[0],
                       "whole_runs": all_wholes}, f)


@dataclass(frozen=True)
class Job:
    ids: tuple[int, ...]
    max_new: int
    at: int            # submitted before this iteration: the batch can grow back above a threshold


def drive(ex: Executor, jobs: list[Job]) -> list:
    """Submit each job before iteration `at`, step until all are done; results in job order.
    at=0 x3, at=3 x8 -> b=3 (K>0), then b=10 (K=0), then b shrinks (K>0 again)."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].at)
    handles: list = [None] * len(jobs)
    it = 0
    while order or not all(h.done for h in handles if h is not None):
        while order and jobs[order[0]].at <= it:
            i = order.pop(0)
            handles[i] = ex.submit(jobs[i].ids, jobs[i].max_new)
        ex.step()
        it += 1
    return [h.result() for h in handles]


class FlipRows:
    """A policy with the row_rates hook (runtime/policy/__init__.py Policy) drawing each row's K afresh every iteration."""
    drafts, chooses_keep_warm = True, False

    def __init__(self, max_draft_len: int, seed: int):
        import random

        self.max_draft_len, self.rng = max_draft_len, random.Random(seed)

    def choices(self, batch_size: int) -> tuple[int, ...]:
        return tuple(range(self.max_draft_len + 1))

    def row_rates(self, table, slots, pool, keys, truth):
        return table.rates(slots, pool, 4.0)

    def decide(self, x):
        from dynspec.runtime.policy.step_decision import StepDecision

        return StepDecision(tuple(self.rng.randint(0, x.max_k) for _ in range(x.batch_size)), True, policy="per-request")


def lead(engine: LeaderEngine, sched: DraftSchedule, jobs, a) -> dict:
    policy = sched if a.per_row is None else FlipRows(sched.max_draft_len, a.per_row)
    ex = Executor(engine, policy, draft_sync=a.draft_sync, loop=loop_of(a))
    if a.fault:
        ex.start()                                   # the serving loop, as Triton runs it
        handles = [ex.submit(j.ids, j.max_new) for j in jobs[: a.concurrency]]
        t0 = time.monotonic()
        while not all(h.done for h in handles):
            time.sleep(0.05)
        reasons = [h.result().finish_reason for h in handles]
        log(f"{len(handles)} open requests ended after {time.monotonic() - t0:.1f} s: {reasons}")
        raise TpFault(f"leader: {engine.fault}") if engine.fault else RuntimeError("no fault seen")
    time.sleep(a.idle)                               # workers wait on the channel: heartbeats only
    results = drive(ex, jobs)
    ex.run_until_idle()                              # overlapped: the last launched iteration's result
    return {"outputs": [list(r.output_ids) for r in results], "finish": [r.finish_reason for r in results],
            "overlapped": sum(s.overlapped for s in ex.stats), "iterations": len(ex.stats),
            "per_row_steps": sum(1 for s in ex.stats if s.drafted not in (0, s.batch_size * s.k)),
            "catch_up": [s.catch_up_tokens for s in ex.stats], "stale_draft": sum(s.stale_draft_tokens for s in ex.stats)}


if __name__ == "__main__":
    sys.exit(exit_status(main()))
