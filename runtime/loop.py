"""Which executor loop runs (runtime/executor.py; docs/design.md, "The overlapped loop").

    SERIAL       plan i, run i, fold i, then plan i+1: the CPU's loop and the oracle (on an engine
                 whose launch returns before the device is done, the estimate update of i-1 runs
                 while i runs: the executor's "Deferred update")
    OVERLAPPED   plan and launch i+1, then read and fold i: the host's work hides behind the device

serving_loop(device, overlap) is the one rule that picks it for serving (engine.json
reference.overlap, the CLI, Triton, the sweeps' default):
    serving_loop("cuda:0")          -> Loop.OVERLAPPED    serving_loop("cpu")  -> Loop.SERIAL
    serving_loop("cuda", False)     -> Loop.SERIAL        serving_loop("cpu", True) -> Loop.OVERLAPPED
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynspec.runtime.plan import StepPlan, StepResult
    from dynspec.runtime.requests import Launched


class Loop(enum.Enum):
    SERIAL = "serial"
    OVERLAPPED = "overlapped"


def serving_loop(device, overlap: bool | str = "auto") -> Loop:
    """The loop an executor on `device` serves with: overlap true / false pins it; "auto" (the
    default) is OVERLAPPED on CUDA, where launch returns before the step has run, else SERIAL."""
    if isinstance(overlap, bool):
        return Loop.OVERLAPPED if overlap else Loop.SERIAL
    return Loop.OVERLAPPED if str(device).startswith("cuda") else Loop.SERIAL


# the executor's parts that differ by loop, bound once in Executor.__init__
def no_launch(plan: "StepPlan") -> None:
    """Loop.SERIAL's start of a planned step: none (step() runs it whole) -> no handle."""
    return None


def no_advance(launched: "Launched", result: "StepResult") -> None:
    """Loop.OVERLAPPED's fold moves no host state: the launch did (Executor._planned)."""


def device_seconds(launched: "Launched", result: "StepResult") -> float:
    """An overlapped step's time: its device time where the engine reports it, else the launch's
    wall time (the CPU runs the step inside the launch)."""
    return result.device_s if result.device_s is not None else launched.launch_s
