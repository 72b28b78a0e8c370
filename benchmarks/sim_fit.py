"""Step prices the profile does not time, fitted on recorded GPU runs (benchmarks/sim_engine.py,
StepPrices; docs/design.md, "The serving simulator").

A closed-loop run's measured time is its steps' mean ms x iterations. The simulator replays the run
and sums, over the steps it plans, their profiled base ms S and the features F (sim_engine.FEATURES:
steps, chunk tokens, steps with chunks, chunk tokens of a drafting mode, base ms of per-row steps).
The prices are the least-squares solution of
    measured_r = S_r + F_r . theta,   theta = (-host_ms, chunk_ms_per_token, chunk_fixed_ms,
                                               draft_chunk_ms_per_token, ragged_factor - 1)
each run weighted by 1 / measured_r (relative error), then the replay is repeated with the fitted
prices (the policies' calibration reads the step times) and refitted: FIT_ROUNDS rounds
(simulate.fit_prices runs the replays; this module is the pure part). A price
the runs cannot identify (no per-row step in a serving-only set) stays at its neutral value, and
the ragged factor is then written null: not measured (step_prices.policy_ragged).
Worked example, two runs with S = (900, 1000) ms, F = ((100, 0, 0, 0, 0), (100, 1000, 10, 0, 0))
and measured (880, 1030): host 0.2 ms a step, a chunk's 1000 tokens + 10 fixed cost 50 ms.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from dynspec.benchmarks.sim_engine import FEATURES
from dynspec.errors import DynspecError
from dynspec.runtime.policy import step_prices
from dynspec.runtime.policy.step_prices import StepPrices

FIT_ROUNDS = 2


def solve(F: np.ndarray, S: np.ndarray, y: np.ndarray) -> StepPrices:
    """The weighted least-squares prices (module docstring); unidentified columns stay neutral."""
    if len(y) < 2:
        raise DynspecError(f"fitting step prices needs at least 2 closed-loop points (got {len(y)})")
    w = 1.0 / y
    used = [j for j in range(F.shape[1]) if np.any(F[:, j])]
    theta = np.zeros(F.shape[1])
    theta[used] = np.linalg.lstsq(F[:, used] * w[:, None], (y - S) * w, rcond=None)[0]
    return StepPrices(host_ms=float(-theta[0]), chunk_ms_per_token=float(theta[1]), chunk_fixed_ms=float(theta[2]),
                      draft_chunk_ms_per_token=float(theta[3]),
                      ragged_factor=float(1.0 + theta[4]) if 4 in used else None)   # no per-row step: not measured


def write(path: Path, prices: StepPrices, device: str, fitted_on: list[str]) -> None:
    step_prices.write(path, prices, device, fitted_on, list(FEATURES))

