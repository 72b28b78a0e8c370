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
    assert cap.choices(40) == (2, 0) and cap.choices(100) == (0,)
    assert cap.reads_prompts and cap.max_draft_len == 2 and cap.to_spec() == "68:2 prefill-k 0"
    assert PrefillCap(DraftSchedule.parse("68:2"), 1).decide(x(40, (100,))).ks == (1,) * 40
    with pytest.raises(DynspecError, match="prefill K -1 must be an integer >= 0"):
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


def test_the_sim_ttft_figures_name_each_stages_setting():
    from dynspec.benchmarks.figures_ttft import setting_of, stage_names

    assert setting_of(["--modes", "baseline,dynamic", "--prefill-k", "0"], "s") == "prefill-k 0"
    assert setting_of(["--modes", "baseline,adaptive", "--ttft-weight", "64"], "s") == "weight 64"
    assert setting_of(["--modes", "baseline,dynamic"], "s") == "uncapped"
    with pytest.raises(DynspecError, match="s: its flags '--modes baseline' give no --ttft-weight"):
        setting_of(["--modes", "baseline"], "s")
    assert stage_names(["tune_050", "ttft_0", "prefill_k_none"]) == ["ttft_0", "prefill_k_none"]
