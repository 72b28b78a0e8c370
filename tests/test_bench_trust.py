"""Benchmarks users would trust and the GEMM floor: trial spreads and ties,
matched Poisson load, decode_rows / prefill_tokens, the suite's figures, gemm_floor_ms."""
import json
from types import SimpleNamespace as NS

import pytest

from dynspec.benchmarks import figures_profile, figures_sweep, summary
from dynspec.benchmarks.metrics import StepRecord, step_summary
from dynspec.benchmarks.report import markdown, verdict, write_all
from dynspec.benchmarks.sweep import make_parser
from dynspec.benchmarks.sweep_plan import LoadPoint, RequestCount
from dynspec.benchmarks.sweep_rows import matched_rate, trial_fields
from dynspec.errors import DynspecError


# ---- iteration stats --------------------------------------------------------------------------
def test_step_record_carries_decode_rows_and_prefill_tokens():
    st = NS(batch_size=3, k=2, drafted=4, accepted=3, seconds=0.01, host_seconds=0.0, decode_rows=2,
            prefill_tokens=40)
    rec = StepRecord.of(st)
    assert (rec.decode_rows, rec.prefill_tokens) == (2, 40)
    steps = [rec, StepRecord(2, 0, 0, 0, 0.01, 0.0, 2, 0), StepRecord(0, 0, 0, 0, 0.01, 0.0, 0, 64)]
    s = step_summary(steps)
    assert s["mixed_iterations"] == 1 and s["prefill_tokens"] == 104
    assert s["mean_decode_rows"] == pytest.approx(4 / 3)
    assert s["mean_k"] == 1.0 and s["mean_batch_size"] == 2.5                # the prompt-only iteration has no K
    assert s["k_by_batch"] == ((2, 0, 1), (3, 2, 1))


def test_steady_state_counts_only_full_iterations_per_replica():
    from dynspec.benchmarks.metrics import RequestTiming, RunRecord, steady_state, summarize

    # C=10 -> full means b >= 9: the ramp (b=3) and the drain (b=5, b=1) are left out
    steps = (StepRecord(3, 0, 0, 0, 0.010, 0.0, 3, 500), StepRecord(10, 2, 20, 12, 0.020, 0.0, 10, 0),
             StepRecord(9, 0, 0, 0, 0.010, 0.0, 9, 64), StepRecord(5, 0, 0, 0, 0.010, 0.0, 5, 0),
             StepRecord(1, 0, 0, 0, 0.008, 0.0, 1, 0))
    tps, share = steady_state(steps, 10)
    assert tps == pytest.approx((10 + 12 + 9) / 0.030) and share == pytest.approx(2 / 5)
    assert steady_state(steps[3:], 10) is None
    rec = RunRecord((RequestTiming(4, 30, 0.0, 0.01, 0.06),), steps, 0.0, 0.058)
    two = summarize([rec, rec], concurrency=10)
    assert two.steady_tok_per_s == pytest.approx(2 * tps)                  # replicas run side by side
    assert summarize([rec]).steady_tok_per_s is None                       # open loop: no C
    assert summarize([rec], concurrency=64).steady_fraction is None        # never that full


def test_sustained_counts_steps_that_end_before_the_last_submission():
    from dynspec.benchmarks.metrics import RequestTiming, RunRecord, StepRecord, summarize, sustained

    reqs = tuple(RequestTiming(4, 2, s, s + 0.5, s + 1.0) for s in (0.0, 0.0, 2.0))     # last submit at 2.0
    steps = tuple(StepRecord(2, 0, 0, 0, 1.0, 0.0, 2, 0, emitted=64, end_s=t) for t in (1.0, 2.0, 3.0))
    rec = RunRecord(reqs, steps, 0.0, 3.0)
    assert sustained(rec) == pytest.approx(128 / 2.0)                       # the step ending at 3.0 is drain
    assert summarize([rec, rec], concurrency=2).sustained_tok_per_s == pytest.approx(128.0)   # replicas add
    assert summarize([rec]).sustained_tok_per_s is None                      # open loop
    one_wave = RunRecord(tuple(RequestTiming(4, 2, 1e-6, 0.5, 1.0) for _ in range(2)), steps, 0.0, 3.0)
    assert sustained(one_wave) is None                                      # all submitted just after the start
    old = RunRecord(reqs, tuple(StepRecord(2, 0, 0, 0, 1.0, 0.0) for _ in range(3)), 0.0, 3.0)
    assert sustained(old) is None                                           # steps without end_s / emitted


