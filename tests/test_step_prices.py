"""runtime/policy/step_prices.py: the prices file, read whole or refused in one line, and a device's
prices found by name (the sweep's --step-prices)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dynspec.benchmarks.sweep_modes import policy_prices
from dynspec.errors import DynspecError
from dynspec.runtime.policy import step_prices
from dynspec.runtime.policy.step_prices import StepPrices, for_device

SIM_DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_data"


def test_a_folder_gives_the_running_devices_prices():
    h100 = for_device(SIM_DATA, "NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100 == step_prices.read(SIM_DATA / "h100_prices.json")[0]
    assert for_device(SIM_DATA, "cpu") is None


def test_a_file_of_another_device_is_refused(tmp_path):
    p = tmp_path / "p.json"
    step_prices.write(p, StepPrices(ragged_factor=1.3), "NVIDIA H200", ["x"], [])
    assert for_device(p, "NVIDIA H200").ragged_factor == 1.3
    with pytest.raises(DynspecError, match=r"p\.json: step prices of 'NVIDIA H200', and this engine runs on 'cpu'"):
        for_device(p, "cpu")


def test_a_bad_file_is_named(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"device": "cpu", "fitted_on": [], "prices": {"ragged_factor": 9}}))
    with pytest.raises(DynspecError, match=r"bad\.json|ragged_factor 9"):
        step_prices.read(p)


def test_the_sweep_flag_on_cpu(tmp_path, capsys):
    cost_model = tmp_path / "engine" / "cost_model.json"
    args = argparse.Namespace(step_prices=str(SIM_DATA), device="cpu")
    assert policy_prices(args, cost_model) is None
    assert "no prices of 'cpu'; per-row vectors at their split price, prompt chunks unpriced" in capsys.readouterr().out
    p = tmp_path / "cpu.json"
    step_prices.write(p, StepPrices(ragged_factor=1.25), "cpu", ["x"], [])
    assert policy_prices(argparse.Namespace(step_prices=str(p), device="cpu"), cost_model).ragged_factor == 1.25
    assert policy_prices(argparse.Namespace(step_prices=None, device="cpu"), cost_model) is None
    cost_model.parent.mkdir()
    step_prices.write(cost_model.with_name(step_prices.STEP_PRICES), StepPrices(ragged_factor=1.5), "cpu", ["x"], [])
    assert policy_prices(argparse.Namespace(step_prices=None, device="cpu"), cost_model).ragged_factor == 1.5
    assert policy_prices(args, cost_model) is None            # the flag's folder first, even without the device


def test_a_recorded_command_becomes_the_replays_flags():
    from dynspec.benchmarks.sim_record import load_flags

    cmd = ("python -m dynspec.benchmarks.sweep --engine reference --engine-dir /tmp/e --device cuda --dtype bfloat16"
           " --graphs full --no-progress --modes baseline,dynamic --dynamic-schedule @/tmp/s.txt --max-seq-len 432"
           " --concurrency 16,64 --step-prices benchmarks/sim_data --out /tmp/o")
    assert load_flags(cmd, "64:2,256:1") == ["--modes", "baseline,dynamic", "--dynamic-schedule", "64:2,256:1",
                                             "--concurrency", "16,64"]
    with pytest.raises(DynspecError, match="no schedule recorded"):
        load_flags(cmd, None)


def test_a_data_set_of_results_still_committed_is_their_record(tmp_path):
    """Each benchmarks/sim_data set whose runs the committed results still hold (every config's
    manifest names its tree) is sim_record of those results: the 82cefa0 set of per_request_bimodal."""
    from dynspec.benchmarks.sim_record import record

    results, matched = SIM_DATA.parent / "results", []
    for runs in sorted(SIM_DATA.glob("*/runs.json")):
        want = json.loads(runs.read_text())
        configs = list(dict.fromkeys(r["config"] for r in want["runs"]))
        trees = {json.loads((results / c / "manifest.json").read_text()).get("git_worktree_tree")
                 if (results / c / "manifest.json").is_file() else None for c in configs}
        if not want.get("tree") or trees != {want["tree"]}:
            continue                                  # a newer run replaced some of them
        out = tmp_path / runs.parent.name
        assert record([results / c for c in configs], out, want["prices"]) == want
        assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in runs.parent.iterdir())
        matched.append(runs.parent.name)
    assert "h100-82cefa0" in matched


def test_a_data_sets_commit_is_seven_digits_whatever_gits_abbreviation(monkeypatch):
    """A clone whose object count makes git abbreviate to 8 or more digits (or a core.abbrev of 12)
    names the same commit as the runs.json it checks: 82cefa0, not 82cefa0c."""
    from dynspec.benchmarks.sim_record import commit_of

    tree = json.loads((SIM_DATA / "h100-82cefa0" / "runs.json").read_text())["tree"]
    for key, value in (("GIT_CONFIG_COUNT", "1"), ("GIT_CONFIG_KEY_0", "core.abbrev"), ("GIT_CONFIG_VALUE_0", "12")):
        monkeypatch.setenv(key, value)
    assert commit_of(tree) == "82cefa0"


def test_an_unmeasured_ragged_factor_keeps_per_row_vectors_off(tmp_path):
    """The H200's prices were fitted on a serving run with no per-row step, so its ragged factor is
    null; the per-request policy then prices per-row vectors at UNMEASURED_RAGGED. Replayed on the
    H200 profile of benchmarks/sim_data (0a3d7b9; per_request_bimodal's workload, mix30, C = 64),
    per-request runs as adaptive does; priced at 1.0, as the H200 run at 28850e6 was (0.77x baseline
    there), it runs per-row vectors (in the steps with a prompt chunk, where the engine packs them),
    so its K departs from adaptive's."""
    import dataclasses

    import numpy as np

    from dynspec.benchmarks import sim_fit, simulate

    h200 = step_prices.read(SIM_DATA / "h200_prices.json")[0]
    assert h200.ragged_factor is None and step_prices.policy_ragged(h200) == step_prices.UNMEASURED_RAGGED
    F = np.array([[100.0, 0, 0, 0, 0], [100.0, 1000, 10, 0, 0], [200.0, 500, 5, 0, 0]])    # no per-row step
    assert sim_fit.solve(F, np.array([900.0, 1000, 1900]), np.array([880.0, 1030, 1900])).ragged_factor is None
    profile = SIM_DATA / "h200-0a3d7b9" / "profile.json"
    assert "H200" in json.loads(profile.read_text())["device"]

    def mean_k(prices_file, out):
        assert simulate.main(["--cost-model", str(profile), "--step-prices", str(prices_file), "--out", str(out),
                              "--no-progress", "--modes", "adaptive,per-request", "--acceptance",
                              "bernoulli-mix:0.95@0.3,0.05@0.7", "--input-len", "64:192", "--output-len", "32:224",
                              "--concurrency", "64", "--waves", "2", "--warmup-requests", "0", "--trials", "1"]) == 0
        return {r["mode"]: r["mean_k"] for r in json.loads(out.with_suffix(".json").read_text())["rows"]}

    off = mean_k(SIM_DATA / "h200_prices.json", tmp_path / "off")
    flat = tmp_path / "flat.json"
    step_prices.write(flat, dataclasses.replace(h200, ragged_factor=1.0), "NVIDIA H200", ["x"], [])
    on = mean_k(flat, tmp_path / "on")
    assert off["per-request"] == off["adaptive"] and abs(on["per-request"] - on["adaptive"]) > 0.02, (off, on)


def test_a_runs_policy_prices_are_recorded_and_replayed():
    """The sweep's env block records the prices its cost-model policies ran with (policy_record); the
    replay gives its policies the same (simulate._served_prices), and none for runs that record none."""
    from dynspec.benchmarks.simulate import _served_prices

    h100 = step_prices.read(SIM_DATA / "h100_prices.json")[0]
    rec = step_prices.policy_record(h100)
    assert rec["ragged_factor"] == h100.ragged_factor
    assert _served_prices({"policy_prices": json.loads(json.dumps(rec["step_prices"]))}) == h100
    assert step_prices.policy_record(None) == {"ragged_factor": 1.0, "step_prices": None}
    assert step_prices.policy_record(StepPrices(ragged_factor=None))["ragged_factor"] == step_prices.UNMEASURED_RAGGED
    assert _served_prices({}) is None
