"""The serial loop's deferred update (runtime/serving/executor.py, "Deferred update"): on an engine whose
launch returns before the device has run the step, the estimate / calibration update of step i
runs after step i+1's launch, so i+1's K reads the estimate through i-1. Checked on CPU by
declaring the CPU engine asynchronous (its launch then runs the step before returning, which
changes the timing only): the tokens are transformers' greedy ones, every recorded estimate is
the one a replay of the accepted counts gives at that lag, and the exposed policy time leaves
the update out."""
from __future__ import annotations

import pytest

from dynspec.runtime.policy.acceptance_estimate import AcceptanceEstimate
from dynspec.runtime.policy.adaptive import AdaptivePolicy, AdaptiveSettings
from dynspec.runtime.serving.driver import run_closed_loop
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.policy import DraftSchedule
from tests.test_adaptive_lossless import linear_cost
from tests.test_executor import engine, greedy_many, hf_target, pair, prompts  # noqa: F401  (fixtures)


def run(pair, asynchronous: bool, n_prompts: int, concurrency: int, policy=None):
    eng = engine(pair, kmax=4)
    eng.async_launch = asynchronous
    seen = []                                  # (k, accepted) of every step, in launch order
    real = eng.result

    def result(handle):
        res = real(handle)
        seen.append(res.accepted)
        return res

    eng.result = result
    policy = policy or AdaptivePolicy(linear_cost(), AdaptiveSettings(calibrate=True))
    ex = Executor(eng, policy, stats_limit=None)
    ps = prompts(n_prompts, seed=41)
    out = run_closed_loop(ex, ps, 24, concurrency=concurrency)
    return ex, ps, out, policy


@pytest.mark.parametrize("asynchronous", [True, False], ids=["deferred", "immediate"])
def test_one_request_reads_the_estimate_at_the_loops_lag(pair, hf_target, asynchronous):
    """One request, no retirement before the end: the estimate step i's K read is the replay of
    steps 0..i-2 (deferred) or 0..i-1 (the step-only serial loop)."""
    ex, ps, out, policy = run(pair, asynchronous, 1, 1)
    assert [r.output_ids for r in out] == greedy_many(hf_target, ps, 24)
    stats = [s for s in ex.stats if s.batch_size]
    assert len(stats) >= 4 and len({s.k for s in stats}) >= 1
    lag = 2 if asynchronous else 1
    est, replay = policy.initial_estimate(), []
    for s in stats:
        replay.append(est)
        est = est.update(s.k, (s.accepted,))  # b = 1: the step's sum is its one row's count
    for i, s in enumerate(stats):
        want = replay[max(0, i - lag + 1)].rates()
        assert s.acceptance == pytest.approx(want), i
    assert ex._pending is None                 # the last retirement applied it


def test_the_deferred_update_is_timed_but_not_exposed(pair, hf_target):
    """Deferred: policy_seconds holds the decision and the previous step's update, the exposed
    part the decision alone (the update ran after the launch); step-only loop: both the same."""
    ex, ps, out, _ = run(pair, True, 6, 3)
    assert [r.output_ids for r in out] == greedy_many(hf_target, ps, 24)
    stats = [s for s in ex.stats if s.batch_size]
    assert all(s.policy_exposed_seconds <= s.policy_seconds for s in stats)
    assert sum(s.policy_exposed_seconds < s.policy_seconds for s in stats) >= len(stats) // 2
    ex2, *_ = run(pair, False, 6, 3)
    assert all(s.policy_exposed_seconds == s.policy_seconds for s in ex2.stats if s.batch_size)


def test_a_retirement_applies_the_pending_update_before_the_estimate_forgets(pair, hf_target):
    """b = 1, two requests one after the other: the first one's last step is still pending when it
    retires; it is applied before forget(0), so the second request starts from an a_1 that
    includes that step, as in the step-only loop."""
    ex, ps, out, _ = run(pair, True, 2, 1, DraftSchedule.static(3, 16))   # every step drafts
    assert [r.output_ids for r in out] == greedy_many(hf_target, ps, 24)
    stats = [s for s in ex.stats if s.batch_size]
    first = [s for s in stats if s.oldest_key == 0]
    second = next(s for s in stats if s.oldest_key == 1)
    est = AcceptanceEstimate(positions=4)
    for s in first:
        est = est.update(s.k, (s.accepted,))
    assert second.acceptance == pytest.approx(est.forget(0.0).rates())
    without_last = AcceptanceEstimate(positions=4)
    for s in first[:-1]:
        without_last = without_last.update(s.k, (s.accepted,))
    assert second.acceptance != pytest.approx(without_last.forget(0.0).rates())
