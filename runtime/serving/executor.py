"""Inflight-batching executor: one K decision per iteration, before anything is shaped.

Each iteration, under the token budget max_num_tokens (engine.max_num_tokens):
    1. retire finished / cancelled requests (their cache blocks go back to the free list)
    2. b = decode rows (requests whose prompt is all in the cache)
    3. each row's K_i = policy.decide(StepInputs) (runtime/policy/step_decision.py, planning.py), K their
       max, capped so that b x (K+1) fits the budget (plan.cap_k): a schedule's K at b for every
       row; the adaptive policy's from b, the context, the acceptance estimate and the served step
       times (runtime/policy/adaptive.py), with whether a K=0 step keeps the draft warm; the per-request
       policy's from each row's own acceptance (runtime/policy/per_request.py)
    4. prompt chunks take what is left: partly prefilled requests first, then waiting ones,
       each admitted only if its blocks can be reserved and b + prefilling stays within
       min(max_batch_size, max_num_tokens) (every decode row must fit at K=0)
    5. plan = make_plan(K, rows..., chunks)     a StepPlan value
    6. result = engine.step(plan)               one target forward: decode rows + chunks
    7. fold result (a StepResult value) into the requests (a last chunk's request joins the
       decode rows next iteration); the accepted counts update the acceptance estimate, a pure
       decode step's time the adaptive policy's cost calibration (runtime/serving/planning.py)

Worked example, budget 8, K=2 policy, A decoding, B's 9-token prompt waiting:
    it 1   A: 3 tokens   B: prompt[0:5]
    it 2   A: 3 tokens   B: prompt[5:9], its last chunk -> B's first token
    it 3   A, B: 3 tokens each

The loop is a strategy chosen once, in __init__ (runtime/serving/loop.py): it owns step(), the cache
slack and what it carries; the executor plans (plan: steps 1-5) and folds (advance, fold: step 7).
    Loop.SERIAL       SerialLoop       plan i, engine.step(i), fold i                  (the oracle)
                      DeferredLoop     engine.async_launch: plan i, engine.launch(i), the estimate
                                       update of i-1, engine.result(i), fold i
    Loop.OVERLAPPED   OverlappedLoop   plan and engine.launch i+1, engine.result(i), fold i
Deferred and overlapped, K reads the estimate through i-1. Overlapped (docs/design.md, "The
overlapped loop"): i+1's rows take i's tokens and positions on the device (runtime/serving/overlap.py);
engine.result is the one host sync.
"""
from __future__ import annotations

import functools
import itertools
import time
from typing import Callable, Mapping, Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import AcceptanceModel, Greedy, rate_of
from dynspec.runtime.policy.acceptance_estimate import AcceptanceEstimate
from dynspec.runtime.serving.executor_thread import LoopThread
from dynspec.runtime.serving.gc_heap import pause_seconds
from dynspec.runtime.serving.draft_sync import chunk_catch_up, plan_sync, store_cap
from dynspec.runtime.serving.loop import Loop, LoopStrategy, loop_strategy
from dynspec.runtime.serving.plan import Engine, PromptChunk, StepPlan, StepResult, sync_mode
from dynspec.runtime.serving.planning import KDecider, make_step_plan, plan_row_inputs, prompt_chunks
from dynspec.runtime.policy import Policy, speculates
from dynspec.runtime.serving.request_pool import RequestPool
from dynspec.runtime.serving.requests import (IterationStats, Launched, Request, RequestHandle, RequestResult, StatsLog,
                                      checked_prompt, emit, iteration_stats)

__all__ = ["Engine", "Executor", "IterationStats", "RequestHandle", "RequestResult"]