def test_engine_idle_is_the_wall_time_outside_the_steps():
    from dynspec.benchmarks.metrics import RequestTiming, RunRecord, engine_idle, summarize

    reqs = (RequestTiming(4, 2, 0.0, 0.005, 0.016),)
    rec = RunRecord(reqs, (StepRecord(2, 0, 0, 0, 0.007, 0.0005), StepRecord(2, 0, 0, 0, 0.008, 0.0)), 0.0, 0.016)
    assert engine_idle([rec]) == pytest.approx(1 - 0.015 / 0.016)          # planning counts as idle too
    assert summarize([rec, rec]).engine_idle_fraction == pytest.approx(1 - 0.015 / 0.016)
    assert engine_idle([RunRecord(reqs, (), 0.0, 0.016)]) is None


def test_gpu_gaps_split_the_idle_between_steps_by_what_came_next():
    from dynspec.benchmarks.metrics import RequestTiming, RunRecord, gpu_gaps, summarize

    reqs = (RequestTiming(4, 2, 0.0, 0.005, 0.016),)
    steps = (StepRecord(0, 0, 0, 0, 0.004, 0.0, 0, 20, gpu_idle_s=None),         # the first: left out
             StepRecord(2, 0, 0, 0, 0.004, 0.0, 2, 0, gpu_idle_s=0.0005),
             StepRecord(2, 0, 0, 0, 0.004, 0.0, 2, 8, gpu_idle_s=0.0015))         # a chunk rode along
    rec = RunRecord(reqs, steps, 0.0, 0.016)
    assert gpu_gaps([rec]) == (pytest.approx(0.002 / 0.016), pytest.approx(0.75))
    m = summarize([rec])
    assert m.gpu_gap_fraction == pytest.approx(0.125) and m.engine_idle_fraction == pytest.approx(0.25)
    older = RunRecord(reqs, tuple(StepRecord(2, 0, 0, 0, 0.004, 0.0) for _ in range(2)), 0.0, 0.016)
    assert gpu_gaps([older]) == (None, None)                                # not reported: not 0
    idle_free = RunRecord(reqs, steps[:2] + (StepRecord(2, 0, 0, 0, 0.004, 0.0, 2, 0, gpu_idle_s=0.0),), 0.0, 0.016)
    assert gpu_gaps([idle_free])[1] == 0.0


def test_varied_vs_fixed_steady_ratio_and_older_sweeps_without_it():
    varied = [row("baseline", 64, 50, 49, 51, steady_tok_per_s=90.0)]
    fixed = [row("baseline", 64, 100, 99, 101, steady_tok_per_s=100.0), row("baseline", 256, 1, 1, 1)]
    assert figures_sweep.varied_vs_fixed(varied, fixed) == {"64": 0.5, "256": None}
    assert figures_sweep.varied_vs_fixed(varied, fixed, "steady_tok_per_s") == {"64": pytest.approx(0.9), "256": None}
    assert figures_sweep.varied_vs_fixed(varied, fixed, "steady_tok_per_s", "output_tok_per_s") == {
        "64": pytest.approx(0.9), "256": None}
    fixed[0]["output_tok_per_s"] = 80.0
    assert figures_sweep.varied_vs_fixed(varied, fixed, "steady_tok_per_s", "output_tok_per_s")["64"] == pytest.approx(90 / 80)


def test_floor_of_several_profiles_is_their_median_with_its_spread():
    runs = [{"command": f"profile --floor #{i}", "floor": {"gemm_floor_ms": 4.0, "decode_ms": d}}
            for i, d in enumerate((4.84, 4.80, 4.96))]
    fl = figures_profile.floor_trials(runs)
    assert fl["ratio"] == pytest.approx(1.21) and (fl["min"], fl["max"]) == pytest.approx((1.20, 1.24))
    assert fl["decode_ms"] == 4.84 and [t["command"] for t in fl["trials"]] == [r["command"] for r in runs]


