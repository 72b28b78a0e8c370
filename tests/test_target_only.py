"""A policy that never drafts runs the target alone (StepPlan.draft False): no keep-warm, no
draft pass over prompt chunks, no captured layers; what a user without speculation would run,
and what the benchmarks' `baseline` mode measures. Lossless against transformers, and the
draft's cache is never written."""
import pytest
import torch

from dynspec.runtime.engines.reference.graph_keys import GraphKey, reachable_graphs
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.plan import PromptChunk, make_plan
from dynspec.runtime.policy.adaptive import AdaptivePolicy
from dynspec.runtime.policy import ConstantK, DraftSchedule, speculates
from dynspec.runtime.generate.session import capture
from tests.test_executor import hf_target, pair  # noqa: F401  (fixtures)
from tests.test_inflight import engine, pad_rows_to_buckets, serve_arrivals_and_check


def test_speculates():
    from tests.test_adaptive_lossless import linear_cost

    assert not speculates(DraftSchedule.parse(""))
    assert speculates(DraftSchedule.parse("4:4")) and speculates(ConstantK(0))     # K=0 with the draft loaded
    assert speculates(AdaptivePolicy(linear_cost(kmax=2)))


def test_a_plan_without_the_draft_runs_k0_without_keep_warm():
    common = dict(positions=[5], pending=[1], stale=[False], buckets=(1, 2), draft=False)
    assert make_plan(0, keep_warm=False, **common).draft is False
    with pytest.raises(ValueError, match="without the draft runs K=0"):
        make_plan(2, keep_warm=False, **common)
    with pytest.raises(ValueError, match="without the draft runs K=0"):
        make_plan(0, keep_warm=True, **common)
    chunk_only = make_plan(3, [], [], [], False, (1, 2), chunks=[PromptChunk(0, 0, (1, 2), None)], draft=False)
    assert chunk_only.k == 0                          # no decode rows: K is 0 whatever was asked


def test_reachable_graphs_of_a_policy_that_never_drafts():
    keys = reachable_graphs([DraftSchedule.parse("")], 4, True, 64)
    assert set(keys) == {GraphKey("decode", b, draft=False) for b in (1, 2, 4)}


@pytest.mark.parametrize("whole", [False, True])
def test_the_target_alone_is_lossless_and_never_touches_the_draft(pair, hf_target, whole, monkeypatch):  # noqa: F811
    """Arrivals while others decode, prompts chunked under a 20-token budget, eager mixed steps or
    the whole-forward functions (uncaptured on CPU): transformers' tokens; every plan without the
    draft; the draft's K/V pool as it was before the first request."""
    eng = engine(pair, budget=20, max_batch=6)
    pad_rows_to_buckets(eng)
    policy = DraftSchedule.parse("")
    if whole:
        capture(eng, reachable_graphs([policy], 6, False, 20))
    plans, runs = [], []
    launch = eng.launch
    monkeypatch.setattr(eng, "launch", lambda plan, acc: plans.append(plan) or launch(plan, acc))
    if whole:
        real = eng.whole.run
        monkeypatch.setattr(eng.whole, "run", lambda key, *a: runs.append(key) or real(key, *a))
    draft_k, draft_v = eng.draft.k_cache.clone(), eng.draft.v_cache.clone()
    ex = Executor(eng, policy, keep_warm=True)            # keep-warm asked for, and dropped: nothing drafts
    assert not ex.draft and not ex.keep_warm
    serve_arrivals_and_check(ex, hf_target, seed=7)
    assert plans and all(not p.draft and not p.keep_warm and p.k == 0 for p in plans)
    assert any(p.chunks and p.batch_size for p in plans)
    assert torch.equal(eng.draft.k_cache, draft_k) and torch.equal(eng.draft.v_cache, draft_v)
    assert not whole or (runs and all(key[3] is False for key in runs))
