"""The executor's requests by state, under one lock: waiting, admitted with their prompt partly
in the cache (prefilling), and decode rows; admission reserves a request's cache slot, retirement
releases it."""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Mapping, Sequence

from dynspec.runtime.serving.plan import PromptChunk
from dynspec.runtime.serving.requests import Request, finish


class RequestPool:
    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.waiting: deque[Request] = deque()
        self.rows: list[Request] = []              # decode rows, in admission order
        self.prefilling: list[Request] = []        # admitted (slot reserved), prompt partly in the cache
        self.lock = threading.Condition()
        self.stopped = False                       # submit refuses new requests
        self.error: BaseException | None = None    # the background loop failed (executor_thread.py)

    def busy(self) -> bool:
        return bool(self.waiting or self.rows or self.prefilling)

    def cancel(self, req: Request) -> None:
        with self.lock:
            req.cancelled = True
            self.lock.notify_all()

    def fail(self, reqs: Sequence[Request]) -> None:
        """End `reqs` as "error" (a failed engine call); the next retire frees their slots."""
        now = self.clock()
        with self.lock:
            for req in reqs:
                finish(req, "error", now)

    def end_all(self, reason: str) -> None:
        """End every request not yet ended as `reason`; the waiting ones leave the queue
        (called with the lock held)."""
        for req in self.rows + self.prefilling + list(self.waiting):
            finish(req, reason, self.clock())
        self.waiting.clear()

    def backlog(self, free_rows: int, taken: Mapping[int, int] | None = None) -> tuple[int, ...]:
        """Prompt tokens still to prefill, in the order chunks take the budget: the admitted requests'
        rest, then the first waiting ones that `free_rows` more slots could admit (the policy's
        StepInputs.waiting). Rows (100, 40 of 80 prefilled), queue (30, 50), free_rows 3 -> (100, 40, 30).
        taken: request id -> tokens a step being planned prefills (they count as done; a prompt it
        ends drops out): taken {id of the first: 100} -> (40, 30, 50)."""
        taken = taken or {}
        out = [n for r in self.prefilling if (n := len(r.prompt) - r.prefilled - taken.get(r.id, 0)) > 0]
        with self.lock:
            out += [len(r.prompt) for _, r in zip(range(max(0, free_rows - len(out))), self.waiting)]
        return tuple(out)

    def admit(self, engine, left: int, slack: int, on_admit: Callable[[int], None]) -> None:
        """Admit waiting requests for `left` budget tokens beyond what the prefilling ones still
        need, while a slot, their blocks (prompt + new tokens + slack) and a decode row at K=0 are
        free; on_admit(slot) for each."""
        limit = min(engine.max_batch_size, engine.max_num_tokens)
        with self.lock:
            while (left > sum(len(r.prompt) - r.prefilled for r in self.prefilling) and self.waiting
                   and len(self.rows) + len(self.prefilling) < limit):
                req = self.waiting[0]
                try:
                    slot = engine.reserve(len(req.prompt) + req.max_new + slack, key=req.id)
                except BaseException:             # a failed reserve (e.g. a TP peer gone) ends this request
                    self.waiting.popleft()        # too, or every later step would retry it and fail again
                    finish(req, "error", self.clock())
                    raise
                if slot is None:
                    break                         # blocks are short: wait for a retirement
                self.waiting.popleft()
                req.slot = slot
                on_admit(slot)
                self.prefilling.append(req)

    def advance_prompts(self, chunked: Sequence[Request], chunks: Sequence[PromptChunk], stored: bool = False) -> None:
        """Prompt progress of the chunks that ran; a request whose last chunk ran becomes a decode
        row with a warm draft head (called with the lock held). stored (plan.store_chunks): the
        draft did not run over them, so each request falls behind by its chunk's tokens and a last
        chunk leaves a stale head; otherwise the step caught each request up (draft_sync.chunk_catch_up)."""
        for req, chunk in zip(chunked, chunks):
            req.prefilled += len(chunk.tokens)
            req.draft_behind = req.draft_behind + len(chunk.tokens) if stored else 0
            if chunk.last:
                self.prefilling.remove(req)
                self.rows.append(req)
                req.draft_warm = not stored

    def retire(self, release: Callable[[int], None], rows_leave: Callable[[float], None]) -> None:
        """End cancelled waiting requests; release the slots of finished or cancelled ones.
        rows_leave(kept): decode rows ended, `kept` the share of them that stays."""
        now = self.clock()
        with self.lock:
            if any(req.cancelled for req in self.waiting):
                for req in self.waiting:
                    if req.cancelled:
                        finish(req, "cancelled", now)
                self.waiting = deque(req for req in self.waiting if not req.cancelled)
            for group in (self.rows, self.prefilling):
                for req in group:
                    if req.cancelled:
                        finish(req, "cancelled", now)
                done = [req for req in group if req.finish_reason is not None]
                if done and group is self.rows:
                    rows_leave(1.0 - len(done) / len(group))
                for req in done:
                    group.remove(req)
                    release(req.slot)
                    req.slot = None
