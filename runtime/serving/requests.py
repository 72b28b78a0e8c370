"""The executor's requests: what a client holds (RequestHandle, RequestResult), the executor's
record of each (Request), an iteration in flight (Launched) and its stats (IterationStats)."""
from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.policy.draft_counts import acceptance, mean_k
from dynspec.runtime.serving.plan import StepPlan, StepResult
from dynspec.runtime.policy.step_decision import StepDecision

@dataclass(frozen=True, slots=True)
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
    # what chose K (runtime/policy/adaptive.py): the estimate is kept under every policy
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
    waiting: tuple[int, ...] = ()        # the prompt tokens waiting that the decision read (StepInputs.waiting)
    # where the engine reports them (StepResult.device_s / idle_s; the reference engine does)
    device_seconds: float | None = None  # the step's device time, first enqueued work to its result copy
    gpu_idle_s: float | None = None      # device idle before the step: the previous step's end to its start
    fold_seconds: float = 0.0    # host time folding the result into the requests and the estimate
    overlapped: bool = False     # run by the overlapped loop (seconds = device_seconds where known)
    gc_seconds: float = 0.0      # cycle collections in this process since the previous stats (or the executor began)
                                 # (runtime/serving/gc_heap.py; a pause there is a gap the device may idle in)
    # lazy draft sync (docs/design.md, "Draft sync")
    catch_up_tokens: int = 0     # draft entries the step's catch-up wrote (within max_num_tokens)
    stale_draft_tokens: int = 0  # draft positions dropped past the feature store's cap: their K/V stays stale
    stored_prompt_tokens: int = 0  # chunk tokens whose draft pass was deferred (plan.store_chunks)


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
        return mean_k(self.drafted, self.decode_steps)

    @property
    def acceptance(self) -> float | None:
        return acceptance(self.accepted_drafts, self.drafted)



DONE = object()


def policy_name(decision: StepDecision | None) -> str:
    """What chose K (StepDecision.policy): "schedule", "adaptive" or "per-request"; "schedule" without
    a decision (an iteration of prompt chunks alone)."""
    return decision.policy if decision is not None else "schedule"


@dataclass
class Request:
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
    draft_behind: int = 0            # lazy draft sync: draft positions below its pending one lacking K/V
                                     # (runtime/serving/draft_sync.py)
    slot: int | None = None          # cache slot while admitted
    prefilled: int = 0               # prompt tokens already in the cache
    accepted: int = 0                # its accepted drafts, drafted tokens, decode iterations (RequestResult)
    drafted: int = 0
    decode_steps: int = 0
    idle: int = 0                    # iterations since it last drafted (row policies' probes)
    probes: int = 0                  # its probes since it last drafted other than as a probe (their backoff)
    chunks: "queue.SimpleQueue" = field(default_factory=queue.SimpleQueue)   # C-implemented: one put per row per step

    @property
    def length(self) -> int:
        """Tokens the target has in its cache = position of the pending (last) token."""
        return len(self.prompt) + len(self.out) - 1


@dataclass(frozen=True)
class Launched:
    """An iteration planned (and, by OverlappedLoop, launched), its result not yet folded in."""
    plan: StepPlan
    rows: tuple["Request", ...]         # [b] the plan's decode rows, in plan order
    chunked: tuple["Request", ...]      # [chunks] the request of each prompt chunk
    handle: object                       # engine.launch's handle where the plan launched it (OverlappedLoop), else None
    decision: StepDecision | None
    context: float                       # mean KV length the policy read
    rates: tuple[float, ...]             # the acceptance estimate the policy read
    scale: tuple[float, ...]             # the cost scales the policy read
    t0: float                            # planning began
    t1: float                            # the launch began
    t_policy: float                      # the K decision's share of planning
    t_policy_exposed: float              # ... of it, with no step in flight on an asynchronous device
    launch_s: float                      # time inside engine.launch (OverlappedLoop; ~0 serial: no launch)
    waiting: tuple[int, ...] = ()        # the prompts the policy read (StepInputs.waiting)
    draft_behind: tuple[int, ...] = ()   # [b] lazy draft sync: each row's draft_behind once it ran (else ())
    stale_draft: int = 0                 # draft positions left stale this iteration (the store's cap)

    def requests(self) -> list["Request"]:
        return list(self.rows) + list(self.chunked)


class RequestHandle:
    """Returned by Executor.submit: stream tokens, wait, or cancel."""

    def __init__(self, req: Request, executor: "object"):
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
            if chunk is DONE:
                return
            yield chunk

    def result(self) -> RequestResult:
        r = self._req
        if r.finish_reason is None:
            raise RuntimeError(f"request {r.id} has not finished")
        return RequestResult(r.id, len(r.prompt), tuple(r.out), r.finish_reason, r.submit_s, r.first_token_s,
                             r.finish_s, r.accepted, r.drafted, r.decode_steps)


