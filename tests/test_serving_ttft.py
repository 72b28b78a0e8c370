"""serving_ttft: prefill-aware K's trade-off measured (benchmarks/configs/serving_ttft.toml,
benchmarks/figures_ttft.py). The config is serving's workload with one case per setting, each beside
its own baseline; the figures label every drafting mode's setting and pair the trials. Run for real
on the embedded tiny pair on CPU (a suite config of the same shape)."""
import json
import tomllib

import pytest

from dynspec.benchmarks.figures_ttft import _load
from dynspec.benchmarks.suite import run_config
from dynspec.benchmarks.suite_config import config_path, load_config, parse_config
from dynspec.runtime.policy.adaptive import TTFT_WEIGHT
from dynspec.runtime.policy.cost_model import ContextTable, Profile

WORKLOAD = ("acceptance", "input-len", "output-len", "max-seq-len", "concurrency", "poisson-at", "warmup-requests",
            "trials", "dynamic-schedule")


UNCAPPED = {"modes": "baseline,dynamic,adaptive"}


@pytest.mark.parametrize("name, cases, waves", [
    ("serving_ttft", {"uncapped": UNCAPPED, "prefill_k_1": {"prefill-k": 1}, "prefill_k_0": {"prefill-k": 0}}, 3),
    ("serving_ttft_serial", {"uncapped": UNCAPPED,
                             "serial": {"modes": "baseline+serial,dynamic+serial,adaptive+serial"}}, 4)])
def test_the_config_is_servings_workload_with_a_case_per_setting(name, cases, waves):
    """Both configs serve serving's workload and schedule (over fewer waves than six: each fits one
    10-minute device command by its estimate), with their cases."""
    ttft, serving = (tomllib.loads(config_path(n).read_text()) for n in (name, "serving"))
    assert load_config(name).figures == "serving_ttft"
    assert ttft["engine"] == serving["engine"]
    by_name = lambda doc: {s["name"]: s for s in doc["stages"]}     # noqa: E731
    t, s = by_name(ttft), by_name(serving)
    assert t["profile"]["args"] == s["profile"]["args"] and t["tune_050"]["args"] == s["tune_050"]["args"]
    assert {k: t["sweep"]["args"][k] for k in WORKLOAD} == {k: s["sweep"]["args"][k] for k in WORKLOAD}
    assert {c["name"]: c["args"] for c in t["sweep"]["cases"]} == cases
    assert t["sweep"]["args"]["modes"] == "baseline,dynamic" and t["sweep"]["args"]["waves"] == waves
    assert load_config(name).estimate_s <= 570


def test_the_figures_of_a_real_run_name_each_setting_and_pair_the_trials(tmp_path):
    cm = tmp_path / "profile.json"
    ms = {b: {k: round(1.0 + 0.3 * k * b, 3) for k in range(3)} for b in (1, 2, 4)}
    cm.write_text(json.dumps(Profile("cpu", (ContextTable(32, ms),)).to_json()))
    args = {"modes": "baseline,dynamic", "dynamic-schedule": "4:2", "cost-model": str(cm), "acceptance": "bernoulli:0.5",
            "input-len": "6:10", "output-len": "5:8", "max-seq-len": 40, "concurrency": "2", "waves": 1,
            "poisson-at": "2", "min-requests": 3, "warmup-requests": 1, "trials": 2}
    cases = [{"name": "uncapped", "args": {"modes": "baseline,dynamic,adaptive"}},
             {"name": "prefill_k_0", "args": {"prefill-k": 0}},
             {"name": "serial", "args": {"modes": "baseline+serial,dynamic+serial"}}]
    cfg = parse_config({"description": "serving_ttft's shape on the tiny pair", "figures": "serving_ttft",
                        "budget_s": 200, "estimate_s": 30, "engine": {"pair": "tiny", "device": "cpu"},
                        "stages": [{"name": "sweep", "tool": "sweep", "args": args, "cases": cases}]},
                       "ttft_tiny", "configs/ttft_tiny.toml")
    final = run_config(cfg, tmp_path / "work", tmp_path / "out", "test")
    rows = json.loads((final / "summary.json").read_text())["values"]["rows"]
    got = {(r["mode"], r["load"], r["setting"]) for r in rows}
    assert got == {(m, load, s) for m, s in (("dynamic", "uncapped"), ("adaptive", f"weight {TTFT_WEIGHT:g}"),
                                             ("dynamic", "prefill-k 0"), ("dynamic", "uncapped, serial loop"))
                   for load in ("C=2", "poisson~C=2")}
    # each mode over the baseline of its own loop: the serial rows' baseline ran serial
    serial = json.loads((final / "sweep_serial.json").read_text())["rows"]
    b = {_load(r): r for r in serial if r["mode"] == "baseline+serial"}
    for r in (r for r in rows if r["setting"].endswith("serial loop")):
        assert r["baseline_p50_ttft_ms"] == pytest.approx(b[r["load"]]["p50_ttft_s"] * 1e3)
    assert [r["setting"] for r in rows if r["mode"] == "dynamic" and r["load"] == "C=2"] == [
        "uncapped", "prefill-k 0", "uncapped, serial loop"]
    for r in rows:
        t = r["tok_ratio_trials"]
        assert t["n"] == 2 and t["min"] <= t["median"] <= t["max"]
        assert r["p50_ttft_ratio"] > 0 and r["p50_ttft_ms"] > 0
    md = (final / "summary.md").read_text()
    assert "measured: prefill-aware" not in md and "Measured: tok/s ratios are medians of per-trial ratios" in md
    assert (final / "summary.png").read_bytes()[:4] == b"\x89PNG"
