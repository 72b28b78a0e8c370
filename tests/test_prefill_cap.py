"""runtime/policy/prefill_cap.py: a schedule's K capped on the steps that end a prompt's prefill;
the module docstring's worked example, its graphs' K's, the sweep flag's checks and the sim_ttft
figures' settings (lossless against transformers greedy: tests/test_prefill_price.py)."""
from __future__ import annotations

import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.policy.prefill_cap import PrefillCap
from dynspec.runtime.policy.step_decision import StepInputs


def test_the_docstring_example():
    cap = PrefillCap(DraftSchedule.parse("68:2"), 0)
    x = lambda b, waiting: StepInputs(b, 100.0, (0.5, 0.5), waiting=waiting, token_budget=8192)   # noqa: E731
    assert cap.decide(x(40, (100, 300))).ks == (0,) * 40
    assert cap.decide(x(40, ())).ks == (2,) * 40
    assert cap.decide(x(100, (100,))).ks == (0,) * 100
    # a prompt that does not end in the step (it needs more than the budget leaves) leaves K alone
    assert cap.decide(StepInputs(40, 100.0, (0.5,), waiting=(9000,), token_budget=8192)).ks == (2,) * 40
    assert cap.choices(40) == (0, 2) and cap.choices(100) == (0,)
    assert cap.reads_prompts and cap.max_draft_len == 2 and cap.to_spec() == "68:2 prefill-k 0"
    assert PrefillCap(DraftSchedule.parse("68:2"), 1).decide(x(40, (100,))).ks == (1,) * 40
    with pytest.raises(DynspecError, match="prefill K -1 must be at least 0"):
        PrefillCap(DraftSchedule.parse("68:2"), -1)


def test_the_sweep_flag_caps_the_dynamic_mode_only(capsys):
    from dynspec.benchmarks.sweep_modes import mode_policies, policy_label

    pols, kmax = mode_policies(("baseline", "dynamic", "static"), DraftSchedule.parse("8:3"), None, 16, None,
                               prefill_k=1)
    assert isinstance(pols["dynamic"], PrefillCap) and isinstance(pols["static"], DraftSchedule) and kmax == 3
    assert policy_label(pols["dynamic"]) == "8:3 prefill-k 1"
    from dynspec.benchmarks import sweep

    assert sweep.main(["--engine", "trtllm", "--engine-dir", "x", "--modes", "dynamic", "--prefill-k", "1",
                       "--out", "-"]) == 2
    assert "--prefill-k 1: TensorRT-LLM's dynamic draft length reads the batch size alone" in capsys.readouterr().err


def test_the_ttft_figures_name_each_modes_setting():
    from dynspec.benchmarks.figures_ttft import setting_of, stage_names
    from dynspec.runtime.policy.adaptive import TTFT_WEIGHT

    assert setting_of(["--modes", "baseline,dynamic", "--prefill-k", "0"], "s", "dynamic") == "prefill-k 0"
    assert setting_of(["--modes", "baseline,adaptive", "--ttft-weight", "64"], "s", "adaptive") == "weight 64"
    assert setting_of(["--modes", "baseline,dynamic"], "s", "dynamic") == "uncapped"
    # one case of dynamic capped beside adaptive: each mode its own setting
    both = ["--modes", "baseline,dynamic,adaptive", "--prefill-k", "1", "--catch-up-price", "off"]
    assert setting_of(both, "s", "dynamic") == "prefill-k 1"
    assert setting_of(both, "s", "adaptive") == f"weight {TTFT_WEIGHT:g}, catch-up unpriced"
    with pytest.raises(DynspecError, match="s: mode 'static:2' has no prefill-aware setting"):
        setting_of(["--modes", "baseline,static:2"], "s", "static:2")
    with pytest.raises(DynspecError, match="s: its flags .* give --prefill-k without a value"):
        setting_of(["--modes", "dynamic", "--prefill-k"], "s", "dynamic")
    assert stage_names(["tune_050", "ttft_0", "prefill_k_none", "sweep_uncapped"]) == ["ttft_0", "prefill_k_none"]


