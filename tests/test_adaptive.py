"""The adaptive policy's pure parts: the acceptance estimate and choose_k, by worked examples."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance_estimate import AcceptanceEstimate
from dynspec.runtime.policy.adaptive import AdaptivePolicy, AdaptiveSettings, PolicyInputs, choose_k
from dynspec.runtime.policy.expected_tokens import expected_tokens
from dynspec.runtime.policy.cost_model import CostModel

S = AdaptiveSettings()


def cost(ms_by_k=(10.0, 11.0, 12.0, 13.0), batch_sizes=(1, 16, 64), contexts=(1024,), per_position=None):
    """The same ms(K) at every batch size and context (the docstring's worked example)."""
    row = tuple(ms_by_k)
    ms = tuple(tuple(row for _ in batch_sizes) for _ in contexts)
    return CostModel("test", tuple(contexts), tuple(batch_sizes), tuple(range(len(row))), per_position, ms)


def inputs(a, b=16, previous_k=0, since_spec=0, max_k=32, context=1024.0):
    return PolicyInputs(b, context, (a,) * 8 if isinstance(a, float) else tuple(a), previous_k, since_spec, max_k)


# ---- the estimate -----------------------------------------------------------------------------------
def test_one_step_counts_each_position_among_the_rows_that_reached_it():
    est = AcceptanceEstimate(prior=0.5, positions=3, prior_weight=1e-9).update(3, [3, 0, 1])
    assert est.trials == pytest.approx((3, 2, 1))
    assert est.hits == pytest.approx((2, 1, 1))
    assert est.rates() == pytest.approx((2 / 3, 1 / 2, 1.0), abs=1e-6)


def test_no_data_is_the_prior_and_unmeasured_positions_follow_the_one_before():
    est = AcceptanceEstimate(prior=0.6, positions=4)
    assert est.rates() == pytest.approx((0.6,) * 4)
    for _ in range(50):                                  # K=1 only: position 1 is all misses
        est = est.update(1, [0] * 8)
    r = est.rates()
    # steady state: 8 rows a step decayed by 2^(-8/64) -> n_1 = 8 / (1 - 0.917) = 96.5, a_1 = 4 x 0.6 / 100.5
    assert r[0] == pytest.approx(0.0239, abs=0.001)
    assert r[3] < 0.03                                  # positions 2..4 fall with position 1


def test_the_estimate_converges_to_a_bernoulli_rate_and_forgets_with_its_half_life():
    rng = random.Random(0)

    def window(p, k=4):
        n = 0
        while n < k and rng.random() < p:
            n += 1
        return n

    est = AcceptanceEstimate(prior=0.5, positions=4, half_life=64)
    for _ in range(400):
        est = est.update(4, [window(0.8) for _ in range(4)])
    assert est.rates()[0] == pytest.approx(0.8, abs=0.06)
    steps = 0
    while abs(est.rates()[0] - 0.2) > 0.05:              # the shift: 0.8 -> 0.2
        est = est.update(4, [window(0.2) for _ in range(4)])
        steps += 1
    # |0.8 - 0.2| x 2^(-4 steps / 64) < 0.05 needs about 3.6 half-lives = 57 steps of 4 rows
    assert 20 <= steps <= 120


def test_update_at_k0_or_without_rows_changes_nothing_and_bad_settings_are_refused():
    est = AcceptanceEstimate(positions=2)
    assert est.update(0, [0, 0]) == est and est.update(2, []) == est
    with pytest.raises(DynspecError, match="outside"):
        AcceptanceEstimate(prior=1.5)
    with pytest.raises(DynspecError, match="half_life"):
        AcceptanceEstimate(half_life=0)


# ---- choose_k ---------------------------------------------------------------------------------------
def test_expected_tokens_worked_example():
    assert expected_tokens(3, 0.7) == pytest.approx(2.533)
    assert expected_tokens(0, (0.7,)) == 1.0
    assert expected_tokens(2, (1.0, 0.5)) == pytest.approx(2.5)


def test_docstring_example_best_k_moves_with_acceptance():
    c = cost()
    d = choose_k(inputs(0.5, previous_k=3), c, c.draft_lens, S)
    assert (d.k, d.best_k, d.reason) == (2, 2, "best")
    assert d.gain == pytest.approx(1.75 * 10 / 12)
    d = choose_k(inputs(0.15, previous_k=0), c, c.draft_lens, S)
    assert (d.k, d.reason) == (1, "best") and d.gain == pytest.approx(1.15 * 10 / 11)
    d = choose_k(inputs(0.02), c, c.draft_lens, S)
    assert d.k == 0


def test_hysteresis_holds_the_previous_k_inside_the_margin():
    # a = 0.5, ms 10, 11, 12, 12.3: K=2 scores 1.4296, K=3 1.875*10/12.3/1.0303 = 1.4796 -> best 3;
    # from previous K=2 the move needs 1.4796 > 1.4296 x 1.02 = 1.4582: it moves. With ms(3) = 12.8
    # K=3 scores 1.4218, so K=2 is best, but from previous K=3 it does not beat 1.4218 x 1.02 = 1.4502.
    moved = cost((10.0, 11.0, 12.0, 12.3))
    assert choose_k(inputs(0.5, previous_k=2), moved, moved.draft_lens, S).k == 3
    held = cost((10.0, 11.0, 12.0, 12.8))
    d = choose_k(inputs(0.5, previous_k=3), held, held.draft_lens, S)
    assert (d.k, d.best_k, d.reason) == (3, 2, "hold")
    d = choose_k(inputs(0.5, previous_k=1), held, held.draft_lens, S)
    assert (d.k, d.reason) == (2, "best")          # 1.4296 > 1.3501 x 1.02


def test_speculation_predicted_to_lose_is_never_held():
    # ms 10, 11.6 (K=1 16% dearer, as a b=16 step on the H200 profile): break-even at a_1 = 0.16.
    # a_1 = 0.155: gain(1) = 1.155 x 10 / 11.6 = 0.9957, score 0.9858 -> from K=1 it drops to K=0,
    # although 1 <= 0.9858 x 1.02 (inside the margin). a_1 = 0.175: score 1.175 x 10 / 11.6 / 1.01
    # = 1.0029: from K=1 it stays (best), from K=0 it holds K=0 (1.0029 <= 1.02). The band between
    # K=0 and K=1 is score(1) in [1, 1.02]: above break-even, not around it.
    c = cost((10.0, 11.6))
    d = choose_k(inputs(0.155, previous_k=1), c, c.draft_lens, S)
    assert (d.k, d.reason) == (0, "best")
    d = choose_k(inputs(0.175, previous_k=1), c, c.draft_lens, S)
    assert (d.k, d.reason) == (1, "best") and d.gain == pytest.approx(1.175 * 10 / 11.6)
    d = choose_k(inputs(0.175, previous_k=0), c, c.draft_lens, S)
    assert (d.k, d.best_k, d.reason) == (0, 1, "hold")


def test_no_flip_flop_between_neighbours_under_a_noisy_estimate():
    c = cost((10.0, 11.0, 12.0, 12.8))             # K=2 and K=3 within 0.6% of each other at a = 0.5
    rng, prev, flips = random.Random(1), 2, 0
    for _ in range(500):
        a = 0.5 + rng.uniform(-0.005, 0.005)
        k = choose_k(inputs(a, previous_k=prev), c, c.draft_lens, S).k
        flips += k != prev
        prev = k
    assert flips <= 1


def test_recovery_from_k0_by_probing_and_the_probe_interval_follows_its_cost():
    c = cost((10.0, 14.0, 18.0, 22.0))            # K=1 costs 40% more: a_1 = 0.1 predicts 1.1/1.4 = 0.786
    x = inputs(0.1, since_spec=0)
    d = choose_k(x, c, c.draft_lens, S)
    assert (d.k, d.reason) == (0, "best")
    # loss 1 - 0.786 = 0.214; interval ceil(0.214 / 0.005) = 43 iterations without speculation
    assert choose_k(inputs(0.1, since_spec=42), c, c.draft_lens, S).k == 0
    d = choose_k(inputs(0.1, since_spec=43), c, c.draft_lens, S)
    assert (d.k, d.reason, d.probe) == (1, "probe", True)
    # the probe measures a high a_1: the estimate rises and the next decision speculates for real
    est = AcceptanceEstimate(prior=0.1, positions=3)
    for _ in range(10):
        est = est.update(1, [1] * 16)
    d = choose_k(PolicyInputs(16, 1024.0, est.rates(), 1, 0, 32), c, c.draft_lens, S)
    assert d.k >= 1 and d.reason == "best"


def test_probes_that_confirm_k0_back_off_up_to_the_cap():
    """The interval of 43 above doubles with each probe since the last real speculation, up to
    2^probe_backoff = 8x (344), and never past max_probe_interval."""
    c = cost((10.0, 14.0, 18.0, 22.0))
    at = lambda since, probes, s=S: choose_k(replace(inputs(0.1, since_spec=since), probes=probes), c,
                                             c.draft_lens, s).probe
    for probes, interval in ((0, 43), (1, 86), (2, 172), (3, 344), (7, 344)):
        assert not at(interval - 1, probes) and at(interval, probes), probes
    capped = replace(S, max_probe_interval=100)
    assert not at(99, 3, capped) and at(100, 3, capped)
    assert at(43, 5, replace(S, probe_backoff=0))
    with pytest.raises(DynspecError, match="probe_backoff"):
        AdaptiveSettings(probe_backoff=-1)


def test_a_cold_probe_after_plain_decode_is_priced_by_its_own_slot():
    """Plain decode 9, K=1 11 (b=16), a = 0.15: gain(1) = 1.15 x 9 / 11 = 0.941, loss 0.059 ->
    a probe every ceil(0.059 / 0.005) = 12 iterations. Served probes after plain decode ran 10%
    above the profile (cold slot 1.1, warm K=1 at 1.0): gain 0.941 / 1.1 = 0.855, loss 0.145 ->
    every 29. Held at K=0 with the draft kept warm (a = 0.255, best K=1), the probe is not cold."""
    c = cost_with_decode()
    cold = (1.0, 1.0, 1.0, 1.0, 1.0, 1.1, 1.0)          # K = 0..3, keep-warm, cold, ragged
    x = dict(batch_size=16, context=1024.0, acceptance=(0.15,) * 8, max_k=32)
    assert choose_k(PolicyInputs(**x, since_spec=12), c, (0, 1, 2, 3), S).probe
    assert not choose_k(PolicyInputs(**x, since_spec=12, cost_scale=cold), c, (0, 1, 2, 3), S).probe
    assert not choose_k(PolicyInputs(**x, since_spec=28, cost_scale=cold), c, (0, 1, 2, 3), S).probe
    d = choose_k(PolicyInputs(**x, since_spec=29, cost_scale=cold), c, (0, 1, 2, 3), S)
    assert (d.k, d.probe, d.predicted_ms) == (1, True, 11.0) and d.gain == pytest.approx(1.15 * 9 / 11 / 1.1)
    warm = dict(x, acceptance=(0.255,) * 8)
    d = choose_k(PolicyInputs(**warm, since_spec=8, cost_scale=cold), c, (0, 1, 2, 3), S)
    assert (d.k, d.probe) == (1, True)                              # interval 8: the warm gain, no cold ratio


def test_budget_and_profile_limits():
    c = cost()
    assert choose_k(inputs(0.9, max_k=1), c, c.draft_lens, S).k == 1       # the token budget caps K
    assert choose_k(inputs(0.9, max_k=0, since_spec=10**6), c, c.draft_lens, S).k == 0   # no probe either
    d = choose_k(inputs(0.9, b=65), c, c.draft_lens, S)                      # past the profiled batch sizes
    assert (d.k, d.reason) == (0, "unprofiled batch")
    d = choose_k(inputs(0.9, context=5000.0), c, c.draft_lens, S)            # past the profiled context
    assert d.extrapolated


def test_cost_interpolates_in_context_and_k_follows_it():
    # context 512: verify windows are cheap (K=3 best at a = 0.7); 4096: each K costs much more (K=1:
    # gains 1.417, 1.413, 1.333 for K = 1..3)
    c = CostModel("test", (512, 4096), (1, 128), (0, 1, 2, 3), None,
                  (((10.0, 10.5, 11.0, 11.5),) * 2, ((20.0, 24.0, 31.0, 38.0),) * 2))
    assert choose_k(inputs(0.7, b=128, context=512.0), c, c.draft_lens, S).k == 3
    assert choose_k(inputs(0.7, b=128, context=4096.0), c, c.draft_lens, S).k == 1


def test_policy_object_candidates_prior_and_errors():
    pol = AdaptivePolicy(cost(per_position=(0.8, 0.7)), max_draft_len=2)
    assert pol.candidates == (0, 1, 2) and pol.max_draft_len == 2
    assert pol.initial_estimate().rates()[0] == pytest.approx(0.8)
    assert AdaptivePolicy(cost()).initial_estimate().rates()[0] == pytest.approx(0.5)
    assert "adaptive" in str(pol)
    with pytest.raises(DynspecError, match="at least one K"):
        AdaptivePolicy(cost(), max_draft_len=0)
    with pytest.raises(DynspecError, match="margin"):
        AdaptiveSettings(margin=-1)


# ---- plain decode, keep-warm, served-cost ratios, buckets, retirement ----------------------------
def cost_with_decode(ms_by_k=(10.0, 11.0, 12.0, 13.0), decode=9.0, batch_sizes=(1, 16, 64)):
    """cost() plus a plain-decode time (decode_ms: K=0 without keep-warm) at every batch size."""
    c = cost(ms_by_k, batch_sizes)
    return CostModel(c.device, c.context_lens, c.batch_sizes, c.draft_lens, None, c.ms,
                     ((decode,) * len(batch_sizes),))


def test_gains_are_over_plain_decode_and_keep_warm_only_while_k0_is_held():
    """t(0) = 9 (plain decode), keep-warm K=0 = 10. At a = 0.15: gain(1) = 1.15 * 9 / 11 = 0.941
    (against keep-warm it would have been 1.045 and K=1 would run): K=0 is best, as plain decode
    (gain 1.0). a = 0.3: score(1) = 1.3 * 9 / 11 / 1.01 = 1.053 > 1.02 -> K=1. a = 0.255:
    score(1) = 1.0167 <= 1.02 -> held at K=0 against best 1: the draft stays warm."""
    c = cost_with_decode()
    d = choose_k(inputs(0.15, previous_k=2), c, (0, 1, 2, 3), S)
    assert (d.k, d.best_k, d.keep_warm, d.gain, d.predicted_ms) == (0, 0, False, 1.0, 9.0)
    assert choose_k(inputs(0.3), c, (0, 1, 2, 3), S).k == 1
    d = choose_k(inputs(0.255), c, (0, 1, 2, 3), S)
    assert (d.k, d.best_k, d.reason, d.keep_warm) == (0, 1, "hold", True)
    assert d.gain == pytest.approx(0.9) and d.predicted_ms == 10.0          # 9 / 10 while warm
    x = PolicyInputs(16, 1024.0, (0.255,) * 8, 0, 0, 32, keep_warm=False)  # the engine never keeps it warm
    assert choose_k(x, c, (0, 1, 2, 3), S).keep_warm is False
    # no decode_ms in the profile: K=0 is the profiled keep-warm step, as before
    d = choose_k(inputs(0.05), cost(), (0, 1, 2, 3), S)
    assert (d.k, d.keep_warm, d.predicted_ms) == (0, True, 10.0)


def test_served_to_profiled_ratios_move_the_choice():
    """a = 0.3, t = 9 (plain), 11 (K=1): gain(1) = 1.3 * 9 / 11 = 1.064 -> K=1. Served K=1 steps
    measured 8% above their profile (scale 1.08): gain = 1.3 * 9 / 11.88 = 0.985 -> K=0. A slow
    plain decode (scale 1.1 on slot 0) makes speculation relatively cheaper again: 1.3 * 9.9 / 11.88
    = 1.083 -> K=1."""
    c = cost_with_decode()
    base = dict(batch_size=16, context=1024.0, acceptance=(0.3,) * 8, max_k=32)
    assert choose_k(PolicyInputs(**base), c, (0, 1, 2, 3), S).k == 1
    slow1 = (1.0, 1.08, 1.08, 1.08, 1.0, 1.08, 1.0)     # slots: plain, K=1..3, keep-warm K=0, cold, ragged
    assert choose_k(PolicyInputs(**base, cost_scale=slow1), c, (0, 1, 2, 3), S).k == 0
    slow0 = (1.1, 1.08, 1.08, 1.08, 1.0, 1.08, 1.0)
    d = choose_k(PolicyInputs(**base, cost_scale=slow0), c, (0, 1, 2, 3), S)
    assert d.k == 1 and d.gain == pytest.approx(1.3 * 9.9 / 11.88)
    assert d.predicted_ms == 11.0                        # the profile's time, unscaled (what is calibrated)


def test_plain_decode_is_explored_while_unmeasured_near_break_even():
    """t = 9 (plain), 11 (K=1). a = 0.25: gain(1) = 1.25 * 9 / 11 = 1.023 < 1.05 and no plain-decode
    step calibrated: plain decode (explore), not keep-warm. With 4 calibrated: K=1. a = 0.4:
    gain 1.145, no exploring. Calibrated ratios then decide: the served K=1 at 1.06 and plain at
    1.03 give 1.25 * 9.27 / 11.66 = 0.994 -> K=0 as plain decode, where the pooled ratio (1.06
    on both) had kept K=1."""
    c = cost_with_decode()
    d = choose_k(PolicyInputs(16, 1024.0, (0.25,) * 8, 1, 0, 32, plain_steps=0.0), c, (0, 1, 2, 3), S)
    assert (d.k, d.best_k, d.reason, d.keep_warm, d.predicted_ms) == (0, 1, "explore", False, 9.0)
    held = choose_k(PolicyInputs(16, 1024.0, (0.245,) * 8, 0, 0, 32, plain_steps=3.9), c, (0, 1, 2, 3), S)
    assert (held.k, held.reason, held.keep_warm) == (0, "explore", False)    # K=0 held warm: explored too
    assert choose_k(PolicyInputs(16, 1024.0, (0.25,) * 8, 1, 0, 32, plain_steps=4.0), c, (0, 1, 2, 3), S).k == 1
    assert choose_k(PolicyInputs(16, 1024.0, (0.4,) * 8, 1, 0, 32, plain_steps=0.0), c, (0, 1, 2, 3), S).k == 1
    assert choose_k(PolicyInputs(16, 1024.0, (0.05,) * 8, 1, 0, 32, plain_steps=0.0), c, (0, 1, 2, 3), S).reason == "best"
    pooled = (1.06,) * 7
    measured = (1.03,) + (1.06,) * 6
    x = dict(batch_size=16, context=1024.0, acceptance=(0.25,) * 8, previous_k=1, max_k=32, plain_steps=8.0)
    assert choose_k(PolicyInputs(**x, cost_scale=pooled), c, (0, 1, 2, 3), S).k == 1
    d = choose_k(PolicyInputs(**x, cost_scale=measured), c, (0, 1, 2, 3), S)
    assert (d.k, d.keep_warm) == (0, False)
    with pytest.raises(DynspecError, match="explore_band"):
        AdaptiveSettings(explore_band=-0.1)


def test_costs_are_looked_up_at_the_bucket_the_step_runs_at():
    """b=20 pads to 32: the cost row is the bucket's, not an interpolation at 20. Profile: K=1 is
    cheap at b=16 (11 vs 10) and dear at b=32 (16 vs 10); a = 0.3."""
    ms = ((((10.0, 11.0), (10.0, 16.0))),)
    c = CostModel("t", (1024,), (16, 32), (0, 1), None, ms)
    x = dict(batch_size=20, context=1024.0, acceptance=(0.3,), max_k=1)
    assert choose_k(PolicyInputs(**x), c, (0, 1), S).k == 1              # interpolated: 12.25 ms
    assert choose_k(PolicyInputs(**x, bucket=32), c, (0, 1), S).k == 0   # 1.3 * 10 / 16 = 0.81
    pol = AdaptivePolicy(c)
    assert pol.choose(PolicyInputs(**x, bucket=32)) == choose_k(PolicyInputs(**x, bucket=32), c, (0, 1), S)


def test_calibration_ratios_decay_shrink_and_clip():
    from dynspec.runtime.policy.cost_calibration import CostCalibration

    cal = CostCalibration(max_k=3, half_life=1e9)
    assert cal.scales() == (1.0,) * 7 and cal.slot(0, True) == 4 and cal.slot(0, False) == 0 and cal.slot(2, True) == 2
    assert cal.slot(1, False, cold=True) == cal.slot(3, True, cold=True) == 5 and cal.slot(0, False, cold=True) == 0
    assert cal.slot(2, False, ragged=True) == 6 and cal.slot(3, True, cold=True, ragged=True) == 5   # cold first
    cal = cal.update(1, 11.0, 10.0).update(1, 11.4, 10.0)
    for _ in range(4):
        cal = cal.update(0, 9.0, 9.0)
    g = (2.24 + 4) / 6                                          # the docstring's worked example
    assert cal.scales() == pytest.approx(((4 + 4 * g) / 8, (2.24 + 4 * g) / 6, g, g, g, g, g))
    one = CostCalibration(max_k=3, half_life=1e9).update(3, 5.0, 10.0)   # a profile 2x slow everywhere:
    assert one.scales() == pytest.approx((0.5,) * 7)                       # every K alike
    stalled = CostCalibration(max_k=3, half_life=1e9).update(2, 10.0, 10.0).update(2, 500.0, 10.0)
    assert stalled.scales()[2] == pytest.approx(1.5)            # clipped to 2: (1 + 2 + 4 x 1.5) / 6
    fast = CostCalibration(max_k=1, half_life=1.0)
    for _ in range(40):
        fast = fast.update(1, 12.0, 10.0).update(0, 10.0, 10.0)
    # half-life 1 step: each slot's sums settle at r = 2 x ratio, n = 2; g = (2.4 + 2) / 4 = 1.1
    assert fast.scales()[:2] == pytest.approx(((2 + 4.4) / 6, (2.4 + 4.4) / 6))
    with pytest.raises(DynspecError, match="slot 7"):
        CostCalibration(max_k=3).update(7, 1.0, 1.0)


def test_retirement_forgets_the_rows_share_and_moves_the_prior():
    """b=1: the request at 0.2 retires (keep 0): the next starts from a_1 = 0.2 with the prior's
    weight only, so 4 fully accepted steps bring a_1 to (4 + 4 * 0.2) / (4 + 4) = 0.6."""
    est = AcceptanceEstimate(prior=0.5, positions=2, half_life=1e9)
    for i in range(200):
        est = est.update(1, [1 if i % 5 == 0 else 0])
    assert est.rates()[0] == pytest.approx(0.2, abs=0.01)
    new = est.forget(0.0)
    assert new.trials == (0.0, 0.0) and new.prior == pytest.approx(est.rates()[0])
    for _ in range(4):
        new = new.update(1, [1])
    assert new.rates()[0] == pytest.approx((4 + 4 * est.rates()[0]) / 8)
    assert est.forget(1.0) is est
    half = est.forget(0.5)
    assert half.trials[0] == pytest.approx(est.trials[0] / 2) and half.rates()[0] == pytest.approx(est.rates()[0], abs=0.01)
    with pytest.raises(DynspecError, match="keep 1.5"):
        est.forget(1.5)


def test_adaptive_graphs_cover_every_k_and_both_plain_decodes():
    """Max batch 4 (buckets 1, 2, 4), K in 0..2: spec and refresh at every bucket, and decode with
    and without keep-warm (step 4 picks either); without keep-warm in the engine, only the cold one."""
    from dynspec.runtime.engines.reference.graph_keys import GraphKey, reachable_graphs

    pol = AdaptivePolicy(cost(), max_draft_len=2)
    keys = set(reachable_graphs([pol], 4, "warm"))
    want = {GraphKey(kind, b, k) for b in (1, 2, 4) for kind, k in (("spec", 1), ("spec", 2), ("refresh", 0))}
    want |= {GraphKey("decode", b, sync=w) for b in (1, 2, 4) for w in ("warm", "off")}
    assert keys == want
    cold = set(reachable_graphs([pol], 4, "off"))
    assert cold == want - {GraphKey("decode", b, sync="warm") for b in (1, 2, 4)}
    lazy = set(reachable_graphs([pol], 4, "lazy"))
    assert lazy == cold - {GraphKey("decode", b) for b in (1, 2, 4)} | {GraphKey("decode", b, sync="lazy") for b in (1, 2, 4)}
