"""Inflight-batching executor: one K decision per iteration, before anything is shaped.

Each iteration, under the token budget max_num_tokens (engine.max_num_tokens):
    1. retire finished / cancelled requests (their cache blocks go back to the free list)
    2. b = decode rows (requests whose prompt is all in the cache)
    3. K = policy(b), capped so that b x (K+1) fits the budget (plan.cap_k); an AdaptivePolicy
       decides from b (and its bucket), the rows' mean context, the acceptance estimate, the
       served/profiled step-time ratios, the previous K and the iterations since the last
       speculation (runtime/adaptive.py), within that cap; it also says whether a K=0 step keeps
       the draft warm
    4. prompt chunks take what is left: partly prefilled requests first, then waiting ones,
       each admitted only if its blocks can be reserved and b + prefilling stays within
       min(max_batch_size, max_num_tokens) (every decode row must fit at K=0)
    5. plan = make_plan(K, rows..., chunks)     a StepPlan value
    6. result = engine.step(plan)               one target forward: decode rows + chunks
    7. fold result (a StepResult value) into the requests; a request whose last chunk ran
       gets its first token and joins the decode rows next iteration; the accepted counts update
       the acceptance estimate (runtime/acceptance_estimate.py), kept under every policy; a pure
       decode step's time updates the adaptive policy's cost calibration (runtime/cost_calibration.py)

Deferred update (Loop.SERIAL on an engine whose launch returns before the device has run the
step, engine.async_launch: the reference engine on CUDA): step 6 is engine.launch, then the
update of step 7 for the previous iteration, then engine.result, so that update runs while the
device runs the step. Iteration i+1's K then reads the estimate and
calibration through i-1, as the overlapped loop's does; a retirement applies the pending
update first (the estimate forgets the retired rows' share of it too).

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

import itertools
import math
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.acceptance import AcceptanceModel, Greedy
from dynspec.runtime.acceptance_estimate import AcceptanceEstimate
from dynspec.runtime.adaptive import AdaptivePolicy, Decision, PolicyInputs
from dynspec.runtime.gc_heap import pause_seconds
from dynspec.runtime.loop import Loop
from dynspec.runtime.overlap import cache_slack, row_inputs
from dynspec.runtime.per_request import RowDecision, RowInputs, RowPolicy
from dynspec.runtime.row_table import RowTable
from dynspec.runtime.plan import PromptChunk, StepPlan, StepResult, bucket_for, cap_k, chunk_sizes, make_plan
from dynspec.runtime.policy import Policy, speculates


class Engine(Protocol):
    max_batch_size: int
    max_seq_len: int
    max_draft_len: int          # largest K the engine was set up for
    max_num_tokens: int         # tokens per iteration: decode rows x (K+1) + prompt chunks
    max_reservation: int        # the most tokens one request's cache can ever hold (pool and table)
    vocab_size: int             # prompt ids must lie in 0..vocab_size-1
    buckets: tuple[int, ...]

    def reserve(self, tokens: int, key: int = 0) -> int | None: ...   # a cache slot for positions 0..tokens-1, or None;
                                                                      # key: the request's id (Bernoulli draws)
    def release(self, slot: int) -> None: ...
    def step(self, plan: StepPlan, acceptance: AcceptanceModel) -> StepResult: ...    # = result(launch(plan))
    def launch(self, plan: StepPlan, acceptance: AcceptanceModel) -> object: ...      # queue the step -> a handle
    def result(self, handle: object) -> StepResult: ...                               # wait for that step's result
    # optional: async_launch (bool, default False): launch returns before the device has run the step


@dataclass(frozen=True)
class IterationStats:
    iteration: int
    batch_size: int
    k: int
    drafted: int            # sum of the rows' K_i (b * K at one K)
    accepted: int           # accepted draft tokens, summed over rows
    emitted: int            # tokens appended to requests (after truncation at max/stop)
    seconds: float          # engine step wall time (includes the device sync)
    host_seconds: float     # policy lookup + planning
    decode_rows: int = 0    # = batch_size: rows decoding this iteration
    prefill_tokens: int = 0  # prompt tokens riding in the same forward
    end_s: float | None = None   # the executor's clock when the step's results were in
    # what chose K (runtime/adaptive.py): the estimate is kept under every policy
    policy: str = "schedule"     # "schedule" | "adaptive" | "per-request"
    context: float = 0.0         # mean KV length of the decode rows
    acceptance: tuple[float, ...] = ()   # a_1.. the estimate before this step
    predicted_gain: float | None = None  # adaptive: predicted speedup of K over plain decode
    probe: bool = False          # adaptive: a K=1 step taken to measure acceptance
    policy_seconds: float = 0.0  # the K decision (inside host_seconds) + the estimate / calibration update run in this iteration
    policy_exposed_seconds: float = 0.0   # the part of policy_seconds with no step of this executor running on an
                                          # asynchronous device (what the device may wait for)
    oldest_key: int | None = None   # smallest request id among the decode rows
    keep_warm: bool = False      # the step's plan kept the draft warm (K=0)
    cost_scale: tuple[float, ...] = ()   # adaptive: the served/profiled step-time ratios the decision used
    # where the engine reports them (StepResult.device_s / idle_s; the reference engine does)
    device_seconds: float | None = None  # the step's device time, first enqueued work to its result copy
    gpu_idle_s: float | None = None      # device idle before the step: the previous step's end to its start
    fold_seconds: float = 0.0    # host time folding the result into the requests and the estimate
    overlapped: bool = False     # run by the overlapped loop (seconds = device_seconds where known)
    gc_seconds: float = 0.0      # cycle collections in this process since the previous stats (or the executor began)
                                 # (runtime/gc_heap.py; a pause there is a gap the device may idle in)


@dataclass(frozen=True)
class RequestResult:
    request_id: int
    prompt_len: int
    output_ids: tuple[int, ...]
    finish_reason: str       # "length" | "stop" | "cancelled"
    submit_s: float
    first_token_s: float | None
    finish_s: float
    accepted_drafts: int = 0     # draft tokens of this request the target accepted
    drafted: int = 0             # draft tokens verified for it (sum of its K_i)
    decode_steps: int = 0        # iterations it ran as a decode row

    @property
    def mean_k(self) -> float:
        """Its mean draft length per decode iteration."""
        return self.drafted / self.decode_steps if self.decode_steps else 0.0

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted, None before it drafted."""
        return self.accepted_drafts / self.drafted if self.drafted else None


