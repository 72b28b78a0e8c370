"""`dynspec generate`'s inputs and report: a prompt file's token ids must be integers (JSON
booleans are refused with the file, line, field and index), and the K-per-batch-size report
leaves out iterations that carried prompt chunks only (b=0 chose no K)."""
import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.driver import read_prompts


@pytest.mark.parametrize("value", ["true", "false"])
def test_read_prompts_refuses_boolean_token_ids(tmp_path, value):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "input_ids": [3, 4]}\n' f'{{"id": "b", "input_ids": [5, {value}, 6]}}\n')
    with pytest.raises(DynspecError) as e:
        read_prompts(f, None)
    assert str(e.value) == (f"{f}:2: field 'input_ids' holds {value} at index 1; "
                            "token ids are integers, not booleans")


def test_read_prompts_keeps_integer_ids(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "input_ids": [0, 1, 7]}\n')
    assert [(p.id, p.input_ids) for p in read_prompts(f, None)] == [("a", (0, 1, 7))]


def test_generate_report_leaves_prompt_only_iterations_out_of_k_per_batch():
    """An iteration that only carried prompt chunks (b=0) chose no K; the report must not show b=0."""
    from dynspec.runtime.generate_report import summarize
    from dynspec.runtime.executor import IterationStats, RequestResult

    stats = [IterationStats(0, 0, 0, 0, 0, 0, 0.01, 0.0, decode_rows=0, prefill_tokens=9),
             IterationStats(1, 2, 4, 8, 5, 7, 0.01, 0.0, decode_rows=2, prefill_tokens=0)]
    results = [RequestResult(0, 5, (1, 2, 3), "length", 0.0, 0.1, 0.5)]
    assert summarize(stats, results)["k_by_batch_size"] == {2: [4]}


# ---- the header line, progress, trials ------------------------------------------------------------
import json  # noqa: E402
import re  # noqa: E402

from dynspec.cli import main  # noqa: E402
from dynspec.runtime.policy import DraftSchedule  # noqa: E402

SMALL = ["--num-prompts", "4", "--max-new-tokens", "8", "--trials", "1"]


def adaptive(*ks: int):
    """An AdaptivePolicy whose candidates are ks (a synthetic cost model profiling those K)."""
    from dynspec.runtime.adaptive import AdaptivePolicy
    from dynspec.runtime.cost_model import CostModel

    row = tuple(10.0 + k for k in ks)
    return AdaptivePolicy(CostModel("synthetic", (64,), (1, 16), tuple(ks), None, ((row, row),)))


def test_schedule_and_policy_in_words():
    from dynspec.runtime.driver import describe_policy, describe_schedule

    assert describe_schedule(DraftSchedule.parse("4:4,8:2")) == "4:4,8:2 (K=4 for b<=4, K=2 for b<=8, K=0 above)"
    assert describe_schedule(DraftSchedule()) == "none (K=0 at every batch size)"
    assert describe_policy(DraftSchedule.parse("4:4")) == "schedule"
    assert describe_policy(adaptive(0, 1, 2, 3), "c.json") == "adaptive (cost model c.json, K 0..3)"
    assert describe_policy(adaptive(0, 2, 4), "c.json") == "adaptive (cost model c.json, K 0,2,4)"


def test_served_model_logs_schedule_and_policy_in_one_line():
    """model.py logs serving.policy_line once at load: engine.json's schedule and what decides K."""
    from types import SimpleNamespace

    from dynspec.triton_repo.serving import policy_line

    cfg = SimpleNamespace(schedule=DraftSchedule.parse("4:4"), cost_model="/e/cost_model.json")
    assert policy_line(cfg, cfg.schedule) == "schedule 4:4 (K=4 for b<=4, K=0 above); policy: schedule"
    assert policy_line(cfg, adaptive(0, 1, 2, 3, 4)) == ("schedule 4:4 (K=4 for b<=4, K=0 above) bounds K; "
                                                         "policy: adaptive (cost model /e/cost_model.json, K 0..4)")