# ---- trials, spreads, ties ----------------------------------------------------------------------
def row(mode, c, med, lo, hi, **kw):
    r = {"mode": mode, "concurrency": c, "request_rate": None, "matched_concurrency": None,
         "output_tok_per_s": med, "tok_per_s_min": lo, "tok_per_s_max": hi, "trials": 3,
         "trial_tok_per_s": [lo, med, hi], "p50_latency_s": 1.0, "p99_latency_s": 2.0, "ttft_s": 0.1,
         "p50_ttft_s": 0.08, "p99_ttft_s": 0.3, "tpot_s": 0.01, "mean_k": 0 if mode == "baseline" else 2,
         "mean_accepted_len": 1.0, "acceptance_rate": None, "host_overhead_fraction": 0.01,
         "k_by_batch": [[c or 1, 0, 5]]}
    r.update(kw)
    return r


def test_verdict_is_a_tie_when_spreads_overlap():
    assert verdict(row("dynamic", 1, 100, 95, 104), row("baseline", 1, 90, 86, 96)) == "tie"
    assert verdict(row("dynamic", 1, 100, 98, 104), row("baseline", 1, 90, 86, 96)) == "win"
    assert verdict(row("dynamic", 1, 80, 78, 85), row("baseline", 1, 90, 86, 96)) == "loss"


def test_trial_fields_report_median_run_and_spread():
    mets = [NS(output_tok_per_s=v, p99_ttft_s=0.1 * i, steady_tok_per_s=v + 5, sustained_tok_per_s=v - 5)
            for i, v in enumerate((90.0, 100.0, 95.0))]
    f = trial_fields(mets)
    assert f == {"trials": 3, "trial_tok_per_s": [90.0, 100.0, 95.0], "tok_per_s_min": 90.0,
                 "tok_per_s_max": 100.0, "trial_p99_ttft_s": [0.0, 0.1, 0.2],
                 "trial_steady_tok_per_s": [95.0, 105.0, 100.0], "trial_sustained_tok_per_s": [85.0, 95.0, 90.0]}


def test_matched_rate_is_the_median_trials_requests_per_second_per_replica():
    trials = [NS(output_tok_per_s=t, requests_per_s=r) for t, r in ((1, 10.0), (3, 12.0), (2, 11.0))]
    assert matched_rate(trials, 2) == pytest.approx(5.5)


def test_matched_poisson_point_has_the_closed_loops_request_count():
    count = RequestCount(None, waves=2.0, minimum=4)
    assert count.at(LoadPoint(request_rate=0.3, matched_concurrency=16)) == 32
    assert LoadPoint(request_rate=0.25, matched_concurrency=16).label == "rate=0.25/s (~C=16)"


def test_sweep_defaults_vary_lengths_and_run_three_trials():
    a = make_parser().parse_args(["--out", "x"])
    assert (a.input_len, a.output_len, a.trials) == ("64:192", "32:224", 3)


def test_poisson_at_must_be_a_swept_concurrency(tmp_path, capsys):
    from dynspec.benchmarks.sweep import main

    assert main(["--concurrency", "1,4", "--poisson-at", "8", "--out", str(tmp_path / "x")]) == 2
    assert "--poisson-at '8': C=8 is not one of --concurrency '1,4'" in capsys.readouterr().err
    assert main(["--engine", "trtllm", "--concurrency", "1,4", "--poisson-at", "4", "--out", str(tmp_path / "x")]) == 2
    assert "the TensorRT-LLM driver runs closed loops only" in capsys.readouterr().err


def regime_doc(cmd, rows):
    return {"env": {"name": "t", "device": "cpu", "acceptance_model": "bernoulli:0.5", "command": cmd,
                    "schedules": {"baseline": "", "static": "8:3", "dynamic": "4:3"}}, "rows": rows}


def test_report_labels_ties_and_poisson_rows(tmp_path):
    rows = [row("baseline", 4, 90, 86, 96), row("dynamic", 4, 100, 95, 104),
            row("baseline", None, 80, 79, 81, request_rate=0.5, matched_concurrency=4),
            row("dynamic", None, 99, 98, 100, request_rate=0.5, matched_concurrency=4)]
    doc = regime_doc("x", rows)
    md = markdown(doc)
    assert "| dynamic | C=4 | 100.0 | 95.0..104.0 | 1.11x (tie) |" in md
    assert "| dynamic | 0.5 req/s (Poisson, ~C=4) | 99.0 | 98.0..100.0 | 1.24x |" in md
    assert "| 80 | 300 | 10 |" in md                                 # TTFT p50 / p99, TPOT in ms
    assert "Under-full" not in md                                    # rows without steady stats
    rows[0].update(steady_fraction=0.78, steady_tok_per_s=8170.4)
    rows[1].update(steady_fraction=0.95, steady_tok_per_s=120.0)
    md = markdown(doc)
    assert "baseline C=4: 22% (8170 tok/s over the full ones)." in md
    assert "dynamic C=4" not in md.split("Under-full")[1]          # 5% under-full: not listed
    assert write_all(doc, tmp_path / "r")["png"].read_bytes()[:4] == b"\x89PNG"


