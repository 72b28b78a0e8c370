"""The per_request figures (benchmarks/figures_per_request.py): ratios per case and load point
against hand-computed values, host cost where recorded, each request's true rate from rate_of,
the scatter's PNG, and the kind's registration in the suite's configs."""
import json

import pytest

from dynspec.benchmarks import suite
from dynspec.benchmarks.figures_per_request import (PER_REQUEST, REPO, SCATTER_POINTS, per_request_figures,
                                                    per_request_plot, per_request_png, per_request_sweep,
                                                    per_request_table, stride)
from dynspec.benchmarks.suite_config import load_config, parse_config
from dynspec.benchmarks.summary import suite_figures
from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import BernoulliMix, Shift, TraceReplay, parse_acceptance, rate_of

FIELDS = ["output_len", "accepted_drafts", "drafted", "decode_steps", "mean_k", "acceptance", "key"]
STEP_FIELDS = ["k", "acceptance1", "probe", "policy_us", "oldest_key", "step_us", "batch_size", "policy_exposed_us"]
MIX = "bernoulli-mix:0.9@0.5,0.2@0.5"
CONFIGS = ("per_request_bimodal", "per_request_uniform_low", "per_request_uniform_high", "per_request_serving",
           "per_request_serving_64", "per_request_trace", "per_request_trace_64")


def _table(n: int, replicas: int = 1, k=lambda key: 1.0 + key % 4) -> dict:
    """n requests a replica, keys 0..n-1 (each replica's executor counts from 0), mean K from `k`."""
    return {"fields": FIELDS, "replicas": [[[32, 5, 12, 3, k(key), 0.4167, key] for key in range(n)]
                                           for _ in range(replicas)]}


def _row(mode, c, trials, n=8, **kw):
    """A sweep row: the median trial's tok/s, every trial's, its requests' table."""
    return {"mode": mode, "concurrency": c, "request_rate": None, "matched_concurrency": None,
            "output_tok_per_s": sorted(trials)[1], "trial_tok_per_s": trials, "mean_k": 1.5,
            "per_request": _table(n), **kw}


TRIALS = {"baseline": [100, 100, 100], "static:1": [110, 90, 120], "adaptive": [120, 110, 130],
          PER_REQUEST: [132, 121, 117]}


def _doc(acceptance=MIX, seed=0, cs=(1, 16), poisson=True, n=8) -> dict:
    rows = [_row(m, c, t, n) for c in cs for m, t in TRIALS.items()]
    if poisson:        # open loop at C=16's rate: no concurrency, tok/s about the arrival rate
        rows += [dict(_row(m, None, [50, 51, 52], n), request_rate=5.0, matched_concurrency=16)
                 for m in ("baseline", "adaptive", PER_REQUEST)]
    return {"env": {"acceptance_model": acceptance, "seed": seed, "command": "c", "workload": "w"}, "rows": rows}


def test_ratios_per_load_point_are_the_medians_of_per_trial_ratios():
    sw = per_request_sweep(_doc())
    assert list(sw["by_load"]) == ["1", "16", "poisson@16"]
    e = sw["by_load"]["16"]
    # per trial 132/120, 121/110, 117/130 = 1.1, 1.1, 0.9
    assert (e["per_request_vs_adaptive"]["median"], e["per_request_vs_adaptive"]["min"]) == pytest.approx((1.1, 0.9))
    assert e["per_request_vs_adaptive"]["of_medians"] == pytest.approx(121 / 120)
    assert e["per_request_vs_baseline"]["median"] == pytest.approx(1.21)         # 1.32, 1.21, 1.17
    assert e["adaptive_vs_baseline"]["median"] == pytest.approx(1.2)             # 1.2, 1.1, 1.3
    # static:1 is the only static: 132/110, 121/90, 117/120 -> 1.2, 1.344, 0.975
    assert e["best_static"] == "static:1"
    assert e["per_request_vs_best_static"]["median"] == pytest.approx(1.2)
    assert e["per_request_vs_best_static"]["min"] == pytest.approx(117 / 120)
    assert e["adaptive_vs_best_static"]["median"] == pytest.approx(120 / 110)   # 1.0909, 1.2222, 1.0833
    p = sw["by_load"]["poisson@16"]
    assert p["load"] == "Poisson at C=16's rate" and p["per_request_vs_adaptive"]["median"] == pytest.approx(1.0)
    assert "per_request_vs_best_static" not in p          # no static mode ran open loop


