"""Which executor loop runs, and the strategy object that runs it (runtime/serving/executor.py;
docs/design.md, "The overlapped loop").

    SERIAL       plan i, run i, fold i, then plan i+1: the CPU's loop and the oracle
    OVERLAPPED   plan and launch i+1, then read and fold i: the host's work hides behind the device

serving_loop(device, overlap) is the one rule that picks it for serving (engine.json
reference.overlap, the CLI, Triton, the sweeps' default):
    serving_loop("cuda:0")          -> Loop.OVERLAPPED    serving_loop("cpu")  -> Loop.SERIAL
    serving_loop("cuda", False)     -> Loop.SERIAL        serving_loop("cpu", True) -> Loop.OVERLAPPED

The Executor plans (Executor.plan) and folds (Executor.fold); the strategy it makes once, in
__init__ (loop_strategy), owns step(), the cache slack and what it carries between iterations:

    strategy        step()                                        slack (K=4)   carries
    SerialLoop      plan i, engine.step(i), fold i                K+1 (5)       nothing
    DeferredLoop    plan i, launch i, update i-1, result i, fold  K+1 (5)       i-1's estimate update
    OverlappedLoop  plan + launch i+1, result i, fold i           2(K+1) (10)   i, launched, unread

DeferredLoop is Loop.SERIAL on an engine whose launch returns before the device has run the step
(engine.async_launch: the reference engine on CUDA): the estimate / calibration update of i-1 runs
while i runs, so i+1's K reads the estimate through i-1, as the overlapped loop's does.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from dynspec.runtime.serving.plan import launches_async

if TYPE_CHECKING:
    from dynspec.runtime.serving.plan import StepPlan, StepResult
    from dynspec.runtime.serving.requests import IterationStats, Launched


class Loop(enum.Enum):
    SERIAL = "serial"
    OVERLAPPED = "overlapped"


def serving_loop(device, overlap: bool | str = "auto") -> Loop:
    """The loop an executor on `device` serves with: overlap true / false pins it; "auto" (the
    default) is OVERLAPPED on CUDA, where launch returns before the step has run, else SERIAL."""
    if isinstance(overlap, bool):
        return Loop.OVERLAPPED if overlap else Loop.SERIAL
    return Loop.OVERLAPPED if str(device).startswith("cuda") else Loop.SERIAL


class LoopStrategy:
    """One executor loop: step() runs an iteration through its executor `ex` (runtime/serving/executor.py,
    not imported here: it imports this module), which plans (ex.plan), moves the host state
    (ex.advance) and folds (ex.fold)."""
    kind: Loop
    windows = 1                     # verify windows (K+1 each) a request's cache holds past its last token

    def __init__(self, ex):
        self.ex = ex
        self.async_launch = launches_async(ex.engine)   # launch returns before the device has run the step

    @classmethod
    def cache_slack(cls, max_draft_len: int) -> int:
        """Positions a request's cache needs past prompt + max_new_tokens: `windows` verify windows.
        max_draft_len 4: SerialLoop 5, OverlappedLoop 10."""
        return (max_draft_len + 1) * cls.windows

    @property
    def slack(self) -> int:
        """This executor's cache slack (its engine is read at the first submit, not before)."""
        return self.cache_slack(self.ex.engine.max_draft_len)

    @property
    def in_flight(self) -> bool:
        """An iteration launched whose result is still to be read."""
        return False

    def step(self) -> "IterationStats | None":
        raise NotImplementedError

    def drain(self) -> None:
        """Stopped: read and fold what is in flight (nothing, but in the overlapped loop)."""


class SerialLoop(LoopStrategy):
    """Plan i, run it whole, fold it: every plan reads exact host rows and the host state moves
    with the result. Carries nothing from one iteration to the next. The oracle."""
    kind = Loop.SERIAL
    update_at_fold = True           # the fold applies the estimate / calibration update it records

    def step(self) -> "IterationStats | None":
        """Plan, run (SerialLoop: engine.step, launch and result in one call), fold."""
        ex = self.ex
        ex.retire()
        launched = ex.plan(None, carry=False)
        if launched is None:
            return None
        try:
            result, update_s = self.run(launched.plan)
        except BaseException:
            ex.fail(launched.requests())
            raise
        t2 = ex.clock()
        ex.advance(launched, result.draft_warm)
        st = ex.fold(launched, result, t2, t2 - launched.t1, overlapped=False, update_s=update_s,
                     apply_update=self.update_at_fold)
        ex.retire()                     # free finished requests' blocks now, not at the next call
        return st

    def run(self, plan: "StepPlan") -> "tuple[StepResult, float]":
        """-> (the step's result, seconds of the update applied while it ran: none here)."""
        return self.ex.engine.step(plan, self.ex.acceptance), 0.0