# ---- the suite's figures ------------------------------------------------------------------------
def test_sweep_figures_pair_trials_and_take_the_better_rival():
    """dynamic [108, 110, 112] against baseline [98, 100, 103] and static [58, 60, 61] at C=64:
    per trial 108/98, 110/100, 112/103 -> median 1.1; at C=256 static is the better rival."""
    rows = []
    for c, (base, stat, dyn) in {64: ((100, 98, 103), (60, 58, 61), (110, 108, 112)),
                                 256: ((200, 190, 210), (220, 215, 225), (205, 200, 209))}.items():
        rows += [row("baseline", c, *base), row("static", c, *stat), row("dynamic", c, *dyn)]
    rows.append(row("baseline", None, 90, 88, 92, request_rate=1.5, matched_concurrency=64))   # open loop: left out
    fig = summary.sweep_figures(regime_doc("sweep B", rows))
    assert set(fig["by_concurrency"]) == {"64", "256"}
    e = fig["by_concurrency"]["64"]
    assert e["dynamic_vs_best"]["median"] == pytest.approx(1.1)
    assert (e["dynamic_vs_best"]["min"], e["dynamic_vs_best"]["max"]) == pytest.approx((112 / 103, 108 / 98))
    assert e["dynamic_vs_best"]["of_medians"] == pytest.approx(1.1) and e["dynamic_verdict"] == "win"
    assert e["static_vs_baseline"]["median"] == pytest.approx(61 / 103)          # of 58/98, 60/100, 61/103
    assert e["tok_per_s"]["dynamic"] == {"median": 110, "min": 108, "max": 112, "n": 3}
    e = fig["by_concurrency"]["256"]
    # per trial: 200 / max(190, 215), 205 / max(200, 220), 209 / max(210, 225) = 0.930, 0.932, 0.929
    assert e["dynamic_vs_best"]["median"] == pytest.approx(200 / 215) and e["dynamic_verdict"] == "loss"
    assert fig["crossover_concurrency"] == 64 and fig["commands"] == ["sweep B"]   # baseline 100 > static 60
    table = summary.sweep_table(fig)
    assert table["rows"][0][:4] == ["64", "100.0", "60.0", "110.0"]
    assert table["rows"][0][6] == "1.100 [1.087..1.102]"


def test_varied_fixed_figures_bound_the_ratio_by_both_spreads():
    varied = regime_doc("varied", [row("baseline", 64, 100, 99, 101), row("baseline", 256, 225, 220, 230)])
    fixed = regime_doc("fixed", [row("baseline", 64, 125, 120, 130), row("baseline", 256, 250, 240, 260)])
    fig = summary.varied_fixed_figures(varied, fixed)
    assert fig["by_concurrency"]["64"]["ratio"] == pytest.approx(0.8)
    assert (fig["by_concurrency"]["64"]["low"], fig["by_concurrency"]["64"]["high"]) == pytest.approx((99 / 130, 101 / 120))
    assert fig["by_concurrency"]["256"]["ratio"] == pytest.approx(0.9)
    assert fig["commands"] == ["varied", "fixed"]


def test_floor_figures_are_median_min_max_and_refuse_a_profile_without_a_floor():
    runs = [{"command": f"profile --floor #{i}", "floor": {"gemm_floor_ms": g, "decode_ms": d, "context_len": 1024,
                                                            "method": "cuda graph"}}
            for i, (g, d) in enumerate(((4.0, 4.84), (4.1, 4.80), (3.9, 4.96)))]
    fig = summary.floor_figures(runs)
    assert fig["decode_ms"] == {"median": 4.84, "min": 4.80, "max": 4.96, "n": 3}
    assert fig["floor_ms"]["median"] == 4.0
    assert fig["ratio"]["median"] == pytest.approx(1.21) and fig["ratio"]["max"] == pytest.approx(4.96 / 3.9)
    assert fig["context_len"] == 1024 and len(fig["commands"]) == 3
    with pytest.raises(DynspecError, match="has no 'floor'"):
        summary.floor_figures(runs + [{"command": "x"}])