class Executor:
    def __init__(
        self,
        engine: Engine,
        policy: Policy,
        *,
        draft_sync: str = "lazy",
        keep_warm: bool | None = None,
        acceptance: AcceptanceModel = Greedy(),
        allow_lossy: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        # newest IterationStats kept for `stats`/`stats_since` (None: all); one costs ~400 B, so
        # 65536 is ~26 MB. Pollers read every few ms and the sweeps record steps through on_step,
        # so neither needs more; a one-shot run that summarizes every iteration passes None.
        stats_limit: int | None = 65536,
        # Loop.OVERLAPPED (docs/design.md, "The overlapped loop"): plan and launch iteration i+1
        # before reading iteration i's result (runtime/serving/loop.py)
        loop: Loop = Loop.SERIAL,
        # lazy sync: a K=0 step with decode rows, or one without rows whose rows would not draft,
        # stores its prompt chunks' target features and the draft catches up when the row drafts
        # (runtime/serving/draft_sync.py, "Prompts"); False: the draft runs over every chunk in its step
        store_prompts: bool = True,
    ):
        if not acceptance.lossless and not allow_lossy:
            raise DynspecError(
                f"acceptance model {acceptance} does not reproduce the target's output; only benchmarks may use it"
            )
        # draft_sync (docs/design.md, "Draft sync"): "lazy", "warm" or "off"; keep_warm, where given,
        # is the older flag (True "warm", False "off") that some benchmark drivers still pass
        sync = sync_mode(draft_sync, "draft_sync") if keep_warm is None else sync_mode(bool(keep_warm), "keep_warm")
        # a policy that never drafts runs the target alone: no draft sync, no draft pass over prompts
        self.draft = speculates(policy)
        self.draft_sync = sync if self.draft else "off"
        self.store_prompts = store_prompts and self.draft_sync == "lazy" and store_cap(engine) > 0
        self.engine, self.policy, self.keep_warm, self.acceptance = engine, policy, self.draft_sync == "warm", acceptance
        self._k = KDecider(engine, policy, self.keep_warm,   # the K decision and what it remembers
                           truth=None if acceptance.lossless else functools.partial(rate_of, acceptance),
                           lazy=self.draft_sync == "lazy" and store_cap(engine) > 0)
        self.clock = clock
        self._ids = itertools.count()
        self._pool = RequestPool(clock)            # the requests by state, and the lock
        self._log = StatsLog(stats_limit)
        self._stats = self._log.entries            # newest iterations
        self._gc_mark = pause_seconds()            # collector seconds at the last stats
        self._iterations = 0
        self._thread = LoopThread(self, self._pool, self._busy, self._wind_down)   # start() / stop()
        self.step_errors = 0                       # iterations whose engine call raised (loop thread)
        self.last_step_error: Exception | None = None
        self.strategy: LoopStrategy = loop_strategy(loop, self)   # the loop, once (module docstring)
        self._step = self.strategy.step

    @property
    def loop(self) -> Loop:
        """The loop this executor runs (its strategy's kind)."""
        return self.strategy.kind

    @property
    def _pending(self) -> tuple | None:
        """The estimate / calibration update not yet applied (KDecider.pending)."""
        return self._k.pending

    # ---- client side ------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int] = ()) -> RequestHandle:
        prompt = checked_prompt(self.engine, prompt_ids, max_new_tokens, self.strategy.slack)
        req = Request(next(self._ids), prompt, max_new_tokens, frozenset(int(s) for s in stop_ids), self.clock())
        with self._pool.lock:
            if self._pool.stopped:
                raise DynspecError("executor is stopped; it takes no new requests")
            if self._pool.error is not None:
                raise RuntimeError("executor loop has failed") from self._pool.error
            self._pool.waiting.append(req)
            self._pool.lock.notify_all()
        return RequestHandle(req, self)

    def _cancel(self, req: Request) -> None:
        self._pool.cancel(req)

    @property
    def stats(self) -> tuple[IterationStats, ...]:
        return self._log.all()

    def stats_since(self, iteration: int) -> tuple[IterationStats, ...]:
        """Iterations numbered >= `iteration` still held (cheap for pollers: scans from the end)."""
        return self._log.since(iteration)

    @property
    def active(self) -> int:
        """Admitted requests: decode rows and those still prefilling."""
        return len(self._pool.rows) + len(self._pool.prefilling)

    @property
    def waiting(self) -> int:
        return len(self._pool.waiting)

    # ---- the iteration: the strategy's step(), through plan and fold -------------------
    def step(self) -> IterationStats | None:
        """Run one iteration. Returns None when there was nothing to run. If the engine
        raises, the requests of this iteration end as "error" and the error is re-raised;
        the executor itself stays usable.
        The executor's strategy runs it (runtime/serving/loop.py); OverlappedLoop launches the next
        iteration, then folds the one launched by the previous call: it returns that one's stats,
        None when no iteration was folded (nothing to run, or only the first of a run launched)."""
        return self._step()

    def plan(self, prev: Launched | None, *, carry: bool, launch: Callable[[StepPlan], object] | None = None,
             hidden: bool = False) -> Launched | None:
        """Plan the next iteration (steps 2-5) -> Launched, None when there is nothing to run.
        prev: the iteration in flight, whose rows continue on the device (None: every row exact);
        carry: the plan keeps each row's next token on the device (plan.carry); launch(plan): the
        start of the step where the loop starts it here (its handle; None: no handle); hidden: a
        step of this executor runs on an asynchronous device meanwhile, so the K decision is not
        exposed. A failure anywhere ends this iteration's requests."""
        if self._k.estimate is None:
            self._k.estimate = AcceptanceEstimate(positions=max(self.engine.max_draft_len, 1))
        t0 = self.clock()
        rows = list(self._pool.rows)
        b = len(rows)
        chunked: list[Request] | None = None
        try:                            # a failure anywhere below ends this iteration's requests
            rin = plan_row_inputs(rows, prev)            # planning's, shared with make_plan
            tp0 = self.clock()
            rates = self._k.estimate.rates() if b else ()
            waiting = self._backlog(b)
            k, decision, context, scale = self._k.decide(rows, rin.context, rates, waiting)
            t_policy = self.clock() - tp0
            sync = plan_sync(self.draft_sync, rows, rin.context, decision.ks if decision else (), self.engine)
            k = sync.k
            store = self.store_prompts and b > 0 and k == 0           # the chunks' draft pass deferred
            cap = store_cap(self.engine) if self.draft_sync == "lazy" and not store else None
            chunks, chunked = self._chunks(self.engine.max_num_tokens - b * (k + 1) - sync.tokens, cap)
            # a step without rows stores its chunks as a K=0 step does where the rows they leave would not
            # draft, or where no chunk fits beside its catch-up (runtime/serving/draft_sync.py, "Prompts")
            if not rows and self.store_prompts:
                whole, ended = prompt_chunks(list(self._pool.prefilling), self.engine.max_num_tokens)
                tq = self.clock()
                if whole and (not chunks or not self._drafts_next(whole, ended)):
                    store, cap, chunks, chunked = True, None, whole, ended
                t_policy += self.clock() - tq                 # the policy's answer is policy time too
            if not rows and not chunks:
                return None
            ups, dropped = chunk_catch_up(chunked, [c.start for c in chunks], cap) if cap is not None else ((), 0)
            plan = make_step_plan(k, rows, rin, decision, self.draft_sync, self.engine, chunks, sync,
                                  carry=carry, draft=self.draft, chunk_catch_up=ups, store_chunks=store and bool(chunks))
            t1 = self.clock()
            handle = launch(plan) if launch is not None else None
        except BaseException:
            self._pool.fail(rows + (list(self._pool.prefilling) if chunked is None else chunked))   # None: admission failed
            raise
        return Launched(plan, tuple(rows), tuple(chunked), handle, decision, context, rates, scale,
                        t0, t1, t_policy, 0.0 if hidden else t_policy, self.clock() - t1, waiting,
                        sync.behind, sync.dropped + dropped)

    def _drafts_next(self, chunks: Sequence[PromptChunk], chunked: Sequence[Request]) -> bool:
        """Whether the policy would draft for the decode rows a step without rows leaves if it ran
        these chunks: the requests whose last chunk it runs, at their prompts' lengths, with the
        prompt tokens left after it waiting. A step that ends no prompt leaves no rows to ask
        about: it drafts."""
        ends = [r for r, c in zip(chunked, chunks) if c.last]
        if not ends:
            return True
        waiting = self._backlog(len(ends), {r.id: len(c.tokens) for r, c in zip(chunked, chunks)})
        return self._k.drafts(ends, [len(r.prompt) for r in ends], self._k.estimate.rates(), waiting)

    def _backlog(self, b: int, taken: Mapping[int, int] | None = None) -> tuple[int, ...]:
        """The prompts the K decision of b rows prices (RequestPool.backlog; taken: the tokens a
        step being planned prefills), for a policy that reads them."""
        if not b or not self._k.reads_prompts:
            return ()
        return self._pool.backlog(min(self.engine.max_batch_size, self.engine.max_num_tokens) - b, taken)

    def _chunks(self, left: int, cap: int | None) -> tuple[tuple[PromptChunk, ...], list[Request]]:
        """Prompt chunks for `left` budget tokens: partly prefilled requests first, then new
        ones, admitted while a slot, their blocks (with the loop's cache slack) and a decode row
        at K=0 are free. cap: planning.prompt_chunks' (the prompts' catch-ups under lazy sync)."""
        self._pool.admit(self.engine, left, self.strategy.slack, self._k.new_request)
        return prompt_chunks(list(self._pool.prefilling), left, cap)

    def advance(self, launched: Launched, warm: bool) -> None:
        """The host state the next plan needs from a step (SerialLoop: at its fold; OverlappedLoop:
        at its launch): each row's draft head (warm: the result's draft_warm, or K > 0 at the launch)
        and how far its draft is behind (lazy sync: runtime/serving/draft_sync.py),
        prompt progress (a request whose last chunk ran is a decode row from the next iteration on),
        the previous K. The tokens come with the fold."""
        plan = launched.plan
        with self._pool.lock:
            for req in launched.rows:
                req.draft_warm = warm
            for req, behind in zip(launched.rows, launched.draft_behind):   # lazy draft sync
                req.draft_behind = behind
            self._pool.advance_prompts(launched.chunked, plan.chunks, plan.store_chunks)
        if plan.batch_size:
            self._k.count_k(plan.k, launched.decision)

    def fold(self, launched: Launched, result: StepResult, t2: float, seconds: float, *, overlapped: bool,
             update_s: float = 0.0, apply_update: bool = True, hidden: bool = False) -> IterationStats:
        """Fold a step's result into its requests, the estimate and the calibration (step 7) -> its
        stats. seconds: the step's time (serial: t2 - t1, its wall time; overlapped: its device
        time). update_s: the previous step's update, applied while this one ran (DeferredLoop);
        apply_update False: this one's stays pending (DeferredLoop applies it during the next step).
        hidden: a step of this executor runs on an asynchronous device meanwhile, so the update
        applied here is not exposed."""
        update_exposed_s = 0.0
        with self._pool.lock:                # cancel() holds it too: no token lands after cancel() returns
            if launched.plan.batch_size:
                self._k.count_rows(launched, result)
            emitted = emit(launched, result, t2)
        if launched.plan.batch_size:
            self._k.record(launched, result, seconds)
            if apply_update:
                t = self._k.apply_pending(self.clock)
                update_s += t
                update_exposed_s += 0.0 if hidden else t
        gc_now = pause_seconds()
        gc_s, self._gc_mark = gc_now - self._gc_mark, gc_now
        st = iteration_stats(self._iterations, launched, result, emitted, seconds, t2, update_s, update_exposed_s,
                             fold_seconds=self.clock() - t2, overlapped=overlapped, gc_seconds=gc_s)
        self._iterations += 1
        self._log.append(st)
        return st

    def apply_update(self) -> float:
        """The estimate / calibration update pending, applied now -> its seconds (DeferredLoop)."""
        return self._k.apply_pending(self.clock)

    def fail(self, reqs: Sequence[Request]) -> None:
        """End reqs as "error" (a failed engine call); the next retire frees their slots."""
        self._pool.fail(reqs)

    def retire(self) -> None:
        """End cancelled waiting requests; release the slots of finished or cancelled ones."""
        self._pool.retire(self.engine.release, lambda kept: self._k.rows_leave(kept, self.clock))

    def run_until_idle(self) -> None:
        while self._busy():
            self.step()

    def _busy(self) -> bool:
        """Requests to serve, or (overlapped) an iteration whose result is still to be read."""
        return self._pool.busy() or self.strategy.in_flight

    # ---- background loop (Triton, streaming clients) ----------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still running or waiting end as "cancelled", and submit()
        raises from now on (until start())."""
        self._thread.stop(timeout)

    def _wind_down(self) -> None:
        """Stopped (the lock held): what is left ends as "cancelled", the step in flight is read."""
        self._pool.end_all("cancelled")
        self.strategy.drain()
        self.retire()