def test_best_static_is_the_best_by_trial_of_every_static_k():
    doc = _doc(poisson=False)
    doc["rows"].append(_row("static:3", 16, [90, 130, 95]))
    e = per_request_sweep(doc)["by_load"]["16"]
    # per trial 132 / max(110, 90), 121 / max(90, 130), 117 / max(120, 95) = 1.2, 0.931, 0.975;
    # the best by median: static:1 (110 > 95)
    assert e["best_static"] == "static:1"
    assert e["per_request_vs_best_static"]["min"] == pytest.approx(121 / 130)
    assert e["per_request_vs_best_static"]["median"] == pytest.approx(117 / 120)


def test_host_cost_is_none_without_step_records_and_the_table_says_so():
    fig = per_request_figures({"sweep_a": _doc(), "sweep_b": _doc("bernoulli:0.7")})
    assert all(e["host_cost"] is None for sw in fig["sweeps"].values() for e in sw["by_load"].values())
    t = per_request_table(fig)
    assert len(t["rows"]) == 6 and len(t["header"]) == len(t["rows"][0])
    assert {r[-1] for r in t["rows"]} == {"not recorded"} and "not recorded" in t["notes"][1]
    assert t["rows"][1][4] == "1.100 [0.900..1.100]" and t["rows"][1][7].endswith("(static:1)")


def test_host_cost_comes_from_the_per_request_rows_steps_where_recorded():
    doc = _doc(poisson=False)
    steps = [[[[2, 0.5, 0, 20.0, 0, 10000.0, 4, 5.0], [1, 0.5, 0, 40.0, 1, 12000.0, 4, 15.0],
               [3, 0.5, 0, 30.0, 2, 11000.0, 4, 10.0]]]] * 3
    for r in doc["rows"]:
        if r["mode"] == PER_REQUEST:
            r["adaptive_steps"] = {"fields": STEP_FIELDS, "trials": steps}
    e = per_request_sweep(doc)["by_load"]["16"]
    assert e["host_cost"]["fraction"] == pytest.approx(30 / 11000) and e["host_cost"]["iterations"] == 9
    assert e["adaptive_host_cost"] is None
    assert per_request_table({"sweeps": {"s": per_request_sweep(doc)}})["rows"][1][-1] == "0.09% (0.27%)"


def test_true_rates_come_from_rate_of_of_the_sweeps_model_and_seed():
    for seed in (0, 7):
        sc = per_request_sweep(_doc(seed=seed, n=40))["scatter"]
        model = parse_acceptance(MIX, seed=seed)
        assert sc["concurrency"] == 16 and set(sc["modes"]) == {PER_REQUEST, "adaptive"}
        pts = sc["modes"][PER_REQUEST]["points"]
        assert pts == [[rate_of(model, key), 1.0 + key % 4] for key in range(40)]
        assert {x for x, _ in pts} == {0.9, 0.2}
    # the seed picks each key's part: some key's rate differs between seeds 0 and 7
    assert any(BernoulliMix(((0.9, 0.5), (0.2, 0.5)), 0).rate(k) != BernoulliMix(((0.9, 0.5), (0.2, 0.5)), 7).rate(k)
               for k in range(40))
    by = sc["modes"][PER_REQUEST]["by_rate"]
    assert set(by) == {"0.2", "0.9"}


