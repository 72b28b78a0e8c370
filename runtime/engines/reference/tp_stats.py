"""Per-rank step log: what each rank of a TP replica actually ran, to check that all ranks ran
the same sequence (docs/tensor_parallel.md).

    rank 0: (0, b=3, K=4, ('spec', 3, 4)) (1, 3, 4, ...) (2, b=6, K=0, ('decode', 6, 0)) ...
    rank 1: the same tuples, recorded by rank 1 from the plans it received
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankStep:
    iteration: int                 # this rank's count of step() calls
    batch_size: int
    k: int
    graphs: tuple[tuple, ...]      # the graph keys the engine dispatched, in order: (kind, bucket, k, ...)


class StepRecorder:
    """Wraps one rank's engine: every step() or launch() appends a RankStep; other attributes pass through.
    Graph keys are those the engine dispatched during the step (its `on_dispatch` hook)."""

    def __init__(self, engine):
        self._engine = engine
        self.steps: list[RankStep] = []
        self._keys: list[tuple] = []
        if hasattr(engine, "on_dispatch"):
            engine.on_dispatch = lambda key: self._keys.append(_key_tuple(key))

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def step(self, plan, *args, **kwargs):
        return self._recorded("step", plan, *args, **kwargs)

    def launch(self, plan, *args, **kwargs):
        """The overlapped loop's step: recorded at its launch (its graphs are dispatched there)."""
        return self._recorded("launch", plan, *args, **kwargs)

    def _recorded(self, name: str, plan, *args, **kwargs):
        self._keys = []
        out = getattr(self._engine, name)(plan, *args, **kwargs)
        self.steps.append(RankStep(len(self.steps), plan.batch_size, plan.k, tuple(self._keys)))
        return out


def _key_tuple(key) -> tuple:
    from dataclasses import astuple, is_dataclass

    return astuple(key) if is_dataclass(key) else tuple(key)
