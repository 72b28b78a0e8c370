"""Inflight-batching executor: one K decision per iteration, before anything is shaped.

Each iteration, under the token budget max_num_tokens (engine.max_num_tokens):
    1. retire finished / cancelled requests (their cache blocks go back to the free list)
    2. b = decode rows (requests whose prompt is all in the cache)
    3. each row's K_i = policy.decide(StepInputs) (runtime/step_decision.py, planning.py), K their
       max, capped so that b x (K+1) fits the budget (plan.cap_k): a schedule's K at b for every
       row; the adaptive policy's from b, the context, the acceptance estimate and the served step
       times (runtime/adaptive.py), with whether a K=0 step keeps the draft warm; the per-request
       policy's from each row's own acceptance (runtime/per_request.py)
    4. prompt chunks take what is left: partly prefilled requests first, then waiting ones,
       each admitted only if its blocks can be reserved and b + prefilling stays within
       min(max_batch_size, max_num_tokens) (every decode row must fit at K=0)
    5. plan = make_plan(K, rows..., chunks)     a StepPlan value
    6. result = engine.step(plan)               one target forward: decode rows + chunks
    7. fold result (a StepResult value) into the requests (a last chunk's request joins the
       decode rows next iteration); the accepted counts update the acceptance estimate, a pure
       decode step's time the adaptive policy's cost calibration (runtime/planning.py)

Deferred update (Loop.SERIAL on an engine.async_launch engine, the reference engine on CUDA):
step 6 is engine.launch, then step 7's update of the previous iteration while the device runs,
then engine.result; K then reads the estimate through i-1, as the overlapped loop does.

Worked example, budget 8, K=2 policy, A decoding, B's 9-token prompt waiting:
    it 1   A: 3 tokens   B: prompt[0:5]
    it 2   A: 3 tokens   B: prompt[5:9], its last chunk -> B's first token
    it 3   A, B: 3 tokens each

Overlapped (Loop.OVERLAPPED; docs/design.md, "The overlapped loop"): steps 1-5 of iteration i+1
run, and it is launched (engine.launch), before step 7 of iteration i reads i's result
(engine.result, the one host sync); i+1's rows take i's tokens and positions on the device
(runtime/overlap.py). The serial loop (Loop.SERIAL, the default) is the oracle.

The loop is chosen once, in __init__: step() is bound there to one of
    _step_serial      engine.step                                  Loop.SERIAL, synchronous engine
    _step_deferred    engine.launch, the pending update, result    Loop.SERIAL, engine.async_launch
    _step_overlapped  launch i+1, then result(i)                   Loop.OVERLAPPED
"""
from __future__ import annotations

import functools
import itertools
import time
from typing import Callable, Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.acceptance import AcceptanceModel, Greedy, rate_of
from dynspec.runtime.acceptance_estimate import AcceptanceEstimate
from dynspec.runtime.executor_thread import LoopThread
from dynspec.runtime.gc_heap import pause_seconds
from dynspec.runtime.loop import Loop, device_seconds, no_advance, no_launch
from dynspec.runtime.overlap import cache_slack
from dynspec.runtime.plan import Engine, PromptChunk, StepPlan, StepResult
from dynspec.runtime.planning import KDecider, make_step_plan, plan_row_inputs, prompt_chunks
from dynspec.runtime.policy import Policy, speculates
from dynspec.runtime.request_pool import RequestPool
from dynspec.runtime.requests import (IterationStats, Launched, Request, RequestHandle, RequestResult, StatsLog,
                                      checked_prompt, emit, iteration_stats)

__all__ = ["Engine", "Executor", "IterationStats", "RequestHandle", "RequestResult"]


