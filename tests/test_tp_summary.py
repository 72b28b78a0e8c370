"""benchmarks/tp_summary.py: the TP=2 vs TP=1 figures from hand-made documents with known answers."""
import json

import pytest

from dynspec.benchmarks import tp_summary
from dynspec.errors import DynspecError


def _decode(tp, ms, floor, comm=None):
    return {"tp": tp, "decode_ms": ms, "gemm_floor_ms": floor, "comm_fraction": comm or {}, "command": f"tp{tp}"}


def test_decode_ratio_uses_the_served_all_reduce_and_falls_back_to_nccl():
    tp1 = _decode(1, {"none": 6.0}, 4.0)
    tp2 = _decode(2, {"nccl": 5.1, "one-shot": 4.8, "skip": 4.2}, 2.4, {"nccl": 1 - 4.2 / 5.1, "one-shot": 0.125})
    f = tp_summary.decode_figures(tp1, tp2)
    assert f["tp2_vs_tp1_decode"] == pytest.approx(0.8) and f["tp2_all_reduce"] == "one-shot"
    assert f["tp2_vs_floor"] == pytest.approx(2.0) and f["tp_comm_fraction"] == pytest.approx(0.125)
    assert f["tp2_vs_tp1_decode_by_mode"] == pytest.approx({"nccl": 0.85, "one-shot": 0.8})
    no_one_shot = _decode(2, {"nccl": 5.1, "skip": 4.2}, 2.4)
    assert tp_summary.decode_figures(tp1, no_one_shot)["tp2_all_reduce"] == "nccl"
    with pytest.raises(DynspecError, match="expected a tp=1 and a tp=2 document, got tp=2 and tp=2"):
        tp_summary.decode_figures(tp2, tp2)


def test_crossover_is_the_first_profiled_batch_with_k_zero():
    rows = [{"batch_size": b, "best_k": k, "gain": g, "profiled": p}
            for b, k, g, p in [(1, 4, 2.0, True), (48, 0, 1.0, False), (64, 2, 1.2, True), (128, 0, 1.0, True)]]
    assert tp_summary.crossover({"rows": rows, "schedule": "64:2"})[0] == 128
    c, note = tp_summary.crossover({"rows": rows[:3], "schedule": "64:2"})
    assert c is None and "none up to b=64: K=2 still gains 1.20x" in note


def test_replica_scaling_takes_medians_and_step_times():
    def sweep(replicas, tps, trials, step):
        return {"env": {"replicas": replicas, "command": f"sweep x{replicas}"},
                "rows": [{"mode": "dynamic", "concurrency": 16, "output_tok_per_s": tps, "trial_tok_per_s": trials,
                          "mean_step_ms": step, "steady_tok_per_s": 1.2 * tps}]}
    eff, spread, step, steady = tp_summary.replica_scaling(sweep(1, 100, [90, 100, 110], 10.0),
                                                           sweep(2, 180, [170, 180, 200], 10.0))
    assert eff == {"dynamic": pytest.approx(0.9)} and step == {"dynamic": pytest.approx(1.0)}
    assert steady == {"dynamic": pytest.approx(216 / 240)}
    assert spread["dynamic"] == pytest.approx([170 / 220, 200 / 180])
    with pytest.raises(DynspecError, match="expected 2 replicas, got 1"):
        tp_summary.replica_scaling(sweep(1, 1, [1], 1), sweep(1, 1, [1], 1))


def test_cli_writes_the_summary_and_names_missing_tp2_tune(tmp_path):
    for name, doc in {"d1": _decode(1, {"none": 6.0}, 4.0), "d2": _decode(2, {"nccl": 5.0, "skip": 4.5}, 2.5),
                      "t1": {"rows": [{"batch_size": 1, "best_k": 3, "gain": 2.0, "profiled": True}], "command": "tune"}
                      }.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    out = tmp_path / "s.json"
    assert tp_summary.main(["--decode", f"tp1={tmp_path}/d1.json", "--decode", f"tp2={tmp_path}/d2.json",
                            "--tune", f"tp1={tmp_path}/t1.json", "--out", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["crossover_concurrency"] == {"tp1": None, "tp2": None}
    assert s["crossover_note"]["tp2"] == "not measured (no tune report)"
    assert s["tp2_vs_tp1_decode"] == pytest.approx(5 / 6) and s["replica_scaling"] is None
    assert tp_summary.main(["--decode", f"tp3={tmp_path}/d1.json", "--out", str(out)]) == 2


def test_scaling_refuses_several_loads_per_mode_and_duplicate_names():
    rows = [{"mode": "dynamic", "concurrency": c, "output_tok_per_s": 10, "trial_tok_per_s": [10]} for c in (4, 16)]
    one, two = {"env": {"replicas": 1}, "rows": rows}, {"env": {"replicas": 2}, "rows": rows}
    with pytest.raises(DynspecError, match="mode dynamic at more than one load"):
        tp_summary.replica_scaling(one, two)
    with pytest.raises(DynspecError, match=r"--decode tp1 is given twice \(a and b\)"):
        tp_summary._named(["tp1=a", "tp1=b"], "--decode")