class DeferredLoop(SerialLoop):
    """SerialLoop on an asynchronous engine: the update recorded by the fold of i-1 is applied
    after i's launch, while the device runs i, not in the fold. Carries that update (the
    executor's planner holds it: KDecider.pending) from one iteration to the next."""
    update_at_fold = False

    def run(self, plan: "StepPlan") -> "tuple[StepResult, float]":
        """engine.launch, the pending update, engine.result -> (result, the update's seconds: none
        of them exposed, the device running the step meanwhile)."""
        ex = self.ex
        handle = ex.engine.launch(plan, ex.acceptance)
        update_s = ex.apply_update()
        return ex.engine.result(handle), update_s


class OverlappedLoop(LoopStrategy):
    """Plan and launch i+1 while i runs, then read i's result (the one host sync) and fold it.
    Carries i, launched and not yet read: the rows of i+1 take i's tokens and positions on the
    device (runtime/serving/overlap.py), and the host state moves at the launch, not the fold."""
    kind = Loop.OVERLAPPED
    windows = 2     # a row that finished in step i still runs step i+1 from where the device left
                    # it, up to K_i + 1 past its last planned position, and writes K_{i+1} + 1 there

    def __init__(self, ex):
        super().__init__(ex)
        self.launched: Launched | None = None     # the iteration in flight, its result not read

    @property
    def in_flight(self) -> bool:
        return self.launched is not None

    def launch(self, plan: "StepPlan") -> object:
        return self.ex.engine.launch(plan, self.ex.acceptance)

    def step(self) -> "IterationStats | None":
        """Launch the next iteration, then fold the one launched by the previous call; returns
        that one's stats, None when none was folded (nothing to run, or the first of a run)."""
        ex = self.ex
        ex.retire()
        prev, self.launched = self.launched, None
        try:
            nxt = ex.plan(prev, carry=True, launch=self.launch, hidden=self.async_launch and prev is not None)
            if nxt is not None:
                ex.advance(nxt, nxt.plan.k > 0)     # draft heads are warm after K > 0
            self.launched = nxt
        except BaseException:
            if prev is not None:        # i+1 was to continue from it: its requests end too
                ex.fail(prev.requests())
            raise
        if prev is None:
            return None
        try:
            result = ex.engine.result(prev.handle)
        except BaseException:
            nxt, self.launched = self.launched, None
            ex.fail(prev.requests() + (nxt.requests() if nxt is not None else []))
            raise
        st = ex.fold(prev, result, ex.clock(), device_seconds(prev, result), overlapped=True,
                     hidden=self.async_launch and self.launched is not None)
        ex.retire()
        return st

    def drain(self) -> None:
        """Read and fold the iteration in flight, if any (its requests have ended: they keep
        nothing of it). A failed read is dropped: the requests are already final."""
        launched, self.launched = self.launched, None
        if launched is None:
            return
        try:
            result = self.ex.engine.result(launched.handle)
            self.ex.fold(launched, result, self.ex.clock(), device_seconds(launched, result), overlapped=True)
        except Exception:
            pass


STRATEGIES: dict[Loop, type[LoopStrategy]] = {Loop.SERIAL: SerialLoop, Loop.OVERLAPPED: OverlappedLoop}


def loop_strategy(loop: Loop, ex) -> LoopStrategy:
    """The strategy that runs `loop` for ex: Loop.SERIAL on an engine.async_launch engine is
    DeferredLoop. Made once, in Executor.__init__."""
    if loop is Loop.SERIAL and launches_async(ex.engine):
        return DeferredLoop(ex)
    return STRATEGIES[loop](ex)


def device_seconds(launched: "Launched", result: "StepResult") -> float:
    """An overlapped step's time: its device time where the engine reports it, else the launch's
    wall time (the CPU runs the step inside the launch)."""
    return result.device_s if result.device_s is not None else launched.launch_s