def finish(req: Request, reason: str, now: float) -> None:
    """End the request (its stream ends too); a request ends once."""
    if req.finish_reason is not None:
        return
    req.finish_s = now
    req.finish_reason = reason
    req.chunks.put(DONE)


def append(req: Request, toks: Sequence[int], now: float) -> int:
    """Append up to max_new tokens, stopping after a stop id. Returns how many were kept.
    Called with the executor's lock held; a cancelled request keeps nothing more."""
    if req.cancelled:
        finish(req, "cancelled", now)
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
        finish(req, reason, now)
    return len(kept)


def emit(launched: Launched, result: StepResult, now: float) -> int:
    """The step's tokens into its requests (append): each decode row's emitted tokens, each last
    chunk's first token -> how many were kept. Called with the executor's lock held."""
    n = 0
    for req, toks in zip(launched.rows, result.emitted):
        n += append(req, toks, now)
    for req, chunk, first in zip(launched.chunked, launched.plan.chunks, result.first_tokens):
        if chunk.last:
            n += append(req, (first,), now)
    return n


def iteration_stats(iteration: int, launched: Launched, result: StepResult, emitted: int, seconds: float,
                    end_s: float, update_s: float, update_exposed_s: float, **kw) -> IterationStats:
    """A folded step's stats; kw: fold_seconds, overlapped, gc_seconds."""
    plan, rows, decision = launched.plan, launched.rows, launched.decision
    b = plan.batch_size
    return IterationStats(iteration, b, plan.k, plan.decode_tokens - b, sum(result.accepted), emitted, seconds,
                          launched.t1 - launched.t0,
                          decode_rows=b, prefill_tokens=plan.prefill_tokens, end_s=end_s,
                          policy=policy_name(decision), context=launched.context,
                          acceptance=launched.rates,
                          predicted_gain=decision.gain if decision else None,
                          probe=bool(decision and decision.probe),
                          policy_seconds=launched.t_policy + update_s,
                          policy_exposed_seconds=launched.t_policy_exposed + update_exposed_s,
                          oldest_key=min(r.id for r in rows) if rows else None, keep_warm=plan.keep_warm,
                          cost_scale=launched.scale, waiting=launched.waiting, device_seconds=result.device_s,
                          gpu_idle_s=result.idle_s, catch_up_tokens=plan.catch_up_tokens,
                          stale_draft_tokens=launched.stale_draft,
                          stored_prompt_tokens=plan.prefill_tokens if plan.store_chunks else 0, **kw)


class StatsLog:
    """The newest IterationStats (at most `limit`; None: all), read by pollers while the loop
    thread appends."""

    def __init__(self, limit: int | None):
        self.entries: deque[IterationStats] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def append(self, st: IterationStats) -> None:
        with self._lock:
            self.entries.append(st)

    def all(self) -> tuple[IterationStats, ...]:
        with self._lock:
            return tuple(self.entries)

    def since(self, iteration: int) -> tuple[IterationStats, ...]:
        """Iterations numbered >= `iteration` still held (cheap for pollers: scans from the end)."""
        out = []
        with self._lock:
            for st in reversed(self.entries):
                if st.iteration < iteration:
                    break
                out.append(st)
        return tuple(reversed(out))


def checked_prompt(engine, prompt_ids: Sequence[int], max_new_tokens: int, slack: int) -> tuple[int, ...]:
    """The prompt as ints, or DynspecError: empty, an id outside the vocabulary, no new tokens, or
    more than the cache can hold for one request (prompt + new tokens + the verify windows past
    the last one: the loop's cache slack, runtime/serving/loop.py)."""
    prompt = tuple(int(t) for t in prompt_ids)
    if not prompt:
        raise DynspecError("prompt is empty")
    vocab = engine.vocab_size
    bad = next((i for i, t in enumerate(prompt) if not 0 <= t < vocab), None)
    if bad is not None:
        raise DynspecError(f"prompt token id {prompt[bad]} at index {bad} is outside the vocabulary 0..{vocab - 1}")
    if max_new_tokens < 1:
        raise DynspecError(f"max_new_tokens={max_new_tokens} must be at least 1")
    need = len(prompt) + max_new_tokens + slack
    if need > engine.max_seq_len:
        raise DynspecError(
            f"prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} (+{slack}"
            f" verify slack) = {need} exceeds the cache length max_seq_len={engine.max_seq_len}"
        )
    if need > engine.max_reservation:       # it would wait for blocks forever, and block the queue
        raise DynspecError(
            f"prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} (+{slack}"
            f" verify slack) = {need} exceeds the {engine.max_reservation} tokens the KV cache pool can"
            f" hold for one request"
        )
    return prompt