def test_a_capped_schedule_is_the_schedule_policy_in_every_record_and_log_line():
    """engine.json prefill_k serves a PrefillCap: the registry, the served model's log line and a
    sweep row name it as the schedule it caps (a sweep on the real engine had refused it)."""
    from types import SimpleNamespace

    from dynspec.benchmarks.sweep_modes import policy_label
    from dynspec.runtime.policy import registered_name
    from dynspec.runtime.serving.driver import describe_policy
    from dynspec.triton_repo.serving import policy_line

    cap = PrefillCap(DraftSchedule.parse("4:4,68:2"), 0)
    assert registered_name(cap) == "schedule"
    assert describe_policy(cap) == "schedule (K<=0 on steps that end a prefill)"
    assert policy_label(cap) == "4:4,68:2 prefill-k 0"
    line = policy_line(SimpleNamespace(schedule=cap.schedule, cost_model=None), cap)
    assert line.endswith("policy: schedule (K<=0 on steps that end a prefill)") and "bounds K" in line


def test_a_cap_by_batch_size_caps_each_step_at_its_rows():
    """A cap of tiers ('37:1': K <= 1 up to 37 rows, 0 above) at the rows the step emits for: the
    module docstring's second example, its choices (the graphs a serve captures) and its text forms."""
    cap = PrefillCap(DraftSchedule.parse("1:3,71:2"), "37:1")
    x = lambda b, waiting: StepInputs(b, 100.0, (0.5, 0.5), waiting=waiting, token_budget=8192)   # noqa: E731
    assert cap.decide(x(16, (100,))).ks == (1,) * 16
    assert cap.decide(x(64, (100,))).ks == (0,) * 64
    assert cap.decide(x(16, ())).ks == (2,) * 16
    assert cap.decide(x(1, ())).ks == (3,) and cap.decide(x(1, (50,))).ks == (1,)
    # 36 rows and two prompts ending: 38 rows emit, above the cap's 37 -> K = 0
    assert cap.decide(x(36, (50, 50))).ks == (0,) * 36 and cap.decide(x(36, (50,))).ks == (1,) * 36
    # K=2 ends one prompt (37 rows: cap 1); K=1 leaves room for both (38 rows: cap 0) -> K = 0
    assert cap.decide(x(36, (8000, 100))).ks == (0,) * 36
    assert cap.choices(1) == (0, 1, 2, 3) and cap.choices(16) == (0, 1, 2) and cap.choices(40) == (0, 2) and cap.choices(80) == (0,)
    assert cap.to_spec() == "1:3,71:2 prefill-k 37:1" and cap.limit == "K<=1 up to 37 rows, 0 above"
    assert PrefillCap(DraftSchedule.parse("68:2"), 0).limit == "K<=0"


def test_the_cap_has_one_reader_for_every_form(tmp_path):
    from dynspec.runtime.policy.prefill_cap import cap_text, json_form, parse_cap

    assert parse_cap("0").tiers == () and parse_cap(2) == parse_cap("2") and cap_text(parse_cap(" 2 ")) == "2"
    assert parse_cap("37:1,80:0").tiers == ((37, 1),) and cap_text(parse_cap("16:2,37:1")) == "16:2,37:1"
    f = tmp_path / "prefill_k.txt"
    f.write_text("37:1\n")
    assert cap_text(parse_cap(f"@{f}")) == "37:1" and json_form(parse_cap(f"@{f}")) == "37:1"
    assert json_form(parse_cap("1")) == 1 and json_form(parse_cap("0")) == 0
    for bad, match in (("-1", "--prefill-k -1 must be at least 0"), (-1, "--prefill-k -1 must be at least 0"),
                       ("x", "--prefill-k 'x': cannot parse schedule tier 'x'"),
                       ("8:1,4:2", "--prefill-k '8:1,4:2': tier 1: bound 4 is not above"),
                       (f"@{tmp_path / 'none.txt'}", "file .*none.txt does not exist"),
                       (1.5, "--prefill-k 1.5 must be a K >= 0, tiers like '37:1', or @FILE")):
        with pytest.raises(DynspecError, match=match):
            parse_cap(bad)


def test_every_k_a_cap_decides_is_among_its_choices():
    """The graphs a serve captures are choices(b); decide must never leave them, whatever the rows,
    the prompts waiting and the budget (a K outside them would run without its graph)."""
    import itertools

    schedules = ("4:4,8:2,32:1", "1:3,71:2,208:1", "68:2", "16:3,64:1")
    caps = ("0", "1", "2", "32:1", "8:2,40:1", "1:3,64:2,100:1")
    waitings = ((), (10,), (100, 100), (8000, 100), (50,) * 6, (3000, 3000, 3000))
    for spec, cap, budget in itertools.product(schedules, caps, (48, 512, 8192)):
        pol = PrefillCap(DraftSchedule.parse(spec), cap)
        for b in range(1, 140, 3):
            ch = pol.choices(b)
            for w in waitings:
                k = pol.decide(StepInputs(b, 100.0, (0.5,), waiting=w, token_budget=budget)).k
                assert k in ch, (spec, cap, budget, b, w, k, ch)