class Executor:
    def __init__(
        self,
        engine: Engine,
        policy: Policy,
        *,
        keep_warm: bool = True,
        acceptance: AcceptanceModel = Greedy(),
        allow_lossy: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        # newest IterationStats kept for `stats`/`stats_since` (None: all); one costs ~285 B, so
        # 65536 is ~19 MB. Pollers read every few ms and the sweeps record steps through on_step,
        # so neither needs more; a one-shot run that summarizes every iteration passes None.
        stats_limit: int | None = 65536,
        # Loop.OVERLAPPED (docs/design.md, "The overlapped loop"): plan and launch iteration i+1
        # before reading iteration i's result (runtime/loop.py)
        loop: Loop = Loop.SERIAL,
    ):
        if not acceptance.lossless and not allow_lossy:
            raise DynspecError(
                f"acceptance model {acceptance} does not reproduce the target's output; only benchmarks may use it"
            )
        # a policy that never drafts runs the target alone: no keep-warm, no draft pass over prompts
        self.draft = speculates(policy)
        self.engine, self.policy, self.keep_warm, self.acceptance = engine, policy, keep_warm and self.draft, acceptance
        self.loop = loop
        self._overlapped = loop is Loop.OVERLAPPED
        self._inflight: Launched | None = None     # overlapped: the iteration launched, result not read
        self._async = bool(getattr(engine, "async_launch", False))   # launch returns before the device is done
        # the loop, once (module docstring): serial on an asynchronous engine applies the estimate /
        # calibration update of the last step after the next launch ("Deferred update")
        self._defer = loop is Loop.SERIAL and self._async
        # step(): one iteration; _begin(plan): what starts a planned step (overlapped: its launch;
        # serial: nothing, the step runs whole in step()); _advance(launched, result): the host
        # state a fold moves on (serial; the overlapped loop moves it at the launch: _planned)
        if self._overlapped:
            self._step, self._begin, self._advance = self._step_overlapped, self._launch_plan, no_advance
        else:
            self._step = self._step_deferred if self._defer else self._step_serial
            self._begin, self._advance = no_launch, self._advance_folded
        self._k = KDecider(engine, policy, self.keep_warm,   # the K decision and what it remembers
                           truth=None if acceptance.lossless else functools.partial(rate_of, acceptance))
        self._clock = clock
        self._ids = itertools.count()
        self._pool = RequestPool(clock)            # the requests by state, and the lock
        self._log = StatsLog(stats_limit)
        self._stats = self._log.entries            # newest iterations
        self._gc_mark = pause_seconds()            # collector seconds at the last stats
        self._iterations = 0
        self._thread = LoopThread(self, self._pool, self._busy, self._wind_down)   # start() / stop()
        self.step_errors = 0                       # iterations whose engine call raised (loop thread)
        self.last_step_error: Exception | None = None

    @property
    def _pending(self) -> tuple | None:
        """The estimate / calibration update not yet applied (KDecider.pending)."""
        return self._k.pending

    # ---- client side ------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int] = ()) -> RequestHandle:
        prompt = checked_prompt(self.engine, prompt_ids, max_new_tokens, cache_slack(self.engine.max_draft_len,
                                                                                      self.loop))
        req = Request(next(self._ids), prompt, max_new_tokens, frozenset(int(s) for s in stop_ids), self._clock())
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

    # ---- the iteration ----------------------------------------------------------------
    def step(self) -> IterationStats | None:
        """Run one iteration. Returns None when there was nothing to run. If the engine
        raises, the requests of this iteration end as "error" and the error is re-raised;
        the executor itself stays usable.
        Loop.OVERLAPPED: launch the next iteration, then fold the one launched by the previous
        call; returns that one's stats, None when no iteration was folded (nothing to run, or
        only the first of a run launched)."""
        return self._step()

    def _step_serial(self) -> IterationStats | None:
        """Plan, engine.step (launch and result in one call), fold."""
        return self._run_serial(lambda plan: (self.engine.step(plan, self.acceptance), 0.0))

    def _step_deferred(self) -> IterationStats | None:
        """Plan, engine.launch, the previous step's estimate / calibration update while this one
        runs on the device, engine.result, fold (module docstring, "Deferred update")."""
        def run(plan: StepPlan) -> tuple[StepResult, float]:
            handle = self.engine.launch(plan, self.acceptance)
            update_s = self._k.apply_pending(self._clock)
            return self.engine.result(handle), update_s

        return self._run_serial(run)

    def _run_serial(self, run: Callable[[StepPlan], tuple[StepResult, float]]) -> IterationStats | None:
        """One serial iteration; run(plan) -> (its result, seconds of the update applied during it:
        none of them exposed, the engine being asynchronous whenever there are any)."""
        self._retire()
        launched = self._plan(None)
        if launched is None:
            return None
        try:
            result, update_s = run(launched.plan)
        except BaseException:
            self._pool.fail(launched.requests())
            raise
        t2 = self._clock()
        st = self._fold(launched, result, t2, t2 - launched.t1, update_s)
        self._retire()                  # free finished requests' blocks now, not at the next call
        return st

    def _step_overlapped(self) -> IterationStats | None:
        """Plan and launch i+1 while i runs, then read i's result (the one host sync) and fold it.
        Rows of i+1 take i's tokens and positions on the device (runtime/overlap.py)."""
        self._retire()
        prev, self._inflight = self._inflight, None
        try:
            nxt = self._plan(prev)
            if nxt is not None:
                self._planned(nxt)
            self._inflight = nxt
        except BaseException:
            if prev is not None:        # i+1 was to continue from it: its requests end too
                self._pool.fail(prev.requests())
            raise
        if prev is None:
            return None
        try:
            result = self.engine.result(prev.handle)
        except BaseException:
            nxt, self._inflight = self._inflight, None
            self._pool.fail(prev.requests() + (nxt.requests() if nxt is not None else []))
            raise
        st = self._fold(prev, result, self._clock(), device_seconds(prev, result),
                        hidden=self._async and self._inflight is not None)
        self._retire()
        return st

    def _launch_plan(self, plan: StepPlan) -> object:
        """Loop.OVERLAPPED's start of a planned step: engine.launch -> its handle."""
        return self.engine.launch(plan, self.acceptance)

    def _plan(self, prev: Launched | None) -> Launched | None:
        """Plan the next iteration and start it (_begin: engine.launch in the overlapped loop, prev
        the one in flight, whose rows continue on the device; nothing in the serial loop, whose
        step() runs it). None when there is nothing to run. A failure ends this iteration's requests."""
        if self._k.estimate is None:
            self._k.estimate = AcceptanceEstimate(positions=max(self.engine.max_draft_len, 1))
        t0 = self._clock()
        rows = list(self._pool.rows)
        b = len(rows)
        chunked: list[Request] | None = None
        try:                            # a failure anywhere below ends this iteration's requests
            rin = plan_row_inputs(rows, prev)            # planning's, shared with make_plan
            tp0 = self._clock()
            rates = self._k.estimate.rates() if b else ()
            k, decision, context, scale = self._k.decide(rows, rin.context, rates)
            t_policy = self._clock() - tp0
            hidden = self._async and prev is not None      # overlapped: i is running meanwhile
            chunks, chunked = self._chunks(self.engine.max_num_tokens - b * (k + 1))
            if not rows and not chunks:
                return None
            plan = make_step_plan(k, rows, rin, decision, self.keep_warm, self.engine, chunks,
                                  carry=self._overlapped, draft=self.draft)
            t1 = self._clock()
            handle = self._begin(plan)
        except BaseException:
            self._pool.fail(rows + (list(self._pool.prefilling) if chunked is None else chunked))   # None: admission failed
            raise
        return Launched(plan, tuple(rows), tuple(chunked), handle, decision, context, rates, scale,
                        t0, t1, t_policy, 0.0 if hidden else t_policy, self._clock() - t1)

    def _chunks(self, left: int) -> tuple[tuple[PromptChunk, ...], list[Request]]:
        """Prompt chunks for `left` budget tokens: partly prefilled requests first, then new
        ones, admitted while a slot, their blocks and a decode row at K=0 are free."""
        self._pool.admit(self.engine, left, cache_slack(self.engine.max_draft_len, self.loop), self._k.new_request)
        return prompt_chunks(list(self._pool.prefilling), left)

    def _planned(self, launched: Launched) -> None:
        """Overlapped: the host state the next plan needs, from the plan just launched: prompt
        progress, requests whose last chunk ran (decode rows from the next iteration on), the
        draft heads (warm after K > 0), the previous K. The tokens come with the result."""
        plan = launched.plan
        with self._pool.lock:
            for req in launched.rows:
                req.draft_warm = plan.k > 0
            self._pool.advance_prompts(launched.chunked, plan.chunks)
        if plan.batch_size:
            self._k.count_k(plan.k, launched.decision)

    def _advance_folded(self, launched: Launched, result: StepResult) -> None:
        """Serial (in _fold, the pool's lock held): the host state the overlapped loop moves at the
        launch (_planned), from the result: draft heads, prompt progress, the previous K."""
        for req in launched.rows:
            req.draft_warm = result.draft_warm
        self._pool.advance_prompts(launched.chunked, launched.plan.chunks)
        if launched.plan.batch_size:
            self._k.count_k(launched.plan.k, launched.decision)

    def _fold(self, launched: Launched, result: StepResult, t2: float, seconds: float,
              update_s: float = 0.0, update_exposed_s: float = 0.0, hidden: bool = False) -> IterationStats:
        """Fold a step's result into its requests, the estimate and the calibration (deferred:
        into the pending update; update_s, update_exposed_s: the previous one's, run during this
        step) -> its stats. seconds: the step's time (serial: t2 - t1, its wall time; overlapped:
        its device time). hidden: a step of this executor runs on an asynchronous device
        meanwhile, so the update applied here is not exposed."""
        with self._pool.lock:                # cancel() holds it too: no token lands after cancel() returns
            self._advance(launched, result)
            if launched.plan.batch_size:
                self._k.count_rows(launched, result)
            emitted = emit(launched, result, t2)
        if launched.plan.batch_size:
            self._k.record(launched, result, seconds)
            if not self._defer:
                t = self._k.apply_pending(self._clock)
                update_s += t
                update_exposed_s += 0.0 if hidden else t
        gc_now = pause_seconds()
        gc_s, self._gc_mark = gc_now - self._gc_mark, gc_now
        st = iteration_stats(self._iterations, launched, result, emitted, seconds, t2, update_s, update_exposed_s,
                             fold_seconds=self._clock() - t2, overlapped=self._overlapped, gc_seconds=gc_s)
        self._iterations += 1
        self._log.append(st)
        return st

    def run_until_idle(self) -> None:
        while self._busy():
            self.step()

    def _busy(self) -> bool:
        """Requests to serve, or (overlapped) an iteration whose result is still to be read."""
        return self._pool.busy() or self._inflight is not None

    def _drain(self) -> None:
        """Overlapped: read and fold the iteration in flight, if any (its requests have ended:
        they keep nothing of it). A failed read is dropped: the requests are already final."""
        launched, self._inflight = self._inflight, None
        if launched is None:
            return
        try:
            result = self.engine.result(launched.handle)
            self._fold(launched, result, self._clock(), device_seconds(launched, result))
        except Exception:
            pass

    def _retire(self) -> None:
        """End cancelled waiting requests; release the slots of finished or cancelled ones."""
        self._pool.retire(self.engine.release, lambda kept: self._k.rows_leave(kept, self._clock))

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
        self._drain()
        self._retire()
