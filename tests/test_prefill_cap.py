"""runtime/policy/prefill_cap.py: a schedule's K capped on the steps that end a prompt's prefill;
the module docstring's worked example, its graphs' K's, the sweep flag's checks, and the rule
lossless against transformers greedy (float64) with prompts riding beside decode rows."""
from __future__ import annotations

import random

import pytest
import torch

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


def test_capped_schedule_is_lossless_and_drops_k_where_a_prompt_ends():
    """Staggered arrivals under a small token budget: every output is transformers' greedy one; with
    the cap every step that ends a prompt's prefill runs at K=0, and the others at the schedule's K."""
    from transformers import LlamaForCausalLM

    from dynspec.runtime.engines.reference.load import load_reference_engine
    from dynspec.runtime.generate.session import tiny_pair_dirs
    from dynspec.runtime.policy.prefill_price import finishing
    from dynspec.runtime.serving.driver import run_closed_loop
    from dynspec.runtime.serving.executor import Executor
    from tests.test_executor import greedy_many

    target, draft = tiny_pair_dirs()
    hf = LlamaForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    eng = load_reference_engine(target, draft, dtype=torch.float64, max_batch_size=4, max_seq_len=128,
                                max_draft_len=2, max_num_tokens=40)
    rng = random.Random(3)
    ps = [tuple(rng.randrange(3, eng.vocab_size) for _ in range(rng.randrange(6, 30))) for _ in range(10)]
    ex = Executor(eng, PrefillCap(DraftSchedule.parse("4:2"), 0), stats_limit=None)
    res = run_closed_loop(ex, ps, 16, concurrency=3)
    assert [r.output_ids for r in res] == greedy_many(hf, ps, 16)
    rows = [s for s in ex.stats if s.batch_size]
    ending = [s for s in rows if s.waiting and finishing(s.waiting, 40 - s.batch_size * 3)]   # at K=2
    assert ending and all(s.k == 0 for s in ending)
    assert any(s.k == 2 for s in rows if not s.prefill_tokens)


def test_the_sim_ttft_figures_name_each_stages_setting():
    from dynspec.benchmarks.figures_ttft import setting_of, stage_names

    assert setting_of(["--modes", "baseline,dynamic", "--prefill-k", "0"], "s") == "prefill-k 0"
    assert setting_of(["--modes", "baseline,adaptive", "--ttft-weight", "64"], "s") == "weight 64"
    assert setting_of(["--modes", "baseline,dynamic"], "s") == "uncapped"
    with pytest.raises(DynspecError, match="s: its flags '--modes baseline' give no --ttft-weight"):
        setting_of(["--modes", "baseline"], "s")
    assert stage_names(["tune_050", "ttft_0", "prefill_k_none"]) == ["ttft_0", "prefill_k_none"]
