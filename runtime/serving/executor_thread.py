"""The executor's background loop (Triton, streaming clients): step() on a thread of its own
while there are requests, waiting on the request pool's lock otherwise, until stopped."""
from __future__ import annotations

import threading
from typing import Callable

from dynspec.runtime.serving.request_pool import RequestPool
from dynspec.runtime.serving.requests import finish


class LoopThread:
    """ex.step() on a thread; busy(): work to do; wind_down(): what a stop does (the lock held).
    A failed step counts in ex.step_errors / ex.last_step_error and the loop goes on; any other
    failure ends every request as "error" and is kept in pool.error (submit raises from it)."""

    def __init__(self, ex, pool: RequestPool, busy: Callable[[], bool], wind_down: Callable[[], None]):
        self.ex, self.pool, self.busy, self.wind_down = ex, pool, busy, wind_down
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is not None:
            return
        with self.pool.lock:
            self.pool.stopped = False
        self.thread = threading.Thread(target=self._loop, name="dynspec-executor", daemon=True)
        self.thread.start()

    def stop(self, timeout: float) -> None:
        with self.pool.lock:
            self.pool.stopped = True
            self.pool.lock.notify_all()
            if self.thread is None:             # driven by step(): end what is left here
                self.wind_down()
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                raise RuntimeError(f"executor loop did not stop within {timeout} s")
            self.thread = None

    def _loop(self) -> None:
        pool = self.pool
        try:
            while True:
                with pool.lock:
                    while not pool.stopped and not self.busy():
                        pool.lock.wait()
                    if pool.stopped:
                        self.wind_down()
                        return
                try:
                    self.ex.step()
                except Exception as e:  # step() ended its own requests as "error"; others go on
                    self.ex.step_errors += 1
                    self.ex.last_step_error = e
        except BaseException as e:  # surface to clients instead of hanging them
            pool.error = e
            with pool.lock:
                for req in pool.rows + pool.prefilling + list(pool.waiting):
                    finish(req, "error", pool.clock())
            raise
