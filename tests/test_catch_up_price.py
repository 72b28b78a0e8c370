"""Lazy draft sync's catch-up as the adaptive policy prices it (runtime/policy/catch_up_price.py;
runtime/policy/adaptive.py, step 6): the module docstrings' worked examples, the executor's count of
the entries behind, and the replay of the measured run whose adaptive policy lost to the schedule on
its catch-ups."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.policy.adaptive import AdaptivePolicy, AdaptiveSettings
from dynspec.runtime.policy.catch_up_price import CatchUpPrice, catch_up_price
from dynspec.runtime.policy.chunk_cost import with_fitted_chunks
from dynspec.runtime.policy.cost_model import CostModel, Profile
from dynspec.runtime.policy.step_decision import StepInputs
from dynspec.runtime.policy.step_prices import StepPrices

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_data"


def profile_doc(fixed: float = 1.0, per_entry: float = 0.0001) -> dict:
    """b 16 and 64 at context 128: K=0 6.4 ms (plain decode too), K=1 6.5 ms; the catch_up record of
    `profile --catch-up 100` on the line fixed + per_entry x entries."""
    k1 = 6.5
    return {"format": "dynspec-profile/2", "device": "synthetic", "context_lens": [128],
            "tables": [{"context_len": 128, "iteration_ms": {str(b): {"0": 6.4, "1": k1} for b in (16, 64)},
                        "decode_ms": {"16": 6.4, "64": 6.4}}],
            "catch_up": {"tokens": 100, "k": 1, "context_len": 128,
                         "ms": {str(b): k1 + fixed + per_entry * b * 100 for b in (16, 64)}}}


def policy(doc: dict, **settings) -> AdaptivePolicy:
    """The adaptive policy on the profile, its chunks priced 0.01 ms a token (the target) and 0.0031
    (the draft's pass, K > 0 only), the default prompt weight unless given."""
    cost = with_fitted_chunks(CostModel.from_profile(Profile.from_json(doc)),
                              StepPrices(chunk_ms_per_token=0.01, draft_chunk_ms_per_token=0.0031))
    return AdaptivePolicy(cost, AdaptiveSettings(calibrate=False, explore_steps=0, **settings))


def step(a: float, previous_k: int, waiting=(), behind: int = 0, lazy: bool = True) -> StepInputs:
    return StepInputs(16, 128.0, (a,), previous_k=previous_k, max_k=1, bucket=16, waiting=tuple(waiting),
                      token_budget=8192 if waiting else 0, lazy=lazy, behind=behind)


def test_the_price_is_the_profiles_catch_up_line():
    line = CatchUpPrice(1.0, 0.001)
    assert line.ms(100) == pytest.approx(1.1) and line.ms(100, 8) == pytest.approx(1.0125) and line.ms(0) == 0.0
    cost = CostModel.from_profile(Profile.from_json(profile_doc()))
    assert cost.catch_up.fixed_ms == pytest.approx(1.0) and cost.catch_up.ms_per_entry == pytest.approx(0.0001)
    bare = {k: v for k, v in profile_doc().items() if k != "catch_up"}
    assert CostModel.from_profile(Profile.from_json(bare)).catch_up is None
    bad = dict(profile_doc(), catch_up={"tokens": 100, "k": 3, "context_len": 128, "ms": {"16": 9.0}})
    with pytest.raises(DynspecError, match="field 'catch_up'"):
        CostModel.from_profile(Profile.from_json(bad))
    with pytest.raises(DynspecError, match="catch_up_horizon 0.5"):
        AdaptiveSettings(catch_up_horizon=0.5)


def test_a_drafting_state_holds_k_through_a_chunk_step_the_next_step_would_resume_from():
    """adaptive.py step 6's example: b = 16 at a = 0.3, one 128-token prompt ending beside the rows
    (w = 64). Unpriced, plain decode wins the step (gain_w(1) = 1.06 x 7.68 / 8.18 = 0.996); priced,
    K=0 leaves a 128-entry catch-up (1.0016 ms) to the next step, which drafts (1.3 x 6.4 / 7.50 =
    1.109), so t(0) = 8.68 and gain_w(1) = 1.125: K=1 holds."""
    x = step(0.3, previous_k=1, waiting=(128,))
    assert policy(profile_doc(), ttft_weight=64, price_catch_up=False).choose(x).k == 0
    d = policy(profile_doc(), ttft_weight=64).choose(x)
    assert d.k == 1 and d.gain == pytest.approx(1.06 * (7.68 + 1.0016) / (6.5 + 1.28 + 128 * 0.0031), rel=1e-6)
    # the next step, rows caught up by the refresh, its prompt's 128 entries behind: it resumes
    assert policy(profile_doc(), ttft_weight=64).choose(step(0.3, previous_k=0, behind=128)).k == 1
    # not lazy (warm or off): nothing to catch up, nothing priced
    assert policy(profile_doc(), ttft_weight=64).choose(replace(x, lazy=False)).k == 0


def test_a_pause_the_next_step_would_not_end_is_not_charged():
    """A 5 ms catch-up: the next step would not resume (1.3 x 6.4 / 11.5 = 0.72), so the chunk step's
    K=0 is the start of a stretch and pays nothing now."""
    x = step(0.3, previous_k=1, waiting=(128,))
    assert policy(profile_doc(fixed=5.0), ttft_weight=64).choose(x).k == 0


def test_a_resumption_pays_its_catch_up_with_the_entries_shared_by_the_horizon():
    """a = 0.15, 2000 entries behind: unpriced K=1 gains 1.15 x 6.4 / 6.5 = 1.132; the catch-up
    (1.0 + 0.0001 x 2000 / 8 = 1.025 ms) brings it to 1.15 x 6.4 / 7.525 = 0.978: plain decode."""
    x = step(0.15, previous_k=0, behind=2000)
    assert policy(profile_doc(), price_catch_up=False).choose(x).k == 1
    assert policy(profile_doc()).choose(x).k == 0
    assert policy(profile_doc()).choose(replace(x, behind=0)).k == 1    # nothing behind: nothing to pay


def test_the_executor_counts_the_entries_a_drafting_step_catches_up():
    """Each row's min(draft_behind, cap) - 1 (the refresh writes the newest): rows 0, 1, 5 and 300
    behind under a 256-entry store -> 0 + 0 + 4 + 255."""
    from dynspec.runtime.serving.planning import KDecider
    from dynspec.runtime.serving.requests import Request

    engine = SimpleNamespace(max_draft_len=1, max_num_tokens=64, max_batch_size=8, packs_rows=True, packs_rows_alone=True,
                             buckets=(1, 2, 4, 8), draft_sync_cap=256)
    rows = [Request(i, (1, 2), 8, frozenset(), 0.0, slot=i) for i in range(4)]
    for r, n in zip(rows, (0, 1, 5, 300)):
        r.draft_behind = n
    pol = policy(profile_doc())
    x = KDecider(engine, pol, False, lazy=True).inputs(rows, [10] * 4, (0.5,))
    assert x.lazy and x.behind == 259
    assert KDecider(engine, pol, False).inputs(rows, [10] * 4, (0.5,)).behind == 0


def test_the_replay_of_the_run_that_lost_to_its_schedule_on_catch_ups():
    """`serving` on one H100 at fec0955, C = 16: the adaptive policy served 1.383x baseline against the
    schedule's 1.441x; every K=0 step it took beside a prompt was followed by a catch-up. The replay,
    unpriced as that run served it, loses as the run did; priced, it serves within 1% of the schedule."""
    from dynspec.benchmarks.sim_run import simulate
    from dynspec.benchmarks.simulate import load_runs

    meta, run = next((m, r) for m, r in load_runs(DATA) if m["data_dir"] == "h100-fec0955" and m["config"] == "serving")
    flags = list(run.flags)
    flags[flags.index("--concurrency") + 1] = "16"
    flags[flags.index("--poisson-at") + 1] = ""                  # the closed loop alone
    assert flags[flags.index("--catch-up-price") + 1] == "off"   # the data set's adaptive_rule, as served
    tok = {}
    for priced in (False, True):
        flags[flags.index("--catch-up-price") + 1] = "on" if priced else "off"
        rows = simulate(replace(run, flags=tuple(flags)))
        by = {r["mode"]: r["output_tok_per_s"] for r in rows if r["concurrency"] == 16}
        tok[priced] = by["adaptive"] / by["dynamic"]
    measured = {m["mode"]: m["output_tok_per_s"] for m in meta["measured"] if m["load"] == "C=16"}
    assert tok[False] == pytest.approx(measured["adaptive"] / measured["dynamic"], abs=0.02)
    assert tok[False] < 0.975 and tok[True] > 0.99


def test_a_probe_under_lazy_sync_pays_its_whole_catch_up_and_drafts_only_the_rows_it_catches_up():
    """adaptive.py step 4 under lazy sync (_probe_gain): the docstring's worked example, then the
    iteration each probe comes at. b = 64 at a = 0.01 (K=0 is best), 200 entries a row behind
    (12800), budget 8192: 8064 entries fit beside the 128 verify tokens, so 63% of the rows draft;
    gain(1) = (1 + 0.01 x 0.63) x 6.4 / (6.5 + 1.0 + 0.8064) = 0.775, so the probe waits
    ceil(0.2247 / 0.005) = 45 iterations (amortized over 8 steps it was 1.01 x 6.4 / 7.66: 32);
    with nothing behind, gain(1) = 0.994 and the floor of 8 iterations holds."""
    from dynspec.runtime.policy.adaptive import _probe_gain

    x = StepInputs(256, 128.0, (0.55,), max_k=1, bucket=256, token_budget=8192, lazy=True, behind=35840)
    assert _probe_gain(x, 1.55, 11.94, 17.35, CatchUpPrice(0.8, 0.00045), 1.0) == pytest.approx(0.6178, abs=1e-4)
    p = policy(profile_doc(), ttft_weight=0)

    def first_probe(behind: int) -> int:
        at = StepInputs(64, 128.0, (0.01,), max_k=1, bucket=64, token_budget=8192, lazy=True, behind=behind)
        return next(n for n in range(1, 200) if p.choose(replace(at, since_spec=n)).probe)

    assert first_probe(12800) == 45
    assert first_probe(0) == 8
    assert p.choose(StepInputs(64, 128.0, (0.01,), max_k=1, bucket=64, token_budget=8192, lazy=True,
                               behind=12800, since_spec=44)).reason == "best"
