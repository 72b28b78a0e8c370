"""Benchmark workloads, the load generator, metrics and reports: pure parts, with a fake engine."""
import json

import pytest

from dynspec.benchmarks import figures_common, summary
from dynspec.benchmarks.loadgen import closed_loop, open_loop, poisson_arrivals
from dynspec.benchmarks.metrics import RequestTiming, RunRecord, StepRecord, percentile, step_summary, summarize
from dynspec.benchmarks.report import markdown, out_paths, write_all
from dynspec.benchmarks.sweep_modes import mode_schedules, parse_modes, read_schedule_arg
from dynspec.benchmarks.sweep_plan import LoadPoint, parse_waves_at, RequestCount
from dynspec.benchmarks.workload import BenchRequest, LengthDist, check_fits, closed_loop_iterations, load_jsonl, synthetic, synthetic_lengths, take, write_jsonl
from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import Bernoulli
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.plan import StepResult
from dynspec.runtime.policy import DraftSchedule


# ---- JSONL ------------------------------------------------------------------------------
def write(tmp_path, lines, name="data.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_jsonl_trtllm_bench_format(tmp_path):
    p = write(tmp_path, [
        json.dumps({"task_id": 0, "input_ids": [5, 6, 7], "output_tokens": 4}),
        "",
        json.dumps({"task_id": "b", "prompt": "hi there", "output_tokens": 2, "logits": None}),
    ])
    reqs = load_jsonl(p, tokenizer=lambda s: [len(w) for w in s.split()])
    assert reqs == (BenchRequest(0, (5, 6, 7), 4), BenchRequest("b", (2, 5), 2))
    out = tmp_path / "round.jsonl"
    write_jsonl(out, reqs[:1])
    assert load_jsonl(out) == reqs[:1]


@pytest.mark.parametrize("line,msg", [
    ('{"task_id": 1, "input_ids": [1, 2], "output_tokens": 3', "not valid JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"input_ids": [1], "output_tokens": 3}', "missing field 'task_id'"),
    ('{"task_id": 1, "input_ids": [1]}', "missing field 'output_tokens'"),
    ('{"task_id": 1, "input_ids": [1], "output_tokens": 0}', "'output_tokens' must be a positive integer, got 0"),
    ('{"task_id": 1, "output_tokens": 3}', "exactly one of 'input_ids' and 'prompt'"),
    ('{"task_id": 1, "input_ids": [1, -4], "output_tokens": 3}', r"'input_ids'\[1\] = -4"),
    ('{"task_id": 1, "input_ids": [], "output_tokens": 3}', "non-empty list"),
    ('{"task_id": 1, "prompt": "x", "output_tokens": 3}', "needs a tokenizer"),
    ('{"task_id": 0, "input_ids": [1], "output_tokens": 3}', "duplicate task_id 0 \\(first on line 1\\)"),
])
def test_jsonl_bad_lines_name_file_and_line(tmp_path, line, msg):
    p = write(tmp_path, [json.dumps({"task_id": 0, "input_ids": [9], "output_tokens": 1}), line])
    with pytest.raises(DynspecError, match=msg) as e:
        load_jsonl(p)
    assert f"{p}:2:" in str(e.value)


def test_jsonl_missing_and_empty(tmp_path):
    with pytest.raises(DynspecError, match="does not exist"):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(DynspecError, match="holds no requests"):
        load_jsonl(write(tmp_path, [""]))


# ---- synthetic ----------------------------------------------------------------------------
def test_length_dist_parse():
    assert LengthDist.parse("128") == LengthDist(128, 128)
    assert LengthDist.parse(" 64 : 192 ") == LengthDist(64, 192)
    assert str(LengthDist.parse("64:192")) == "64:192"
    for bad in ("0", "abc", "9:3", "-1"):
        with pytest.raises(DynspecError, match="--input-len"):
            LengthDist.parse(bad, "--input-len")


def test_synthetic_is_seeded_and_in_range():
    a = synthetic(20, LengthDist(3, 9), LengthDist(5, 5), vocab_size=50, seed=7)
    b = synthetic(20, LengthDist(3, 9), LengthDist(5, 5), vocab_size=50, seed=7)
    c = synthetic(20, LengthDist(3, 9), LengthDist(5, 5), vocab_size=50, seed=8)
    assert a == b and a != c
    assert all(3 <= r.input_len <= 9 and r.output_tokens == 5 and max(r.input_ids) < 50 for r in a)
    assert len({r.input_len for r in a}) > 1
    assert [r.task_id for r in a] == list(range(20))


def ticked_closed_loop(outs, c, lag):
    """The closed loop iteration by iteration: every row emits a token; a row done after iteration
    t frees its slot for the next request from iteration t + 1 + lag."""
    queue, rows, t = list(outs), {}, 0            # rows: slot -> [tokens left, free from]
    for s in range(c):
        rows[s] = [0, 0]
    while queue or any(left for left, _ in rows.values()):
        for r in rows.values():
            if r[0] == 0 and queue and t >= r[1]:
                r[0] = queue.pop(0)
        for r in rows.values():
            if r[0]:
                r[0] -= 1
                if r[0] == 0:
                    r[1] = t + 1 + lag
        t += 1
    return t


def test_closed_loop_iterations_worked_examples_and_a_ticked_loop():
    assert closed_loop_iterations((3, 1, 2), 2) == 3 and closed_loop_iterations((3, 1, 2), 2, lag=1) == 4
    assert closed_loop_iterations([128] * 384, 64) == 768 and closed_loop_iterations([128] * 384, 64, lag=1) == 773
    _, outs, _ = synthetic_lengths(200, LengthDist(4, 8), LengthDist(1, 40), seed=3)
    for c in (1, 3, 16, 300):
        for lag in (0, 1, 2):
            assert closed_loop_iterations(outs, c, lag) == ticked_closed_loop(outs, c, lag), (c, lag)
    with pytest.raises(DynspecError, match="concurrency 0 must be at least 1"):
        closed_loop_iterations((1,), 0)


def test_synthetic_lengths_are_the_workloads_lengths():
    ins, outs, _ = synthetic_lengths(20, LengthDist(3, 9), LengthDist(2, 6), seed=7)
    reqs = synthetic(20, LengthDist(3, 9), LengthDist(2, 6), vocab_size=50, seed=7)
    assert [r.input_len for r in reqs] == list(ins) and [r.output_tokens for r in reqs] == list(outs)


def test_take_shards_and_cycles():
    reqs = synthetic(6, LengthDist(2, 2), LengthDist(1, 1), 10)
    assert [r.task_id for r in take(reqs, 3, 0)] == [0, 1, 2]
    assert [r.task_id for r in take(reqs, 3, 3)] == [3, 4, 5]
    assert [r.task_id for r in take(reqs, 4, 4)] == [4, 5, 0, 1]


def test_check_fits_names_the_task():
    reqs = (BenchRequest("t9", (1, 2, 3), 10),)
    check_fits(reqs, max_seq_len=3 + 10 + 4 + 1, max_draft_len=4, vocab_size=8)
    with pytest.raises(DynspecError, match="task 't9' needs 3 prompt \\+ 10 output \\+ 5 verify slack = 18"):
        check_fits(reqs, max_seq_len=17, max_draft_len=4, vocab_size=8)
    with pytest.raises(DynspecError, match="token id 3 >= vocab size 3"):
        check_fits(reqs, max_seq_len=100, max_draft_len=4, vocab_size=3)


# ---- metrics ------------------------------------------------------------------------------
def test_step_summary_worked_example():
    steps = [StepRecord(2, 3, 6, 4, 0.010, 0.0001), StepRecord(2, 0, 0, 0, 0.010, 0.0001)]
    s = step_summary(steps)
    assert s["mean_k"] == 1.5
    assert s["acceptance_rate"] == pytest.approx(4 / 6)
    assert s["mean_accepted_len"] == pytest.approx((4 + 4) / 4)
    assert s["host_overhead_fraction"] == pytest.approx(0.01)
    assert s["k_by_batch"] == ((2, 0, 1), (2, 3, 1))
    base = step_summary([StepRecord(3, 0, 0, 0, 0.01, 0.0)])
    assert base["mean_k"] == 0 and base["acceptance_rate"] is None and base["mean_accepted_len"] == 1.0


def test_summarize_merges_replicas():
    r0 = RunRecord((RequestTiming(4, 10, 0.0, 0.5, 2.0), RequestTiming(4, 1, 0.0, 1.0, 1.0)),
                   (StepRecord(2, 2, 4, 4, 0.1, 0.0),), 0.0, 2.0)
    r1 = RunRecord((RequestTiming(4, 10, 0.0, 0.2, 4.0),), (StepRecord(1, 2, 2, 0, 0.1, 0.0),), 0.0, 4.0)
    m = summarize([r0, r1])
    assert m.replicas == 2 and m.num_requests == 3 and m.output_tokens == 21
    assert m.duration_s == 4.0 and m.output_tok_per_s == pytest.approx(21 / 4)
    assert m.per_replica_tok_per_s == pytest.approx((11 / 2, 10 / 4))
    assert m.p50_latency_s == 2.0
    assert m.ttft_s == pytest.approx((0.5 + 1.0 + 0.2) / 3)
    assert m.tpot_s == pytest.approx((1.5 / 9 + 3.8 / 9) / 2)         # the 1-token request has no TPOT
    assert m.mean_accepted_len == pytest.approx((4 + 3) / 3)
    json.dumps(m.to_json())
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([], 50) is None


# ---- load generator with a fake engine -------------------------------------------------------
class FakeEngine:
    """Protocol-complete stand-in: every draft is accepted, tokens count up, slots never run out."""

    max_seq_len, max_draft_len, vocab_size, max_num_tokens, max_reservation = 10_000, 4, 1000, 8192, 10_000
    async_launch = False                   # launch runs the step (runtime/serving/plan.py's Engine protocol)

    def __init__(self, max_batch_size=64):
        self.max_batch_size = max_batch_size
        self.buckets = tuple(range(1, max_batch_size + 1))
        self.plans = []
        self.free = list(range(max_batch_size))

    def reserve(self, tokens, key=0):
        return self.free.pop(0) if self.free else None

    def release(self, slot):
        self.free.append(slot)

    def step(self, plan, acceptance):
        self.plans.append(plan)
        return StepResult(accepted=(plan.k,) * plan.batch_size,
                          emitted=tuple(tuple(range(plan.k + 1)) for _ in range(plan.batch_size)), draft_warm=True,
                          first_tokens=tuple(1 if c.last else None for c in plan.chunks))

    def launch(self, plan, acceptance):
        return plan, acceptance            # the handle: what result runs

    def result(self, handle):
        return self.step(*handle)


def test_closed_loop_keeps_c_in_flight():
    eng = FakeEngine()
    ex = Executor(eng, DraftSchedule.threshold(2, 3))
    reqs = [BenchRequest(i, (5, 6), 7) for i in range(10)]
    done = []
    rec = closed_loop(ex, reqs, 4, progress=done.append)
    assert len(rec.requests) == 10 and sum(done) == 10
    assert all(r.output_len == 7 for r in rec.requests)
    bs = [s.batch_size for s in rec.steps]
    assert max(bs) == 4
    assert (rec.steps[0].decode_rows, rec.steps[0].prefill_tokens) == (0, 8)    # 4 prompts of 2 tokens ride first
    assert sum(s.prefill_tokens for s in rec.steps) == 20
    # batch 4 > threshold 3 -> K=0 for full batches; the drain speculates again
    assert all(s.k == (2 if 1 <= s.batch_size <= 3 else 0) for s in rec.steps)
    assert rec.duration_s > 0


def test_closed_loop_refuses_nonsense():
    with pytest.raises(ValueError, match="concurrency"):
        closed_loop(Executor(FakeEngine(), DraftSchedule()), [], 0)


def test_open_loop_uses_scheduled_arrivals():
    t = [0.0]
    clock = lambda: t[0]                       # noqa: E731

    def sleep(dt):
        t[0] += dt

    eng = FakeEngine()
    ex = Executor(eng, DraftSchedule(), clock=clock)
    orig = eng.step

    def slow_step(plan, acc):                  # every iteration takes 10 ms of fake time
        t[0] += 0.01
        return orig(plan, acc)

    eng.step = slow_step
    reqs = [BenchRequest(i, (5,), 3) for i in range(5)]
    rec = open_loop(ex, reqs, rate=2.0, seed=3, clock=clock, sleep=sleep)
    arr = poisson_arrivals(5, 2.0, seed=3)
    assert sorted(r.submit_s for r in rec.requests) == pytest.approx(sorted(arr))
    assert all(r.latency_s >= 0.02 - 1e-9 for r in rec.requests)        # 2 decode steps after prefill
    assert len(rec.requests) == 5


# ---- sweep pieces --------------------------------------------------------------------------
def test_mode_schedules():
    dyn = DraftSchedule.parse("4:4,8:2")
    s = mode_schedules(("baseline", "static", "dynamic"), dyn, None, 64)
    assert s["baseline"] == DraftSchedule() and s["dynamic"] == dyn
    assert s["static"].draft_len(64) == 4 and s["static"].draft_len(1) == 4
    assert mode_schedules(("static",), dyn, 2, 64)["static"].draft_len(30) == 2
    with pytest.raises(DynspecError, match="--static-k"):
        mode_schedules(("static",), DraftSchedule(), None, 64)
    with pytest.raises(DynspecError, match="unknown mode"):
        parse_modes("baseline,turbo")
    assert RequestCount().at(LoadPoint(concurrency=16)) == 32
    assert RequestCount().at(LoadPoint(concurrency=1)) == 4
    assert RequestCount(waves=1.5, minimum=1).at(LoadPoint(concurrency=3)) == 5
    assert RequestCount(fixed=3).at(LoadPoint(concurrency=64)) == 3
    assert RequestCount().at(LoadPoint(request_rate=2.0)) == 40


def test_waves_at_some_concurrencies():
    # one process for regime B: C=1..64 one wave, C=256 three, and the Poisson point at C=64
    count = RequestCount(waves=1, minimum=2, waves_at=parse_waves_at("256:3", (1, 4, 16, 64, 256)))
    assert [count.at(LoadPoint(concurrency=c)) for c in (1, 4, 16, 64, 256)] == [2, 4, 16, 64, 768]
    assert count.at(LoadPoint(concurrency=64, matched_concurrency=64)) == 64
    assert count.at(LoadPoint(request_rate=2.0)) == 20                # open loop: ~10 s a wave, unchanged
    assert str(count) == "max(2, ceil(1 x C), 3 at C=256)"
    assert parse_waves_at("64:2, 16:0.5", (16, 64)) == ((16, 0.5), (64, 2.0))
    assert parse_waves_at(None, (1,)) == ()
    for spec, msg in (("256", "'256' is not C:WAVES"), ("256:0", "'256:0' is not C:WAVES"),
                      ("x:3", "'x:3' is not C:WAVES"), ("128:3", "C=128 is not one of --concurrency"),
                      ("64:2,64:3", "C=64 given twice")):
        with pytest.raises(DynspecError, match=msg):
            parse_waves_at(spec, (16, 64, 256))


def test_schedule_file_argument(tmp_path):
    p = tmp_path / "schedule.txt"
    p.write_text("16:3,64:1\n")
    assert read_schedule_arg(f"@{p}") == DraftSchedule.parse("16:3,64:1")
    with pytest.raises(DynspecError, match="does not exist"):
        read_schedule_arg(f"@{tmp_path}/none.txt")


# ---- report + summary ------------------------------------------------------------------------
def fake_doc(tps):
    """tps: {mode: {C: tok/s}}"""
    rows = []
    for mode, by_c in tps.items():
        for c, v in by_c.items():
            k = {"baseline": 0, "static": 3}.get(mode, 3 if c <= 4 else 0)
            rows.append({"mode": mode, "concurrency": c, "request_rate": None, "output_tok_per_s": v,
                         "p50_latency_s": 1.0, "p99_latency_s": 2.0, "ttft_s": 0.1, "tpot_s": 0.01,
                         "mean_k": k, "mean_accepted_len": 1 + 0.5 * k, "acceptance_rate": 0.5 if k else None,
                         "host_overhead_fraction": 0.01, "k_by_batch": [[c, k, 10]]})
    return {"env": {"name": "t", "device": "cpu", "acceptance_model": "bernoulli:0.7", "command": "x",
                    "schedules": {"baseline": "", "static": "8:3", "dynamic": "4:3"}}, "rows": rows}


def test_summary_figures():
    doc = fake_doc({"baseline": {1: 10, 2: 20, 4: 40, 8: 80}, "static": {1: 20, 2: 30, 4: 35, 8: 50},
                    "dynamic": {1: 19, 2: 33, 4: 41, 8: 79}})
    rows = doc["rows"]
    assert figures_common.crossover_concurrency(rows) == 4
    r = figures_common.dynamic_ratio_by_concurrency(rows)
    assert r == pytest.approx({"1": 0.95, "2": 1.1, "4": 41 / 40, "8": 79 / 80})
    fig = summary.sweep_figures(doc)
    assert {c: e["dynamic_vs_best"]["of_medians"] for c, e in fig["by_concurrency"].items()} == pytest.approx(r)
    assert fig["by_concurrency"]["1"]["dynamic_vs_baseline"]["median"] == pytest.approx(1.9)
    assert fig["by_concurrency"]["1"]["acceptance"]["static"]["acceptance_rate"] == 0.5
    assert fig["crossover_concurrency"] == 4
    assert figures_common.crossover_concurrency(fake_doc({"baseline": {1: 1}, "static": {1: 2}})["rows"]) is None


def test_report_files(tmp_path):
    doc = fake_doc({"baseline": {1: 10, 4: 40}, "static": {1: 20, 4: 35}, "dynamic": {1: 19, 4: 41}})
    paths = write_all(doc, tmp_path / "res" / "NAME")
    assert paths == out_paths(tmp_path / "res" / "NAME.json")
    assert json.loads(paths["json"].read_text()) == doc
    md = paths["md"].read_text()
    assert "| dynamic | C=4 | 41.0 | - | 1.02x |" in md and "C=4" in md.split("crossover")[-1]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bernoulli:0.7" in markdown(doc)


def test_bernoulli_is_refused_outside_benchmarks():
    with pytest.raises(DynspecError, match="only benchmarks"):
        Executor(FakeEngine(), DraftSchedule(), acceptance=Bernoulli(0.7))


def test_median_trial():
    from types import SimpleNamespace as NS

    from dynspec.benchmarks.sweep_rows import median_trial

    mets = [NS(output_tok_per_s=v) for v in (5.0, 1.0, 9.0, 3.0)]
    assert median_trial(mets).output_tok_per_s == 3.0
    assert median_trial(mets[:3]).output_tok_per_s == 5.0
