"""`dynspec generate`'s inputs and report: a prompt file's token ids must be integers (JSON
booleans are refused with the file, line, field and index), and the K-per-batch-size report
leaves out iterations that carried prompt chunks only (b=0 chose no K)."""
import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.serving.driver import read_prompts


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
    from dynspec.runtime.generate.generate_report import summarize
    from dynspec.runtime.serving.executor import IterationStats, RequestResult

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
    from dynspec.runtime.policy.adaptive import AdaptivePolicy
    from dynspec.runtime.policy.cost_model import CostModel

    row = tuple(10.0 + k for k in ks)
    return AdaptivePolicy(CostModel("synthetic", (64,), (1, 16), tuple(ks), None, ((row, row),)))


def test_schedule_and_policy_in_words():
    from dynspec.runtime.serving.driver import describe_policy, describe_schedule

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
    """No --schedule on the embedded pair: each load served at every K on this machine at start, then
    the tune rule; the header says the served tok/s it was tuned from, and the schedule's K never
    exceeds the static mode's."""
    assert main(["generate", "--modes", "baseline,static,dynamic", "--concurrency", "1,4", *SMALL,
                 "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    m = re.fullmatch(r"schedule (.+?)  concurrency 1,4  \((.*)\); policy: schedule \(tuned here in [\d.]+ s: "
                     r"each load served at K=0\.\.4, (CPU|wall) tok/s C=1( \d+){5}; C=4( \d+){5}; acceptance per draft "
                     r"position ([\d., ]+); `dynspec tune` rule, K > 0 where it serves >= 1\.10x K=0\)", out[0])
    assert m, out[0]
    sched = DraftSchedule.parse(m.group(1)) if m.group(1) != "(no speculation)" else DraftSchedule()
    assert sched.max_draft_len <= 4 and len(m.group(6).split(", ")) == 4
    assert out[-1].startswith("verdict: C=1 static K=4 ")


def test_header_names_the_adaptive_cost_model(tmp_path, capsys):
    from dynspec.runtime.policy.cost_model import ContextTable, Profile

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


def stats_row(b: int, k: int, end_s: float, prefill: int = 0):
    from dynspec.runtime.serving.executor import IterationStats

    return IterationStats(0, b, k, b * k, 0, b, 0.01, 0.0, decode_rows=b, prefill_tokens=prefill, end_s=end_s)


def test_each_iteration_counts_at_its_fastest_trial():
    """Trial 1 slow at iteration 0, trial 2 slow at iteration 1: the figure takes 1 s + 2 s, not a
    trial's total; trials that ran different iterations have no such figure."""
    from dynspec.runtime.generate.generate_report import fastest_seconds

    t1 = [stats_row(2, 4, 10.0 + 5.0), stats_row(2, 4, 10.0 + 5.0 + 2.0)]
    t2 = [stats_row(2, 4, 20.0 + 1.0), stats_row(2, 4, 20.0 + 1.0 + 9.0)]
    assert fastest_seconds([(t1, 10.0), (t2, 20.0)]) == pytest.approx(3.0)
    other = [stats_row(2, 3, 31.0), stats_row(2, 3, 33.0)]
    assert fastest_seconds([(t1, 10.0), (other, 30.0)]) is None


def figures(tps: float, k: int = 0) -> dict:
    return {"fastest": tps, "trials_tok_per_s": [tps], "k_by_batch_size": {1: [k]}, "mean_accepted_len": 0.0,
            "tokens_per_step": 1.0, "mixed": 0.0, "tokens": 10, "iterations": 10}


def test_the_verdict_says_where_speculation_pays_and_what_dynamic_did():
    from dynspec.runtime.generate.generate_report import verdict

    low = {"baseline": figures(100.0), "static": figures(135.0, 4), "dynamic": figures(134.0, 4)}
    high = {"baseline": figures(100.0), "static": figures(92.0, 4), "dynamic": figures(93.0, 4)}
    assert verdict({1: low, 16: high}, {1: 4, 16: 4}, 4) == (
        "verdict: C=1 static K=4 pays and dynamic speculates; C=16 static K=4 does not pay but dynamic "
        "speculates: K follows the mission at 1 of 2 loads")
    assert verdict({1: low, 16: high}, {1: 4, 16: 0}, 4).endswith(
        "C=16 static K=4 does not pay and dynamic turns K off: K follows the mission at 2 of 2 loads")
    assert verdict({1: high, 16: high}, {1: 0, 16: 0}, 4).endswith("at 2 of 2 loads")   # 0.92: does not pay
    assert verdict({1: {"baseline": figures(1.0)}}, {1: 0}, 4) is None


def test_the_text_line_names_a_prompt_whose_text_differs():
    from dynspec.runtime.generate.generate_report import text_line

    same = {(1, "baseline", 0): [(1, 2), (3,)], (1, "static", 0): [(1, 2), (3,)]}
    assert text_line(same) == "text: identical in every mode, load and trial (2 prompts; 2 modes x 1 loads x 1 trials)"
    other = {**same, (4, "static", 1): [(1, 2), (4,)]}
    assert text_line(other).startswith("text: NOT identical: 1 of 2 prompts differ (first: prompt 1;")


def test_two_loads_on_one_screen(capsys):
    """Per load a block of every mode, then the text line and the verdict, and nothing else."""
    assert main(["generate", "--modes", "baseline,static,dynamic", "--concurrency", "1,4", "--num-prompts", "4",
                 "--max-new-tokens", "12", "--trials", "2", "--schedule", "2:4", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("schedule 2:4  concurrency 1,4  (K=4 for b<=2, K=0 above)")
    assert out[1] == "C=1: 4 prompts x 12 new tokens, 2 interleaved trials" and out[6].startswith("C=4: 4 prompts")
    assert [ln.split(":")[0].strip() for ln in out[2:5]] == ["baseline", "static", "dynamic"]
    assert "b=1:K=0" in out[2] and "b=1:K=4" in out[3] and re.search(r"b=4:K=0", out[9]), out
    assert out[-2] == "text: identical in every mode, load and trial (4 prompts; 3 modes x 2 loads x 2 trials)"
    assert re.fullmatch(r"verdict: C=1 static K=4 (pays|does not pay) (and|but) dynamic speculates; C=4 static K=4 "
                        r"(pays|does not pay) (and|but) dynamic turns K off: K follows the mission at [0-2] of 2 loads",
                        out[-1]), out[-1]
    assert len(out) == 14


def period(ids, span: int = 32, longest: int = 16) -> int:
    """The shortest cycle (<= longest tokens) that the last `span` tokens repeat; 0: none."""
    return next((p for p in range(1, longest + 1) if all(ids[i] == ids[i - p] for i in range(len(ids) - span, len(ids)))),
                0)


def test_the_embedded_pair_writes_on_its_built_in_prompts(tmp_path, capsys):
    """Every built-in prompt: 64 greedy tokens of 16 or more distinct tokens that end in no short loop."""
    out = tmp_path / "o.jsonl"
    assert main(["generate", "--modes", "baseline", "--concurrency", "16", "--num-prompts", "96", "--trials", "1",
                 "--no-progress", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 96
    for r in rows:
        ids = r["output_ids"]
        assert len(ids) == 64 and len(set(ids)) >= 16 and period(ids) == 0, (r["id"], r["text"])


def test_ctrl_c_ends_generate_with_one_line_and_status_130():
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "dynspec.cli", "generate", "--modes", "baseline",
                             "--concurrency", "1", "--num-prompts", "64", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()              # the header: the job is running
        assert first.startswith("schedule "), first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err == "dynspec generate: interrupted\n"


def test_ctrl_c_before_the_job_starts_ends_with_one_line_and_status_130(monkeypatch, capsys):
    """Ctrl-C while the subcommands load (the first second, before the flags are parsed): one line
    and status 130, no traceback."""
    import importlib

    from dynspec import cli

    real = importlib.import_module

    def interrupted(name, *a, **kw):
        if name == "dynspec.runtime.generate.generate_cli":
            raise KeyboardInterrupt
        return real(name, *a, **kw)

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert main(["generate", "--no-progress"]) == 130
    assert capsys.readouterr().err == "dynspec: interrupted\n"


def test_ctrl_c_as_generate_imports_torch_ends_with_one_line(monkeypatch, capsys):
    """Ctrl-C once the flags are parsed, before generate's own handler runs: one line naming the command."""
    import torch

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "get_num_threads", interrupted)
    assert main(["generate", "--no-progress"]) == 130
    assert capsys.readouterr().err == "dynspec generate: interrupted\n"


def test_draft_sync_command_reaches_k0(capsys):
    """The draft sync demonstration: prompt chunks of 48 tokens stagger the 5 rows, so K=4 runs at
    b <= 4 before and after the K=0 stretch at b=5 (b=4 at K=0 too on the step that ends the fifth
    prompt's prefill, which counts as a row: DraftSchedule.decide; lazy: while the rows catch up)."""
    for flag in (["--draft-sync", "warm"], ["--draft-sync", "off"]):
        assert main(["generate", "--schedule", "4:4", "--concurrency", "5", "--num-prompts", "5",
                     "--max-num-tokens", "48", "--trials", "1", "--no-progress", *flag]) == 0
        ks = next(ln for ln in capsys.readouterr().out.splitlines() if ln.lstrip().startswith("dynamic:"))
        assert "b=5:K=0" in ks and re.search(r"b=(\d-)?4:K=(0/)?4", ks), ks


def test_launcher_flags_are_spelled_in_full():
    from dynspec.triton_repo import launch, server

    with pytest.raises(SystemExit):
        server.make_parser().parse_args(["repo", "--http-p", "9000"])
    args = launch.make_parser().parse_args(["repo", "--tp", "2", "--http-port", "9000"])
    assert (args.tp, args.http_port, args.grpc_port) == (2, 9000, 8001)
