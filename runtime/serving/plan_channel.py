"""The leader's plan channel of one TP replica (docs/design.md, section 5: the leader decides,
every rank runs the same step): PlanChannel carries the leader's messages to its workers over
the replica's control group (runtime/tp/tp_groups.py); LeaderEngine sends each engine call that
changes state on every rank through it, and serve_worker runs those calls on a worker.
"""
from __future__ import annotations

import pickle
import threading
import time
from typing import Any, Sequence

import torch

from dynspec.runtime.tp.tp_groups import TpContext, TpFault, _collective, _reason
from dynspec.runtime.tp.tp_layout import log

STOP, HEARTBEAT, CALL = 0, 1, 2


class PlanChannel:
    """Leader -> workers messages of one replica: a 2-int header (kind, nbytes), then nbytes of
    pickled body, both broadcast from the leader over the control group.

        leader:  ch.send(("step", (plan, acceptance), {}))     worker:  ch.recv() -> the same tuple
                 ch.close()                                              ch.recv() -> None (stop)

    The leader sends a HEARTBEAT whenever nothing was sent for timeout_s / 4, so a worker waiting
    for its next message can tell an idle leader from a dead one. Only one thread sends at a time:
    callers that must keep a message and the work after it together hold `lock` around both.
    """

    def __init__(self, ctx: TpContext, *, heartbeat: bool = True):
        self.ctx = ctx
        self.lock = threading.RLock()
        self._last = time.monotonic()
        self._closed = False
        self.beat_fault: TpFault | None = None     # why the heartbeat stopped (a fault seen while idle)
        self._beat: threading.Thread | None = None
        if ctx.layout.is_leader and ctx.tp > 1 and heartbeat:
            self._beat = threading.Thread(target=self._heartbeat, name="dynspec-tp-heartbeat", daemon=True)
            self._beat.start()

    def _bcast(self, t: torch.Tensor, what: str) -> None:
        ctx = self.ctx
        _collective(lambda: torch.distributed.broadcast(t, src=ctx.layout.leader, group=ctx.control), ctx, what)

    def _send(self, kind: int, body: bytes = b"") -> None:
        self._bcast(torch.tensor([kind, len(body)], dtype=torch.int64), "plan header broadcast")
        if body:
            self._bcast(torch.frombuffer(bytearray(body), dtype=torch.uint8), "plan body broadcast")
        self._last = time.monotonic()

    def send(self, msg: Any) -> None:
        """Leader only: every worker's next recv() returns msg."""
        if self.ctx.tp == 1:
            return
        with self.lock:
            if self._closed:
                raise TpFault("the plan channel is closed")
            self._send(CALL, pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self) -> Any:
        """Worker only: the leader's next message, or None once it sent STOP."""
        while True:
            head = torch.empty(2, dtype=torch.int64)
            try:
                self._bcast(head, "wait for the leader's next message")
            except TpFault as e:
                raise TpFault(f"no message from the leader (world rank {self.ctx.layout.leader}) within "
                              f"{self.ctx.timeout_s:g} s: it died or hung ({e})") from e
            kind, n = int(head[0]), int(head[1])
            if kind == HEARTBEAT:
                continue
            if kind == STOP:
                return None
            body = torch.empty(n, dtype=torch.uint8)
            self._bcast(body, "plan body broadcast")
            return pickle.loads(body.numpy().tobytes())

    def close(self) -> None:
        """Leader only: tell the workers to stop (their recv() returns None)."""
        if self.ctx.tp == 1:
            return
        with self.lock:
            if not self._closed:
                self._closed = True
                self._send(STOP)

    def _heartbeat(self) -> None:
        period = self.ctx.timeout_s / 4
        while True:
            time.sleep(period / 2)
            with self.lock:
                if self._closed:
                    return
                if time.monotonic() - self._last >= period:
                    try:
                        self._send(HEARTBEAT)
                    except TpFault as e:     # the next send on the serving thread reports it too
                        self.beat_fault = e
                        log(f"heartbeat: {e}", rank=self.ctx.layout.rank, all_ranks=True)
                        return


# ----------------------------------------------------------------------------- engines over the channel

# Engine calls that change state on every rank (runtime/serving/plan.py's Engine protocol): the paged
# cache's reserve/release (the block allocator is deterministic, so the same calls give every rank
# the same slots) and the step, whole (SerialLoop) or its launch (DeferredLoop, OverlappedLoop: the
# plan of i+1 is broadcast while i runs; `result` reads the leader's own copy and is not sent).
# Every other attribute, async_launch among them, is the leader's local engine's.
FORWARDED = ("reserve", "release", "step", "launch")


class LeaderEngine:
    """Leader side of a TP replica: each call in `forwarded` is sent to the workers, then run on
    the local engine while the channel is held, so messages and collectives stay in step on every
    rank. Everything else (max_batch_size, buckets, ...) reads the local engine.
    A TpFault or collective error inside a forwarded call is re-raised as TpFault."""

    def __init__(self, engine, channel: PlanChannel, forwarded: Sequence[str] = FORWARDED):
        self._engine, self._channel, self._forwarded = engine, channel, tuple(forwarded)
        self.fault: TpFault | None = None      # the first fault seen; every later call re-raises it

    def __getattr__(self, name: str):
        attr = getattr(self._engine, name)
        if name not in self._forwarded:
            return attr

        def call(*args, **kwargs):
            if self.fault is not None:
                raise self.fault
            with self._channel.lock:
                try:
                    self._channel.send((name, args, kwargs))
                    return attr(*args, **kwargs)
                except TpFault as e:
                    self.fault = e
                    raise
                except RuntimeError as e:
                    self.fault = TpFault(f"leader: {name} failed in a collective: {_reason(e)}")
                    raise self.fault from e
        return call

    def close(self) -> None:
        self._channel.close()


def serve_worker(engine, channel: PlanChannel) -> int:
    """Worker side: run exactly the calls the leader sends, until it sends STOP. Returns how many."""
    n = 0
    while (msg := channel.recv()) is not None:
        name, args, kwargs = msg
        getattr(engine, name)(*args, **kwargs)
        n += 1
    return n