_DONE = object()


def _policy_name(decision) -> str:
    """What chose K: "per-request" (a RowDecision), "adaptive" (a Decision) or "schedule" (none)."""
    return "per-request" if isinstance(decision, RowDecision) else "adaptive" if decision else "schedule"


def _no_launch(plan: StepPlan) -> None:
    """Loop.SERIAL's start of a planned step: none (step() runs it whole) -> no handle."""
    return None


def _no_advance(launched: "_Launched", result: StepResult) -> None:
    """Loop.OVERLAPPED's fold moves no host state: the launch did (Executor._planned)."""


def _device_seconds(launched: "_Launched", result: StepResult) -> float:
    """An overlapped step's time: its device time where the engine reports it, else the launch's
    wall time (the CPU runs the step inside the launch)."""
    return result.device_s if result.device_s is not None else launched.launch_s


@dataclass
class _Request:
    id: int
    prompt: tuple[int, ...]
    max_new: int
    stop_ids: frozenset[int]
    submit_s: float
    out: list[int] = field(default_factory=list)
    first_token_s: float | None = None
    finish_reason: str | None = None     # set last: once it is set, out and finish_s are final
    finish_s: float | None = None
    cancelled: bool = False
    draft_warm: bool = True
    slot: int | None = None          # cache slot while admitted
    prefilled: int = 0               # prompt tokens already in the cache
    accepted: int = 0                # its accepted drafts, drafted tokens, decode iterations (RequestResult)
    drafted: int = 0
    decode_steps: int = 0
    idle: int = 0                    # iterations since it last drafted (row policies' probes)
    chunks: "queue.SimpleQueue" = field(default_factory=queue.SimpleQueue)   # C-implemented: one put per row per step

    @property
    def length(self) -> int:
        """Tokens the target has in its cache = position of the pending (last) token."""
        return len(self.prompt) + len(self.out) - 1