def test_a_fraction_shift_resolves_at_each_replicas_request_count():
    doc = _doc("shift:0.8,0.2@0.5", n=10)
    pts = per_request_sweep(doc)["scatter"]["modes"][PER_REQUEST]["points"]
    assert [x for x, _ in pts] == [0.8] * 5 + [0.2] * 5
    assert Shift(0.8, 0.2, 5).rate(4) == 0.8


def test_a_trace_path_relative_to_the_repo_resolves_from_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pts = per_request_sweep(_doc("trace:benchmarks/traces/tiny_pair.json"))["scatter"]["modes"][PER_REQUEST]["points"]
    model = TraceReplay(str(REPO / "benchmarks/traces/tiny_pair.json"))
    assert [x for x, _ in pts] == [rate_of(model, key) for key in range(8)]


def test_real_acceptance_has_no_true_rate_and_no_points():
    sc = per_request_sweep(_doc("real"))["scatter"]
    assert sc["modes"][PER_REQUEST] == {"points": [], "requests": 0, "by_rate": None}


def test_the_scatter_takes_the_largest_closed_loop_c_from_16_and_subsamples():
    assert per_request_sweep(_doc(cs=(1, 4), poisson=False))["scatter"] is None
    sc = per_request_sweep(_doc(cs=(1, 16, 64), n=400))["scatter"]
    assert sc["concurrency"] == 64 and sc["modes"][PER_REQUEST]["requests"] == 400
    assert len(sc["modes"][PER_REQUEST]["points"]) == SCATTER_POINTS
    assert stride(list(range(10)), 4) == [0, 2, 5, 7] and stride([1, 2], 4) == [1, 2]


def test_the_plot_writes_a_png_of_the_scatter_panels(tmp_path):
    fig = per_request_figures({"sweep_a": _doc(), "sweep_b": _doc("bernoulli:0.7")})
    spec = per_request_plot(fig)
    assert set(spec["panels"]) == {"sweep_a", "sweep_b"}
    assert spec["panels"]["sweep_b"]["series"][PER_REQUEST][0] == [0.7, 1.0]
    assert spec["series"]["sweep_a: per_request / adaptive"] == [[c, pytest.approx(1.1), pytest.approx(0.9),
                                                                  pytest.approx(1.1)] for c in (1, 16)]
    per_request_png(spec, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    per_request_png({"title": "t", "panels": {}}, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"


def test_suite_figures_read_each_case_of_a_shipped_config_and_report(tmp_path):
    from dynspec.benchmarks.suite_report import write_suite_report

    cfg = load_config("per_request_bimodal")
    for case, text in (("mix50", MIX), ("mix30", "bernoulli-mix:0.95@0.3,0.05@0.7")):
        (tmp_path / f"sweep_{case}.json").write_text(json.dumps(_doc(text)))
    figs = suite_figures("per_request", tmp_path, suite.figure_stages(cfg.stages))
    assert list(figs["values"]["sweeps"]) == ["sweep_mix50", "sweep_mix30"] and len(figs["table"]["rows"]) == 6
    assert {x for x, _ in figs["plot"]["panels"]["sweep_mix30"]["series"]["adaptive"]} <= {0.95, 0.05}
    write_suite_report(cfg, figs, {"command": "c", "stages": []}, tmp_path)
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "summary.json").read_text())["figures"] == "per_request"


@pytest.mark.parametrize("name", CONFIGS)
def test_the_per_request_configs_take_the_per_request_figures(name):
    cfg = load_config(name)
    assert cfg.figures == "per_request"
    assert any(s.cases and s.name == "sweep" for s in cfg.stages)


def test_per_request_figures_need_a_sweep_stage():
    doc = {"figures": "per_request", "budget_s": 9, "engine": {"pair": "tiny", "device": "cpu"},
           "stages": [{"name": "other", "tool": "sweep"}]}
    with pytest.raises(DynspecError, match=r"figures 'per_request' read stage\(s\) \['sweep or sweep_\*'\]"):
        parse_config(doc, "c")
    ok = parse_config(dict(doc, stages=[{"name": "sweep", "tool": "sweep"}]), "c")
    assert ok.figures == "per_request"