def test_mixed_figures_take_every_mode_the_points_report():
    doc = {"context_len": 1024, "points": [{"point": "1:0:128", "eager_ms": 9.0, "full_ms": 5.0, "decode_ms": 4.0,
                                            "piecewise_ms": None, "trials_ms": {"eager": [9.0]}}]}
    fig = summary.mixed_figures(doc)
    assert fig["points"] == {"1:0:128": {"eager": 9.0, "full": 5.0, "decode": 4.0}}
    assert summary.mixed_table(fig)["rows"] == [["1:0:128", "4.000", "9.000", "5.000"]]


# ---- GEMM floor ---------------------------------------------------------------------------------
def test_gemm_floor_on_cpu_times_every_decode_gemm(tmp_path):
    import torch

    from dynspec.benchmarks.gemm_floor import gemm_floor_ms, target_gemm_weights
    from dynspec.runtime.engines.reference.load import load_target
    from tests.helpers_models import make_tiny_target

    d = make_tiny_target(tmp_path / "t", vocab=96, hidden=32, layers=3, heads=4, kv_heads=2)
    target = load_target(d, device="cpu", dtype=torch.float32)
    ws = target_gemm_weights(target)
    h = 32
    assert [tuple(w.shape) for w in ws[:4]] == [(h + 2 * 16, h), (h, h), (2 * target.config.intermediate_size, h),
                                                 (h, target.config.intermediate_size)]
    assert len(ws) == 3 * 4 + 1 and tuple(ws[-1].shape) == (96, h)
    ms, method = gemm_floor_ms(ws, warmup=1, repeats=5)
    assert ms > 0 and method.startswith("cpu eager (no CUDA graph), 13 GEMMs, 5 runs, median")
    with pytest.raises(DynspecError, match="no weight matrices"):
        gemm_floor_ms([])


# ---- the sweep end to end (world of one, random tiny pair) ----------------------------------------
@pytest.mark.timeout(120)
def test_sweep_trials_spread_and_matched_poisson(tmp_path):
    from dynspec.benchmarks import sweep
    from tests.helpers_models import make_tiny_draft, make_tiny_target

    target = make_tiny_target(tmp_path / "target", vocab=96, hidden=32, layers=3, heads=4, kv_heads=2)
    draft = make_tiny_draft(tmp_path / "draft", target)
    out = tmp_path / "res" / "trust"
    assert sweep.main(["--target", str(target), "--draft", str(draft), "--schedule", "1:2", "--concurrency", "1,2",
                       "--poisson-at", "2", "--modes", "baseline,dynamic", "--acceptance", "bernoulli:0.7",
                       "--input-len", "3:9", "--output-len", "2:10", "--num-requests", "4", "--no-progress",
                       "--warmup-requests", "0", "--out", str(out)]) == 0
    doc = json.loads((out.parent / "trust.json").read_text())
    assert doc["env"]["complete"] is True and doc["env"]["trials"] == 3 and doc["env"]["poisson_at"] == [2]
    rows = doc["rows"]
    closed = {(r["mode"], r["concurrency"]): r for r in rows if r["concurrency"] is not None}
    pois = {r["mode"]: r for r in rows if r["matched_concurrency"] == 2}
    assert set(closed) == {(m, c) for m in ("baseline", "dynamic") for c in (1, 2)} and set(pois) == {"baseline", "dynamic"}
    for r in rows:
        assert r["trials"] == 3 and len(r["trial_tok_per_s"]) == 3
        assert r["tok_per_s_min"] <= r["output_tok_per_s"] <= r["tok_per_s_max"]
        assert sorted(r["trial_tok_per_s"])[1] == r["output_tok_per_s"]          # the median trial's row
        assert 0 < r["p50_ttft_s"] <= r["p99_ttft_s"]
        assert r["num_requests"] == 4 and r["mean_decode_rows"] > 0
    # the open loop runs at the rate the baseline sustained in the closed loop at C=2 (median trial)
    base2 = closed[("baseline", 2)]
    assert pois["baseline"]["request_rate"] == pytest.approx(base2["requests_per_s"])
    assert pois["dynamic"]["request_rate"] == pois["baseline"]["request_rate"]
    lengths = {r["output_tokens"] for r in rows}
    assert len(lengths) >= 1 and all(8 <= n <= 40 for n in lengths)                # 4 requests of 2..10 tokens
    assert "(Poisson, ~C=2)" in (out.parent / "trust.md").read_text()


