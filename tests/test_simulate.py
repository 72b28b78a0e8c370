"""The serving simulator (benchmarks/simulate.py) against the recorded GPU runs of benchmarks/sim_data.

Asserted where the cost model prices every step a mode runs, on the serving configs (one Bernoulli
rate, six waves): each Poisson point (arrival-bound) and each closed loop at C <= 16. Elsewhere the
errors are reported, not asserted: the profile has no price for prompt chunks beside drafting rows
at large b, nor for per-row (ragged) steps, and the simulator overestimates those modes by up to 25%;
on the two-wave bimodal runs the adaptive policy's estimate settles differently in the serial loop
(docs/design.md, "The serving simulator")."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynspec.benchmarks import simulate
from dynspec.benchmarks.sim_engine import SimClock, SimEngine, shape_of
from dynspec.errors import DynspecError
from dynspec.runtime.acceptance import Bernoulli
from dynspec.runtime.cost_model import CostModel
from dynspec.runtime.plan import make_plan

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_data"
UNIFORM = ("baseline", "dynamic", "adaptive")


@pytest.fixture(scope="module")
def rows():
    return simulate.validate(DATA)


def priced(r: dict) -> bool:
    small = r["load"].startswith("C=") and int(r["load"][2:]) <= 16
    return r["config"].startswith("serving") and (r["load"].startswith("poisson") or (small and r["mode"] in UNIFORM))


def test_every_recorded_point_is_simulated(rows):
    want = {(m["config"], m["case"], meta_dir.name, x["load"], x["mode"])
            for meta_dir in DATA.iterdir() if (meta_dir / "runs.json").is_file()
            for m in json.loads((meta_dir / "runs.json").read_text())["runs"] for x in m["measured"]}
    assert len(rows) == len(want) and len(rows) >= 90


def test_priced_points_within_tolerance(rows):
    bad = [r for r in rows if priced(r) and not simulate.within([r])]
    assert not bad, simulate.table(bad)
    assert sum(priced(r) for r in rows) >= 30


def test_bernoulli_draws_are_the_engines_rule():
    """A row drafting K=4 at p=1 accepts 4, at p=0 none; a row's K_i caps it."""
    cost = CostModel.load(DATA / "h100-36ff40d" / "profile.json")
    clock = SimClock()
    eng = SimEngine(cost, shape_of(8, 64, 4), clock)
    a, b = eng.reserve(32, key=3), eng.reserve(32, key=4)
    plan = make_plan(4, positions=[10, 12], pending=[1, 1], stale=[False, False], keep_warm=False,
                     buckets=eng.buckets, slots=[a, b], row_k=(4, 2))
    assert eng.step(plan, Bernoulli(1.0)).accepted == (4, 2)
    assert eng.step(plan, Bernoulli(0.0)).accepted == (0, 0)
    assert clock() == pytest.approx(2 * eng.step_ms(plan) / 1e3)
    with pytest.raises(DynspecError, match="above max_seq_len"):
        eng.reserve(65)


def test_the_cli_refuses_sweep_flags_with_validate(tmp_path, capsys):
    assert simulate.main(["--validate", str(DATA), "--concurrency", "4", "--out", str(tmp_path / "v")]) == 2
    assert "takes no sweep flags" in capsys.readouterr().err
