"""The per-request rule finds each request's rate (runtime/policy/per_request.py, runtime/policy/row_table.py):
against the oracle (runtime/policy/per_request_oracle.py) on the H100 cost model of benchmarks/sim_data."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.policy.cost_model import CostModel
from dynspec.runtime.policy.per_request import PerRequestPolicy, RowInputs
from dynspec.runtime.policy.per_request_oracle import PerRequestOracle
from dynspec.runtime.policy.row_table import RowTable

PROFILE = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_data" / "h100-36ff40d" / "profile.json"
B, P = 64, 4


def inputs(rates: np.ndarray, pool) -> RowInputs:
    return RowInputs(B, 192.0, tuple(pool), rates, np.zeros(B, dtype=np.int64), P, True, 0, (), (), True)


def test_an_easy_and_a_hard_row_reach_their_oracle_k_within_8_steps():
    """64 rows of mix30 (0.95 for 30%, 0.05 for 70%) already known; two new rows join, one 0.95 and
    one 0.05. From their 8th decode step on, each runs at the K the oracle gives it."""
    cost = CostModel.load(PROFILE)
    policy, oracle = PerRequestPolicy(cost), PerRequestOracle(cost)
    rng = random.Random(0)
    true = [0.95 if i % 10 < 3 else 0.05 for i in range(B)]
    easy, hard = 0, 5                               # slots of the two new rows (true 0.95, 0.05)
    true[easy], true[hard] = 0.95, 0.05
    table = RowTable(B, P)
    for i, p in enumerate(true):                    # the others: 40 steps at K=4 of history
        if i in (easy, hard):
            continue
        for _ in range(40):
            n = next((j for j in range(P) if rng.random() >= p), P)
            table.update([i], [P], [n])
    pool = (0.32, 0.9, 0.9, 0.9)
    slots = list(range(B))
    want = oracle.decide_rows(inputs(oracle.row_rates(table, slots, pool, slots, lambda k: true[k]), pool)).ks
    assert want[easy] >= 2 and want[hard] == 0     # the oracle separates them
    got = []
    for _ in range(16):
        ks = policy.decide_rows(inputs(policy.row_rates(table, slots, pool, slots, None), pool)).ks
        got.append((ks[easy], ks[hard]))
        acc = [next((j for j in range(k) if rng.random() >= true[i]), k) for i, k in enumerate(ks)]
        table.update(slots, list(ks), acc)
    print(got, want[easy], want[hard])
    assert got[0][0] >= 1, f"the new easy row did not draft at its first step: {got}"
    assert all(g == (want[easy], want[hard]) for g in got[7:]), f"K (easy, hard) by step {got}, oracle {want[easy], want[hard]}"


def test_the_oracle_refuses_real_acceptance():
    cost = CostModel.load(PROFILE)
    table = RowTable(4, P)
    with pytest.raises(DynspecError, match="real acceptance has none"):
        PerRequestOracle(cost).row_rates(table, [0, 1], (0.5,), [0, 1], None)
    with pytest.raises(DynspecError, match="real acceptance has none"):
        PerRequestOracle(cost).row_rates(table, [0, 1], (0.5,), [0, 1], lambda k: None)


def test_optimistic_rates_worked_example():
    """row_table.py's worked example (weight 1, z 1, pool 0.3)."""
    t = RowTable(3, 1)
    for _ in range(3):
        t.update([1], [1], [1])
        t.update([2], [1], [0])
    r = t.optimistic([0, 1, 2], (0.3,), 1.0, 1.0)[:, 0]
    assert r == pytest.approx([0.3 + (0.21 / 2) ** 0.5, 0.99, 0.075 + (0.075 * 0.925 / 5) ** 0.5])


def test_rows_of_one_rate_run_as_the_adaptive_policy_runs_them():
    """On the serving simulator (benchmarks/sim_run.py, the H100 profile and step prices): with every
    request at one rate, no per-row vector beats the batch-level decision by the margin, so the
    per-request policy serves exactly what adaptive serves, step for step."""
    from dynspec.benchmarks.sim_run import SimRun, simulate
    from dynspec.runtime.policy.step_prices import read

    data = PROFILE.parents[1]
    prices = read(data / "h100_prices.json")[0]
    rows = simulate(SimRun(("--modes", "adaptive,per-request", "--acceptance", "bernoulli:0.5", "--concurrency", "64",
                            "--waves", "2"), str(data / "h100-6e9fc00" / "profile_per_request_bimodal.json"), 256, 432,
                           prices=prices, policy_prices=prices))
    ad, pr = rows
    assert (pr["iterations"], pr["mean_k"]) == (ad["iterations"], ad["mean_k"])
    assert pr["output_tok_per_s"] == pytest.approx(ad["output_tok_per_s"], rel=1e-9)