@dataclass(frozen=True)
class _Launched:
    """An iteration planned (and, overlapped, launched), its result not yet folded in."""
    plan: StepPlan
    rows: tuple["_Request", ...]         # [b] the plan's decode rows, in plan order
    chunked: tuple["_Request", ...]      # [chunks] the request of each prompt chunk
    handle: object                       # engine.launch's handle (Loop.OVERLAPPED), else None
    decision: Decision | None
    context: float                       # mean KV length the policy read
    rates: tuple[float, ...]             # the acceptance estimate the policy read
    scale: tuple[float, ...]             # the cost scales the policy read
    t0: float                            # planning began
    t1: float                            # the launch began
    t_policy: float                      # the K decision's share of planning
    t_policy_exposed: float              # ... of it, with no step in flight on an asynchronous device
    launch_s: float                      # time inside engine.launch (Loop.OVERLAPPED; ~0 serial: no launch)

    def requests(self) -> list["_Request"]:
        return list(self.rows) + list(self.chunked)


class RequestHandle:
    """Returned by Executor.submit: stream tokens, wait, or cancel."""

    def __init__(self, req: _Request, executor: "Executor"):
        self._req, self._ex = req, executor

    @property
    def id(self) -> int:
        return self._req.id

    @property
    def done(self) -> bool:
        return self._req.finish_reason is not None

    def tokens(self) -> list[int]:
        return list(self._req.out)

    def cancel(self) -> None:
        self._ex._cancel(self._req)

    def stream(self, timeout: float | None = None) -> Iterator[list[int]]:
        """Yield lists of new tokens as iterations produce them; ends when the request does.
        Needs the executor running in its background thread (start()) or driven by another thread."""
        while True:
            chunk = self._req.chunks.get(timeout=timeout)
            if chunk is _DONE:
                return
            yield chunk

    def result(self) -> RequestResult:
        r = self._req
        if r.finish_reason is None:
            raise RuntimeError(f"request {r.id} has not finished")
        return RequestResult(r.id, len(r.prompt), tuple(r.out), r.finish_reason, r.submit_s, r.first_token_s,
                             r.finish_s, r.accepted, r.drafted, r.decode_steps)


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
        # Newest IterationStats kept for `stats`/`stats_since` (None: all). One costs ~285 B, so
        # 65536 is ~19 MB; the old 1,000,000 (~285 MB) grew a served process for days before it
        # capped, which the Triton soak read as a leak. Pollers read every few ms and the sweeps
        # record steps through on_step, so neither needs more; a one-shot run that summarizes
        # every iteration of a long job passes None.
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
        self._inflight: _Launched | None = None    # overlapped: the iteration launched, result not read
        self._async = bool(getattr(engine, "async_launch", False))   # launch returns before the device is done
        # the loop, once (module docstring): serial on an asynchronous engine applies the estimate /
        # calibration update of the last step after the next launch ("Deferred update")
        self._defer = loop is Loop.SERIAL and self._async
        # step(): one iteration; _begin(plan): what starts a planned step (overlapped: its launch;
        # serial: nothing, the step runs whole in step()); _advance(launched, result): the host
        # state a fold moves on (serial; the overlapped loop moves it at the launch: _planned)
        if self._overlapped:
            self._step, self._begin, self._advance = self._step_overlapped, self._launch_plan, _no_advance
        else:
            self._step = self._step_deferred if self._defer else self._step_serial
            self._begin, self._advance = _no_launch, self._advance_folded
        self._pending: tuple | None = None         # (k, accepted, row_k or None, calibration slot or None, measured ms, predicted ms)
        self._clock = clock
        self._ids = itertools.count()
        self._waiting: deque[_Request] = deque()
        self._rows: list[_Request] = []            # decode rows, in admission order
        self._prefilling: list[_Request] = []      # admitted (slot reserved), prompt partly in the cache
        self._stats: deque[IterationStats] = deque(maxlen=stats_limit)   # newest iterations
        self._stats_lock = threading.Lock()       # pollers read while the loop thread appends
        self._gc_mark = pause_seconds()            # collector seconds at the last stats
        self._iterations = 0
        # the acceptance estimate (a schedule's made at the first step: the engine is not read before)
        self._estimate = policy.initial_estimate() if isinstance(policy, AdaptivePolicy) else None
        self._calibration = policy.initial_calibration() if isinstance(policy, AdaptivePolicy) else None
        self._prev_k = 0                           # K of the last iteration with decode rows
        self._since_spec = 0                       # iterations with rows since the last one at K > 0
        self._probes = 0                           # probes since the last speculative step that was not one
        # each request's own acceptance counts by slot (a row policy's inputs: runtime/row_table.py)
        self._row_table = RowTable(engine.max_batch_size + 1, max(engine.max_draft_len, 1))
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._error: BaseException | None = None
        self.step_errors = 0                       # iterations whose engine call raised (loop thread)
        self.last_step_error: Exception | None = None

    # ---- client side ------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int] = ()) -> RequestHandle:
        prompt = tuple(int(t) for t in prompt_ids)
        if not prompt:
            raise DynspecError("prompt is empty")
        vocab = self.engine.vocab_size
        bad = next((i for i, t in enumerate(prompt) if not 0 <= t < vocab), None)
        if bad is not None:
            raise DynspecError(f"prompt token id {prompt[bad]} at index {bad} is outside the vocabulary 0..{vocab - 1}")
        if max_new_tokens < 1:
            raise DynspecError(f"max_new_tokens={max_new_tokens} must be at least 1")
        # room for the prompt, the new tokens, and the verify windows past the last one (overlap.py)
        slack = cache_slack(self.engine.max_draft_len, self.loop)
        need = len(prompt) + max_new_tokens + slack
        if need > self.engine.max_seq_len:
            raise DynspecError(
                f"prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} (+{slack}"
                f" verify slack) = {need} exceeds the cache length max_seq_len={self.engine.max_seq_len}"
            )
        if need > self.engine.max_reservation:       # it would wait for blocks forever, and block the queue
            raise DynspecError(
                f"prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} (+{slack}"
                f" verify slack) = {need} exceeds the {self.engine.max_reservation} tokens the KV cache pool can"
                f" hold for one request"
            )
        req = _Request(next(self._ids), prompt, max_new_tokens, frozenset(int(s) for s in stop_ids), self._clock())
        with self._lock:
            if self._stop:
                raise DynspecError("executor is stopped; it takes no new requests")
            if self._error is not None:
                raise RuntimeError("executor loop has failed") from self._error
            self._waiting.append(req)
            self._lock.notify_all()
        return RequestHandle(req, self)

    def _cancel(self, req: _Request) -> None:
        with self._lock:
            req.cancelled = True
            self._lock.notify_all()

    @property
    def stats(self) -> tuple[IterationStats, ...]:
        with self._stats_lock:
            return tuple(self._stats)

    def stats_since(self, iteration: int) -> tuple[IterationStats, ...]:
        """Iterations numbered >= `iteration` still held (cheap for pollers: scans from the end)."""
        out = []
        with self._stats_lock:
            for st in reversed(self._stats):
                if st.iteration < iteration:
                    break
                out.append(st)
        return tuple(reversed(out))

    @property
    def active(self) -> int:
        """Admitted requests: decode rows and those still prefilling."""
        return len(self._rows) + len(self._prefilling)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

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
            update_s = self._apply_pending()
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
            self._fail(launched.requests())
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
                self._fail(prev.requests())
            raise
        if prev is None:
            return None
        try:
            result = self.engine.result(prev.handle)
        except BaseException:
            nxt, self._inflight = self._inflight, None
            self._fail(prev.requests() + (nxt.requests() if nxt is not None else []))
            raise
        st = self._fold(prev, result, self._clock(), _device_seconds(prev, result),
                        hidden=self._async and self._inflight is not None)
        self._retire()
        return st

    def _launch_plan(self, plan: StepPlan) -> object:
        """Loop.OVERLAPPED's start of a planned step: engine.launch -> its handle."""
        return self.engine.launch(plan, self.acceptance)

    def _plan(self, prev: "_Launched | None") -> "_Launched | None":
        """Plan the next iteration and start it (_begin: engine.launch in the overlapped loop, prev
        the one in flight, whose rows continue on the device; nothing in the serial loop, whose
        step() runs it). None when there is nothing to run. A failure ends this iteration's requests."""
        if self._estimate is None:
            self._estimate = AcceptanceEstimate(positions=max(self.engine.max_draft_len, 1))
        t0 = self._clock()
        rows = list(self._rows)
        b = len(rows)
        chunked: list[_Request] | None = None
        try:                            # a failure anywhere below ends this iteration's requests
            rin = self._row_inputs(rows, prev)            # planning's, shared with make_plan
            tp0 = self._clock()
            rates = self._estimate.rates() if b else ()
            if isinstance(self.policy, RowPolicy):
                k, decision, context, scale = self._decide_rows(rows, rin.context, rates)
            else:
                k, decision, context, scale = self._decide(rin.context, rates)
            t_policy = self._clock() - tp0
            hidden = self._async and prev is not None      # overlapped: i is running meanwhile
            chunks, chunked = self._chunks(self.engine.max_num_tokens - b * (k + 1))
            if not rows and not chunks:
                return None
            plan = make_plan(
                k,
                positions=rin.positions,
                pending=rin.pending,
                stale=[not r.draft_warm for r in rows],
                keep_warm=decision.keep_warm if decision else self.keep_warm,
                buckets=self.engine.buckets,
                slots=[r.slot for r in rows],
                chunks=chunks,
                from_device=rin.from_device,
                carry=self._overlapped,
                draft=self.draft,
                row_k=decision.ks if isinstance(decision, RowDecision) else None,
            )
            t1 = self._clock()
            handle = self._begin(plan)
        except BaseException:
            self._fail(rows + (list(self._prefilling) if chunked is None else chunked))   # None: admission failed
            raise
        return _Launched(plan, tuple(rows), tuple(chunked), handle, decision, context, rates, scale,
                         t0, t1, t_policy, 0.0 if hidden else t_policy, self._clock() - t1)

    def _row_inputs(self, rows: Sequence[_Request], prev: "_Launched | None"):
        """Each decode row's plan inputs (runtime/overlap.py): exact when nothing is in flight."""
        if prev is None:
            return row_inputs([r.length for r in rows], [r.out[-1] if r.out else None for r in rows], None)
        ran = {id(r) for r in prev.rows}
        return row_inputs([r.length for r in rows], [None] * len(rows),
                          [prev.plan.k if id(r) in ran else 0 for r in rows])

    def _planned(self, launched: "_Launched") -> None:
        """Overlapped: the host state the next plan needs, from the plan just launched: prompt
        progress, requests whose last chunk ran (decode rows from the next iteration on), the
        draft heads (warm after K > 0), the previous K. The tokens come with the result."""
        plan = launched.plan
        with self._lock:
            for req in launched.rows:
                req.draft_warm = plan.k > 0
            self._advance_prompts(launched.chunked, plan.chunks)
        if plan.batch_size:
            self._count_k(plan.k, launched.decision)

    def _count_k(self, k: int, decision: "Decision | None") -> None:
        """The policy's memory of an iteration with decode rows run at K (serial: when it is folded;
        overlapped: when it is launched, so the next plan already knows it): the previous K, the
        iterations since the last at K > 0, the probes since the last speculative step not one."""
        self._prev_k, self._since_spec = k, (0 if k else self._since_spec + 1)
        if decision is not None and decision.probe:
            self._probes += 1
        elif k:
            self._probes = 0

    def _advance_prompts(self, chunked: Sequence[_Request], chunks: Sequence[PromptChunk]) -> None:
        """Prompt progress of the chunks that ran; a request whose last chunk ran becomes a decode
        row with a warm draft head (called with self._lock held)."""
        for req, chunk in zip(chunked, chunks):
            req.prefilled += len(chunk.tokens)
            if chunk.last:
                self._prefilling.remove(req)
                self._rows.append(req)
                req.draft_warm = True

    def _advance_folded(self, launched: "_Launched", result: StepResult) -> None:
        """Serial (in _fold, self._lock held): the host state the overlapped loop moves at the
        launch (_planned), from the result: draft heads, prompt progress, the previous K."""
        for req in launched.rows:
            req.draft_warm = result.draft_warm
        self._advance_prompts(launched.chunked, launched.plan.chunks)
        if launched.plan.batch_size:
            self._count_k(launched.plan.k, launched.decision)

    def _fold(self, launched: "_Launched", result: StepResult, t2: float, seconds: float,
              update_s: float = 0.0, update_exposed_s: float = 0.0, hidden: bool = False) -> IterationStats:
        """Fold a step's result into its requests, the estimate and the calibration (deferred:
        into self._pending; update_s, update_exposed_s: the previous one's, run during this step)
        -> its stats. seconds: the step's time (serial: t2 - t1, its wall time; overlapped: its
        device time). hidden: a step of this executor runs on an asynchronous device meanwhile,
        so the update applied here is not exposed."""
        plan, rows = launched.plan, launched.rows
        b, k = plan.batch_size, plan.k
        emitted = 0
        with self._lock:                # cancel() holds it too: no token lands after cancel() returns
            self._advance(launched, result)
            for req, toks in zip(rows, result.emitted):
                emitted += self._append(req, toks, t2)
            for req, chunk, first in zip(launched.chunked, plan.chunks, result.first_tokens):
                if chunk.last:
                    emitted += self._append(req, (first,), t2)
        decision = launched.decision
        if b:
            self._row_table.update(plan.slots, plan.row_k, result.accepted)
            for req, ki, a in zip(rows, plan.row_k, result.accepted):
                req.accepted += a
                req.drafted += ki
                req.decode_steps += 1
                req.idle = 0 if ki else req.idle + 1
            slot = None
            if (decision and decision.predicted_ms and not plan.chunks and not plan.per_row
                    and self._calibration is not None):
                slot = self._calibration.slot(k, plan.keep_warm, True in plan.stale)
            self._pending = (k, result.accepted, plan.row_k if plan.per_row else None, slot, seconds * 1e3,
                             decision.predicted_ms if decision else None)
            if not self._defer:
                t = self._apply_pending()
                update_s += t
                update_exposed_s += 0.0 if hidden else t
        gc_now = pause_seconds()
        gc_s, self._gc_mark = gc_now - self._gc_mark, gc_now
        st = IterationStats(self._iterations, b, k, plan.decode_tokens - b, sum(result.accepted), emitted, seconds,
                            launched.t1 - launched.t0,
                            decode_rows=b, prefill_tokens=plan.prefill_tokens, end_s=t2,
                            policy=_policy_name(decision), context=launched.context,
                            acceptance=launched.rates,
                            predicted_gain=decision.gain if decision else None,
                            probe=bool(decision and decision.probe),
                            policy_seconds=launched.t_policy + update_s,
                            policy_exposed_seconds=launched.t_policy_exposed + update_exposed_s,
                            oldest_key=min(r.id for r in rows) if rows else None, keep_warm=plan.keep_warm,
                            cost_scale=launched.scale, device_seconds=result.device_s, gpu_idle_s=result.idle_s,
                            fold_seconds=self._clock() - t2, overlapped=self._overlapped, gc_seconds=gc_s)
        self._iterations += 1
        with self._stats_lock:
            self._stats.append(st)
        return st

    def _apply_pending(self) -> float:
        """Fold the pending (k, accepted, slot, measured, predicted) into the estimate and the
        calibration -> the seconds it took (0 when nothing was pending)."""
        if self._pending is None:
            return 0.0
        t = self._clock()
        k, accepted, row_k, slot, measured_ms, predicted_ms = self._pending
        self._pending = None
        self._estimate = self._estimate.update(k, accepted, row_k)
        if slot is not None:
            self._calibration = self._calibration.update(slot, measured_ms, predicted_ms)
        return self._clock() - t

    def _decide(self, positions: Sequence[int],
                rates: tuple[float, ...]) -> tuple[int, Decision | None, float, tuple[float, ...]]:
        """(K, the adaptive decision or None, mean context, cost scales used) for decode rows at
        these positions; K within the engine's max_draft_len and the token budget."""
        b = len(positions)
        if not b:
            return 0, None, 0.0, ()
        eng = self.engine
        context = sum(positions) / b
        if isinstance(self.policy, AdaptivePolicy):
            max_k = cap_k(eng.max_draft_len, b, eng.max_num_tokens)
            cal = self._calibration
            scale, plain = (cal.scales(), cal.counts[0]) if cal is not None else ((), math.inf)
            d = self.policy.decide(PolicyInputs(b, context, rates, self._prev_k, self._since_spec, max_k,
                                                bucket_for(b, eng.buckets), scale, self.keep_warm, plain,
                                                self._probes))
            return d.k, d, context, scale
        k = int(self.policy(b))
        if not 0 <= k <= eng.max_draft_len:
            raise DynspecError(f"policy gave K={k} for batch {b}; the engine supports 0..{eng.max_draft_len}")
        return cap_k(k, b, eng.max_num_tokens), None, context, ()

    def _decide_rows(self, rows: Sequence[_Request], positions: Sequence[int],
                     rates: tuple[float, ...]) -> tuple[int, RowDecision | None, float, tuple[float, ...]]:
        """A row policy's (max K_i, its RowDecision, mean context, no cost scales): each row's rates
        are its own counts shrunk toward the pool (row_table.py)."""
        b = len(rows)
        if not b:
            return 0, None, 0.0, ()
        eng = self.engine
        context = sum(positions) / b
        slots = [r.slot for r in rows]
        d = self.policy.decide_rows(RowInputs(
            b, context, rates, self._row_table.rates(slots, rates, self.policy.shrinkage),
            [r.idle for r in rows], cap_k(eng.max_draft_len, b, eng.max_num_tokens), self.keep_warm))
        if len(d.ks) != b or not all(0 <= k <= eng.max_draft_len for k in d.ks):
            raise DynspecError(f"row policy gave K {list(d.ks)} for {b} rows; the engine supports 0..{eng.max_draft_len}")
        return d.k, d, context, ()

    def _chunks(self, left: int) -> tuple[tuple[PromptChunk, ...], list[_Request]]:
        """Prompt chunks for `left` budget tokens: partly prefilled requests first, then new
        ones, admitted while a slot, their blocks and a decode row at K=0 are free."""
        eng = self.engine
        limit = min(eng.max_batch_size, eng.max_num_tokens)
        with self._lock:
            while (left > sum(len(r.prompt) - r.prefilled for r in self._prefilling) and self._waiting
                   and len(self._rows) + len(self._prefilling) < limit):
                req = self._waiting[0]
                try:
                    slot = eng.reserve(len(req.prompt) + req.max_new + cache_slack(eng.max_draft_len, self.loop),
                                       key=req.id)
                except BaseException:             # a failed reserve (e.g. a TP peer gone) ends this request
                    self._waiting.popleft()       # too, or every later step would retry it and fail again
                    self._finish(req, "error", self._clock())
                    raise
                if slot is None:
                    break                         # blocks are short: wait for a retirement
                self._waiting.popleft()
                req.slot = slot
                self._row_table.reset(slot)
                self._prefilling.append(req)
        reqs = list(self._prefilling)
        sizes = chunk_sizes(left, [len(r.prompt) - r.prefilled for r in reqs])
        chunks, chunked = [], []
        for req, n in zip(reqs, sizes):
            if n == 0:
                continue
            s, e = req.prefilled, req.prefilled + n
            chunks.append(PromptChunk(req.slot, s, req.prompt[s:e], req.prompt[e] if e < len(req.prompt) else None))
            chunked.append(req)
        return tuple(chunks), chunked

    def run_until_idle(self) -> None:
        while self._busy():
            self.step()

    def _busy(self) -> bool:
        """Requests to serve, or (overlapped) an iteration whose result is still to be read."""
        return bool(self._waiting or self._rows or self._prefilling or self._inflight is not None)

    def _drain(self) -> None:
        """Overlapped: read and fold the iteration in flight, if any (its requests have ended:
        they keep nothing of it). A failed read is dropped: the requests are already final."""
        launched, self._inflight = self._inflight, None
        if launched is None:
            return
        try:
            result = self.engine.result(launched.handle)
            self._fold(launched, result, self._clock(), _device_seconds(launched, result))
        except Exception:
            pass

    def _fail(self, reqs: Sequence[_Request]) -> None:
        """End `reqs` as "error" (a failed engine call); the next _retire frees their slots."""
        now = self._clock()
        with self._lock:
            for req in reqs:
                self._finish(req, "error", now)

    def _append(self, req: _Request, toks: Sequence[int], now: float) -> int:
        """Append up to max_new tokens, stopping after a stop id. Returns how many were kept.
        Called with self._lock held; a cancelled request keeps nothing more."""
        if req.cancelled:
            self._finish(req, "cancelled", now)
        if req.finish_reason is not None:
            return 0
        kept: list[int] = []
        reason = None
        for t in toks:
            kept.append(int(t))
            if int(t) in req.stop_ids:
                reason = "stop"
                break
            if len(req.out) + len(kept) >= req.max_new:
                reason = "length"
                break
        if kept:
            if req.first_token_s is None:
                req.first_token_s = now
            req.out.extend(kept)
            req.chunks.put(kept)
        if reason is not None:
            self._finish(req, reason, now)
        return len(kept)

    def _finish(self, req: _Request, reason: str, now: float) -> None:
        if req.finish_reason is not None:
            return
        req.finish_s = now
        req.finish_reason = reason
        req.chunks.put(_DONE)

    def _retire(self) -> None:
        """End cancelled waiting requests; release the slots of finished or cancelled ones."""
        now = self._clock()
        with self._lock:
            if any(req.cancelled for req in self._waiting):
                for req in self._waiting:
                    if req.cancelled:
                        self._finish(req, "cancelled", now)
                self._waiting = deque(req for req in self._waiting if not req.cancelled)
            for group in (self._rows, self._prefilling):
                for req in group:
                    if req.cancelled:
                        self._finish(req, "cancelled", now)
                done = [req for req in group if req.finish_reason is not None]
                if done and group is self._rows and self._estimate is not None:   # their share goes too
                    self._apply_pending()
                    self._estimate = self._estimate.forget(1.0 - len(done) / len(group))
                for req in done:
                    group.remove(req)
                    self.engine.release(req.slot)
                    req.slot = None

    # ---- background loop (Triton, streaming clients) ----------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            self._stop = False
        self._thread = threading.Thread(target=self._loop, name="dynspec-executor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still running or waiting end as "cancelled", and submit()
        raises from now on (until start())."""
        with self._lock:
            self._stop = True
            self._lock.notify_all()
            if self._thread is None:            # driven by step(): end what is left here
                for req in self._rows + self._prefilling + list(self._waiting):
                    self._finish(req, "cancelled", self._clock())
                self._waiting.clear()
                self._drain()
                self._retire()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError(f"executor loop did not stop within {timeout} s")
            self._thread = None

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._stop and not self._busy():
                        self._lock.wait()
                    if self._stop:
                        for req in self._rows + self._prefilling + list(self._waiting):
                            self._finish(req, "cancelled", self._clock())
                        self._waiting.clear()
                        self._drain()
                        self._retire()
                        return
                try:
                    self.step()
                except Exception as e:  # step() ended its own requests as "error"; others go on
                    self.step_errors += 1
                    self.last_step_error = e
        except BaseException as e:  # surface to clients instead of hanging them
            self._error = e
            with self._lock:
                for req in self._rows + self._prefilling + list(self._waiting):
                    if req.finish_reason is None:
                        self._finish(req, "error", self._clock())
            raise
