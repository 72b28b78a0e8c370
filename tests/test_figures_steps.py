"""Where a mode's time goes (benchmarks/figures_steps.py, the rows' step_times): the docstring's
example, the note's per-kind differences, and a real sweep on the tiny pair whose step_times add up
to the row's own iterations and step time."""
import json

import pytest

from dynspec.benchmarks import figures_steps as fs
from dynspec.benchmarks.suite import run_config
from dynspec.benchmarks.suite_config import parse_config

FIELDS = ["batch_size", "k", "prefill_tokens", "catch_up_tokens", "step_us"]


def test_the_docstring_example():
    st = {"fields": FIELDS, "replicas": [[(0, 0, 8192, 0, 250000.0), (200, 0, 0, 0, 13000.0),
                                          (180, 0, 128, 0, 22000.0), (40, 1, 0, 96, 9000.0)]]}
    assert fs.time_split(st) == {"prompt only": [1, 250.0], "decode K=0": [1, 13.0], "mixed K=0": [1, 22.0],
                                 "decode K>0": [1, 9.0], "mixed K>0": [0, 0.0], "catch-up": [1, 9.0]}


def test_the_note_gives_each_modes_difference_by_kind():
    base = {"fields": FIELDS, "replicas": [[(200, 0, 0, 0, 10000.0)] * 3, [(190, 0, 64, 0, 20000.0)]]}
    spec = {"fields": FIELDS, "replicas": [[(200, 0, 0, 0, 10000.0), (30, 2, 0, 40, 8000.0)], [(190, 0, 64, 0, 21000.0)]]}
    rows = [{"mode": "baseline", "concurrency": 4, "step_times": base},
            {"mode": "adaptive", "concurrency": 4, "step_times": spec},
            {"mode": "adaptive", "concurrency": 2, "step_times": spec},
            {"mode": "adaptive", "concurrency": None, "request_rate": 9.0, "step_times": spec}]
    sp = fs.split_at(rows)
    assert sp["concurrency"] == 4 and set(sp["modes"]) == {"baseline", "adaptive"}
    note = fs.split_note("sweep", sp)
    assert note == ("sweep at C=4, ms in steps by kind (steps), median trial: baseline: decode K=0 30 (3), mixed K=0 20 (1); "
                    "adaptive: decode K=0 10 (1), decode K>0 8 (1), mixed K=0 21 (1); catch-up in 1 of them; "
                    "adaptive - baseline: decode K=0 -20, decode K>0 +8, mixed K=0 +1 = -11 ms")
    assert fs.split_at([{"mode": "baseline", "concurrency": 4}]) is None          # rows of older runs


def test_a_real_sweeps_step_times_add_up_to_its_rows(tmp_path):
    args = {"modes": "baseline,dynamic", "dynamic-schedule": "4:2", "acceptance": "bernoulli:0.5",
            "input-len": "6:30", "output-len": "5:8", "max-seq-len": 48, "concurrency": "1,3",
            "waves": 1, "min-requests": 3, "warmup-requests": 1, "trials": 1}
    cfg = parse_config({"description": "tiny pair on CPU", "figures": "sweep", "budget_s": 200, "estimate_s": 30,
                        "engine": {"pair": "tiny", "device": "cpu"},
                        "stages": [{"name": "sweep", "tool": "sweep", "args": args}]}, "steps_tiny", "configs/steps_tiny.toml")
    final = run_config(cfg, tmp_path / "work", tmp_path / "out", "test")
    rows = json.loads((final / "sweep.json").read_text())["rows"]
    assert len(rows) == 4
    for r in rows:
        split = fs.time_split(r["step_times"])
        assert sum(split[k][0] for k in fs.KINDS) == r["iterations"]
        assert sum(split[k][1] for k in fs.KINDS) == pytest.approx(r["iterations"] * r["mean_step_ms"], rel=1e-3, abs=0.1)
        assert (split["decode K>0"][0] + split["mixed K>0"][0] > 0) == (r["mode"] == "dynamic")
        assert split["mixed K=0"][0] + split["mixed K>0"][0] == r["mixed_iterations"]
    values = json.loads((final / "summary.json").read_text())["values"]
    assert values["time_split"]["concurrency"] == 3
    assert "sweep at C=3, ms in steps by kind (steps), median trial: baseline: " in (final / "summary.md").read_text()