def test_header_names_the_given_schedule_and_no_progress_hides_the_bars(capsys):
    assert main(["generate", "--schedule", "2:4", "--concurrency", "3", *SMALL, "--no-progress"]) == 0
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    assert lines[0] == "schedule 2:4  concurrency 3  (K=4 for b<=2, K=0 above); policy: schedule (--schedule)"
    assert sum("schedule" in ln for ln in lines) == 1                 # once, at start
    assert "it/s" not in cap.err and "%|" not in cap.err
    assert main(["generate", "--schedule", "2:4", "--concurrency", "3", *SMALL]) == 0
    assert "dynamic" in capsys.readouterr().err                       # the bars, without --no-progress


def test_the_embedded_pair_is_tuned_where_it_runs(capsys):
    """No --schedule on the embedded pair: profile + tune on this machine at start; the header says
    from what, and the schedule's K never exceeds the static mode's."""
    assert main(["generate", "--modes", "baseline,static,dynamic", "--concurrency", "4", *SMALL,
                 "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    m = re.fullmatch(r"schedule (.+?)  concurrency 4  \((.*)\); policy: schedule \(tuned here in [\d.]+ s: "
                     r"acceptance per draft position ([\d., ]+) on 4 prompts, iteration ms of b=1,2,4 x K=0\.\.4 "
                     r"at context \d+ \+ [\d.]+ ms executor time, `dynspec tune` rule\)", out[0])
    assert m, out[0]
    sched = DraftSchedule.parse(m.group(1)) if m.group(1) != "(no speculation)" else DraftSchedule()
    assert sched.max_draft_len <= 4 and len(m.group(3).split(", ")) == 4
    assert out[-1].startswith("dynamic / max(baseline, static): ")


def test_header_names_the_adaptive_cost_model(tmp_path, capsys):
    from dynspec.runtime.cost_model import ContextTable, Profile

    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(Profile("synthetic", (ContextTable(
        64, {1: {0: 10.0, 1: 11.0, 2: 12.0}, 4: {0: 10.0, 1: 11.5, 2: 13.0}}),)).to_json()))
    assert main(["generate", "--modes", "adaptive", "--cost-model", str(cost), "--concurrency", "2", *SMALL,
                 "--no-progress"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(f"policy: adaptive (cost model {cost}, K 0..2)"), first


def test_trials_below_one_are_refused(capsys):
    assert main(["generate", "--trials", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "dynspec generate: error: --trials=0 must be at least 1"


def test_report_gives_the_median_trial_and_the_trial_by_trial_ratio():
    from dynspec.runtime.generate_report import format_report

    row = {"k_by_batch_size": {8: [4]}, "mean_accepted_len": 3.0, "tokens": 96, "iterations": 9}
    report = {"baseline": dict(row, tok_per_s=0, trials_tok_per_s=[100.0, 90.0, 110.0]),
              "static": dict(row, tok_per_s=0, trials_tok_per_s=[200.0, 150.0, 210.0]),
              "dynamic": dict(row, tok_per_s=0, trials_tok_per_s=[190.0, 160.0, 220.0])}
    text = format_report(report).splitlines()
    assert text[2].startswith("  static:    200.0 tok/s [150.0..210.0, 3 trials]  96 tokens in 9 iterations")
    assert text[-1] == "dynamic / max(baseline, static): 1.048 (median of per-trial ratios 0.950, 1.067, 1.048)"


def test_no_keep_warm_command_reaches_k0(capsys):
    """The keep-warm demonstration: prompt chunks of 48 tokens stagger the 5 rows, so K=4 runs at
    b <= 4 before and after the K=0 stretch at b=5."""
    for flag in ([], ["--no-keep-warm"]):
        assert main(["generate", "--schedule", "4:4", "--concurrency", "5", "--num-prompts", "5",
                     "--max-num-tokens", "48", "--trials", "1", "--no-progress", *flag]) == 0
        ks = capsys.readouterr().out.splitlines()[-1]
        assert "b=5:K=0" in ks and "b=4:K=4" in ks, ks


def test_launcher_flags_are_spelled_in_full():
    from dynspec.triton_repo import launch, server

    with pytest.raises(SystemExit):
        server.make_parser().parse_args(["repo", "--http-p", "9000"])
    args = launch.make_parser().parse_args(["repo", "--tp", "2", "--http-port", "9000"])
    assert (args.tp, args.http_port, args.grpc_port) == (2, 9000, 8001)