def test_the_cap_files_and_values_refused_name_the_flag(tmp_path):
    from dynspec.runtime.policy.prefill_cap import parse_cap

    (tmp_path / "loop.txt").write_text(f"@{tmp_path / 'loop.txt'}\n")
    (tmp_path / "empty.txt").write_text("\n")
    for bad, match in (("", "--prefill-k is empty"), ("33", "--prefill-k 33 exceeds the draft-length limit 32"),
                       ("@", "name a file after '@'"), (f"@{tmp_path}", "is a folder, not a file"),
                       (f"@{tmp_path / 'loop.txt'}", "names another file; it must hold a K or tiers"),
                       (f"@{tmp_path / 'empty.txt'}", r"--prefill-k \(.*empty.txt\) is empty")):
        with pytest.raises(DynspecError, match=match):
            parse_cap(bad)


def test_a_cap_in_the_figures_and_the_replay(tmp_path):
    """The TTFT figures label and order tiered caps (a comma inside a cap is not a suffix), a cap
    given as @FILE is named from its row's schedule or the file, and the simulator's replay of a
    recorded sweep takes the cap it recorded, flag or engine.json."""
    from dynspec.benchmarks.figures_ttft import _order, setting_of
    from dynspec.benchmarks.sim_record import load_flags

    flags = ["--modes", "baseline,dynamic", "--prefill-k", "8:2,40:1"]
    assert setting_of(flags, "s", "dynamic") == "prefill-k 8:2,40:1"
    f = tmp_path / "cap.txt"
    f.write_text("32:1\n")
    at = ["--modes", "dynamic", "--prefill-k", f"@{f}"]
    assert setting_of(at, "s", "dynamic", "1:3,71:2 prefill-k 39:1") == "prefill-k 39:1"
    assert setting_of(at, "s", "dynamic") == "prefill-k 32:1"
    assert setting_of(["--prefill-k", "@/gone/cap.txt"], "s", "dynamic") == "prefill-k from /gone/cap.txt"
    settings = ["prefill-k 0", "prefill-k 8:2,40:1", "uncapped", "prefill-k 32:1", "prefill-k 2", "prefill-k 1"]
    assert sorted(settings, key=_order) == ["uncapped", "prefill-k 2", "prefill-k 8:2,40:1", "prefill-k 1",
                                            "prefill-k 32:1", "prefill-k 0"]
    cmd = "python -m dynspec.benchmarks.sweep --modes baseline,dynamic --prefill-k @/gone/prefill_k.txt --trials 3"
    assert load_flags(cmd, None, "39:1") == ["--modes", "baseline,dynamic", "--prefill-k", "39:1", "--trials", "3"]
    with pytest.raises(DynspecError, match="--prefill-k @/gone/prefill_k.txt but no cap recorded"):
        load_flags(cmd, None, None)


def test_the_replay_takes_an_engine_json_cap_the_sweep_recorded_without_its_flag(tmp_path):
    """A sweep that served engine.json prefill_k (no --prefill-k flag) records the cap in its env;
    the replay's flags carry it, so the simulator runs the mode as it was served."""
    import json

    from dynspec.benchmarks.sim_record import MEASURED, record_sweep

    row = {"mode": "dynamic", "concurrency": 16, "request_rate": None, "matched_concurrency": None,
           "draft_sync": "lazy", **{k: 1.0 for k in MEASURED}}
    env = {"command": "python -m dynspec.benchmarks.sweep --modes baseline,dynamic --trials 3",
           "schedules": {"dynamic": "8:2"}, "prefill_k": "4:1", "max_batch_size": 16, "max_seq_len": 64}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"env": env, "rows": [row]}))
    assert record_sweep(path, "c", "-", "p.json")["flags"][-2:] == ["--prefill-k", "4:1"]
    path.write_text(json.dumps({"env": {**env, "prefill_k": None}, "rows": [row]}))
    assert "--prefill-k" not in record_sweep(path, "c", "-", "p.json")["flags"]