def test_reserved_rows_hold_blocks_while_timing_and_free_them():
    from dynspec.benchmarks.step_timing import reserved_rows

    class Paged:
        def __init__(self, slots):
            self.free, self.log = list(range(slots)), []

        def reserve(self, tokens, key=0):
            self.log.append(("reserve", tokens))
            return self.free.pop(0) if self.free else None

        def release(self, slot):
            self.log.append(("release", slot))
            self.free.append(slot)

    eng = Paged(3)
    with reserved_rows(eng, 2, 1029) as slots:
        assert slots == (0, 1) and eng.free == [2]
    assert sorted(eng.free) == [0, 1, 2] and eng.log == [("reserve", 1029)] * 2 + [("release", 0), ("release", 1)]
    with pytest.raises(DynspecError, match="no room for 4 rows of 9 tokens"):
        with reserved_rows(eng, 4, 9):
            pass
    assert sorted(eng.free) == [0, 1, 2]                                  # a failed reservation frees what it took
    with reserved_rows(NS(), 3, 9) as rows:                               # one fixed cache row per slot
        assert rows == (0, 1, 2)


def test_refills_ride_in_the_decode_iterations():
    """Varied output lengths finish at staggered iterations; each refill's prompt rides in the
    same iteration as the decode rows (inflight batching), and the step stats show both."""
    from dynspec.benchmarks.loadgen import closed_loop
    from dynspec.benchmarks.workload import BenchRequest
    from dynspec.runtime.serving.executor import Executor
    from dynspec.runtime.policy import DraftSchedule
    from tests.test_workload import FakeEngine

    reqs = [BenchRequest(i, (5, 6, 7), out) for i, out in enumerate((3, 9, 5, 7, 4, 8, 6, 2))]
    rec = closed_loop(Executor(FakeEngine(), DraftSchedule()), reqs, 3)
    assert sorted(r.output_len for r in rec.requests) == sorted(r.output_tokens for r in reqs)
    assert sum(s.prefill_tokens for s in rec.steps) == 3 * len(reqs)
    assert max(s.decode_rows for s in rec.steps) == 3
    mixed = [s for s in rec.steps if s.decode_rows > 0 and s.prefill_tokens > 0]
    assert mixed and step_summary(rec.steps)["mixed_iterations"] == len(mixed)


def test_unreported_iteration_mix_is_none_not_zero():
    """TRT-LLM entries without inflightBatchingStats give decode_rows/prefill_tokens None:
    the run's mix is unknown, not 0 (metrics used to raise TypeError on them)."""
    from dynspec.benchmarks.metrics import StepRecord, _iteration_mix

    known = [StepRecord(4, 2, 8, 5, 0.01, 0.0, 4, 0), StepRecord(4, 2, 8, 5, 0.01, 0.0, 3, 16)]
    assert _iteration_mix(known) == {"mean_decode_rows": 3.5, "prefill_tokens": 16, "mixed_iterations": 1}
    unknown = known + [StepRecord(4, 2, 8, 5, 0.01, 0.0, None, None)]
    assert _iteration_mix(unknown) == {"mean_decode_rows": None, "prefill_tokens": None, "mixed_iterations": None}


def test_mixed_step_times_each_point_and_refuses_bad_points(tmp_path, capsys):
    """benchmarks/mixed_step.py on the tiny pair (CPU: eager only, full_ms null)."""
    from dynspec.benchmarks import mixed_step

    out = tmp_path / "m.json"
    assert mixed_step.main(["--points", "1:0:8,3:2:5", "--context-len", "12", "--trials", "2", "--repeats", "2",
                            "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["point"], r["tokens"]) for r in doc["points"]] == [("1:0:8", 9), ("3:2:5", 14)]
    for r in doc["points"]:
        assert r["eager_ms"] > 0 and r["decode_ms"] > 0 and r["full_ms"] is None
        assert len(r["trials_ms"]["eager"]) == 2
    assert mixed_step.main(["--points", "4:1", "--out", str(out)]) == 2
    assert "is not b:K:chunk" in capsys.readouterr().err
    assert mixed_step.main(["--points", "2:0:9000", "--out", str(out)]) == 2
    assert "exceeds the target's max_position_embeddings 1024" in capsys.readouterr().err   # a 9000-token chunk
