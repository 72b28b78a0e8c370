"""Per-request draft length in the executor and the reference engine: each row verifies and
accepts at most its own K_i, and the output stays transformers greedy (float64, CPU), with K_i
flipping every iteration, arrivals and prompt chunks in flight, serial and overlapped loops, the
eager path and the whole-forward functions; plus the row table and the censored pooled update."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from dynspec.runtime.policy.acceptance_estimate import AcceptanceEstimate
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.loop import Loop
from dynspec.runtime.policy.per_request import RowInputs
from dynspec.runtime.serving.plan import make_plan
from dynspec.runtime.policy import Policy
from dynspec.runtime.policy.row_table import RowTable
from dynspec.runtime.generate.session import tiny_pair_dirs
from dynspec.runtime.policy.step_decision import StepDecision, StepInputs
from tests.helpers_lockstep import serve_arrivals
from tests.test_executor import greedy_many

DT = torch.float64


class FlipRows:
    """A row policy for tests: each row's K_i drawn afresh every iteration from 0..max_k (seeded),
    so K_i < K rows, K = 0 iterations and every mix between them occur."""
    def __init__(self, max_draft_len: int, seed: int = 0):
        self.max_draft_len, self.rng, self.seen = max_draft_len, random.Random(seed), []

    drafts = True
    chooses_keep_warm = False

    def choices(self, batch_size: int) -> tuple[int, ...]:
        return tuple(range(self.max_draft_len + 1))

    def row_rates(self, table, slots, pool, keys, truth):
        return table.rates(slots, pool, 4.0)

    def decide(self, x: StepInputs) -> StepDecision:
        assert x.rates.shape == (x.batch_size, self.max_draft_len) and len(x.idle) == x.batch_size
        ks = tuple(self.rng.randint(0, x.max_k) for _ in range(x.batch_size))
        self.seen.append(x)
        return StepDecision(ks, keep_warm=True, policy="per-request")


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoTokenizer, LlamaForCausalLM

    target, draft = tiny_pair_dirs()
    return target, draft, AutoTokenizer.from_pretrained(target), LlamaForCausalLM.from_pretrained(target, dtype=DT).eval()


@pytest.mark.parametrize("loop,whole", [(Loop.SERIAL, False), (Loop.OVERLAPPED, False), (Loop.SERIAL, True)],
                         ids=["serial", "overlapped", "whole"])
def test_per_row_k_flipping_every_step_is_lossless(tiny, loop, whole):
    from dynspec.corpus import default_prompts

    target, draft, tok, hf = tiny
    eng = load_reference_engine(target, draft, dtype=DT, max_batch_size=4, max_seq_len=128, max_draft_len=4,
                                max_num_tokens=24)
    wholes = []
    if whole:
        eng.capture_whole_graphs()     # CPU: the whole-forward functions, run uncaptured
        eng.on_dispatch = lambda key: isinstance(key, tuple) and wholes.append(key)
    ps = default_prompts(tok, n=8, length=28)
    lens = [random.Random(i).randint(8, 24) for i in range(len(ps))]
    policy = FlipRows(4, seed=3)
    ex = Executor(eng, policy, stats_limit=None, loop=loop)
    assert isinstance(policy, Policy)
    handles = serve_arrivals(ex, ps, lens, random.Random(7))
    refs = greedy_many(hf, ps, 24)
    assert [h.result().output_ids for h in handles] == [r[:n] for r, n in zip(refs, lens)]

    stats = [s for s in ex.stats if s.batch_size]
    assert all(s.policy == "per-request" for s in stats)
    mixed_k = [s for s in stats if s.drafted not in (0, s.batch_size * s.k)]
    assert len(mixed_k) >= 5                                   # rows at different K in one step
    assert any(s.prefill_tokens for s in mixed_k)              # ... with prompt chunks riding along
    if whole:                                                  # every mixed or per-row iteration: rows unpadded
        assert len(wholes) == sum(1 for s in ex.stats if s.prefill_tokens or s in mixed_k)
        assert all(Np == eng.whole.bucket(s.drafted + s.batch_size + s.prefill_tokens)
                   for (Np, *_), s in zip(wholes, [s for s in ex.stats if s.prefill_tokens or s in mixed_k]))
    res = [h.result() for h in handles]
    assert all(r.drafted >= r.accepted_drafts and r.decode_steps >= 1 for r in res)
    # overlapped: the step launched before a request's end was known counts in the stats only
    same = (lambda a, b: a == b) if loop is Loop.SERIAL else (lambda a, b: a <= b)
    assert same(sum(r.accepted_drafts for r in res), sum(s.accepted for s in stats))
    assert same(sum(r.drafted for r in res), sum(s.drafted for s in stats))
    assert 0.0 < sum(r.accepted_drafts for r in res) / sum(r.drafted for r in res) <= 1.0


def test_a_row_accepts_no_more_than_its_own_k(tiny):
    """One step, two rows on the same prompt (the draft agrees with the target on it), K = 3 with
    row_k (3, 1): the second row accepts at most 1, and both emit transformers' tokens."""
    from dynspec.corpus import default_prompts
    from dynspec.runtime.policy.acceptance import Greedy

    target, draft, tok, hf = tiny
    eng = load_reference_engine(target, draft, dtype=DT, max_batch_size=2, max_seq_len=96, max_draft_len=3)
    prompt = default_prompts(tok, n=1, length=24)[0]
    ref = greedy_many(hf, [prompt], 8)[0]
    slots = [eng.reserve(len(prompt) + 8, key=i) for i in range(2)]
    from dynspec.runtime.serving.plan import PromptChunk

    first = make_plan(0, (), (), (), False, eng.buckets,
                      chunks=[PromptChunk(s, 0, tuple(prompt), None) for s in slots])
    out = eng.step(first, Greedy())
    assert out.first_tokens == (ref[0], ref[0])
    step = make_plan(3, (len(prompt),) * 2, (ref[0],) * 2, (False, False), False, eng.buckets, slots=slots,
                     row_k=(3, 1))
    res = eng.step(step, Greedy())
    assert res.accepted[0] >= 2, "the tiny pair's draft should agree here"     # else the cap goes unseen
    assert res.accepted[1] == 1
    for n, em in zip(res.accepted, res.emitted):
        assert len(em) == n + 1 and tuple(em) == tuple(ref[1:2 + n])


def test_make_plan_checks_row_k():
    with pytest.raises(ValueError, match="row_k"):
        make_plan(2, (5, 6), (1, 1), (False, False), False, (1, 2), row_k=(1, 1))     # max is not K
    with pytest.raises(ValueError, match="row_k"):
        make_plan(2, (5, 6), (1, 1), (False, False), False, (1, 2), row_k=(2,))
    p = make_plan(2, (5, 6), (1, 1), (False, False), False, (1, 2), row_k=(0, 2))
    assert p.per_row and p.decode_tokens == 4
    assert not make_plan(2, (5, 6), (1, 1), (False, False), False, (1, 2)).per_row


def test_row_table_counts_and_shrinkage():
    """The module docstring's worked example, then a row admitted again starts at the pool."""
    t = RowTable(slots=4, positions=2)
    for n in (2, 2, 2, 0):
        t.update([1], [2], [n])
    assert t.trials[1].tolist() == [4, 3] and t.hits[1].tolist() == [3, 3]
    r = t.rates([1, 2], (0.6, 0.5), 4.0)
    assert r[0] == pytest.approx([5.4 / 8, 5.0 / 7]) and r[1] == pytest.approx([0.6, 0.5])
    t.update([2, 2], [1, 2], [1, 0])                 # one slot twice in a step: both counted
    assert t.trials[2].tolist() == [2, 0] and t.hits[2].tolist() == [1, 0]
    t.reset(1)
    assert t.rates([1], (0.6, 0.5), 4.0)[0] == pytest.approx([0.6, 0.5])
    with pytest.raises(Exception, match="exceeds"):
        t.update([0], [1], [2])


def test_pooled_update_does_not_count_a_row_capped_at_its_k_as_a_rejection():
    est = AcceptanceEstimate(prior=0.5, positions=3, half_life=1e12)
    per_row = est.update(3, (1, 2), row_k=(3, 2))
    assert [round(x, 9) for x in per_row.trials] == [2, 2, 0] and [round(x, 9) for x in per_row.hits] == [2, 1, 0]
    uniform = est.update(3, (1, 2))                  # both rows at K=3: the second rejected at 3
    assert [round(x, 9) for x in uniform.trials] == [2, 2, 1] and [round(x, 9) for x in uniform.hits] == [2, 1, 0]
    np.testing.assert_allclose(est.update(2, (1, 2), row_k=(2, 2)).trials, est.update(2, (1, 2)).trials)


def linear_split_cost(kmax=4, base=10.0, per_token=0.5, per_draft=0.6):
    """ms(b, K) = base + per_token x b(K+1) + per_draft x K at every b and context; decode_ms
    the same at K=0 without the keep-warm (per_draft x 0.25 less)."""
    from dynspec.runtime.policy.cost_model import ContextTable, CostModel, Profile

    bs = (1, 2, 4, 8, 16)
    tables = tuple(ContextTable(c, {b: {k: base + per_token * b * (k + 1) + per_draft * k + (0.15 if k == 0 else 0)
                                        for k in range(kmax + 1)} for b in bs},
                                {b: base + per_token * b for b in bs}) for c in (64, 512))
    return CostModel.from_profile(Profile("synthetic", tables))


def test_per_request_policy_gives_easy_requests_more_drafts_than_hard_ones():
    """Bernoulli acceptance, half the requests at 0.9 and half at 0.1 (a benchmark model: random
    weights), verify tokens at 0.5 ms each: each request's mean K follows its own rate, the hard
    ones near 0 (below 0.7: in steps where no vector beats the batch-level decision by the margin,
    every row takes that decision's K), the easy ones at 2 and more; the batch-level adaptive policy
    gives both the same K (low: the hard rows' drafts cost as much as the easy rows')."""
    from dynspec.runtime.policy.acceptance import BernoulliMix, rate_of
    from dynspec.runtime.policy.adaptive import AdaptivePolicy, AdaptiveSettings
    from dynspec.runtime.serving.driver import run_closed_loop
    from dynspec.runtime.policy.per_request import PerRequestPolicy
    from tests.helpers_models import make_tiny_pair

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t, d = make_tiny_pair(tmp, vocab=96, hidden=32, layers=3, heads=2, kv_heads=1, seed=1, draft_vocab=64,
                              draft_seed=2)
        model = BernoulliMix(((0.9, 0.5), (0.1, 0.5)), seed=4)
        ps = [tuple(random.Random(i).randrange(96) for _ in range(8)) for i in range(16)]
        out = {}
        for name, policy in (("per-request", PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))),
                             ("adaptive", AdaptivePolicy(linear_split_cost(), AdaptiveSettings(calibrate=False)))):
            eng = load_reference_engine(t, d, dtype=torch.float32, max_batch_size=8, max_seq_len=160, max_draft_len=4)
            eng.capture_whole_graphs()          # per-row K packed (CPU: the whole-forward functions, uncaptured)
            ex = Executor(eng, policy, acceptance=model, allow_lossy=True, stats_limit=None)
            res = run_closed_loop(ex, ps, 96, concurrency=8)
            by_rate = {}
            for r in res:
                by_rate.setdefault(rate_of(model, r.request_id), []).append(r.mean_k)
            out[name] = {p: sum(v) / len(v) for p, v in by_rate.items()}
        easy, hard = out["per-request"][0.9], out["per-request"][0.1]
        assert easy >= 1.8 and hard <= 0.7 and easy - hard >= 1.5, out
        assert abs(out["adaptive"][0.9] - out["adaptive"][0.1]) < 0.5, out       # one K for both


def test_trace_replay_on_the_engine_accepts_the_recorded_runs(tmp_path):
    """TraceReplay on the reference engine: each row accepts min(r, K_i), r its request's recorded
    run at its pending position (acceptance.accept_lengths, the host's reading of the trace)."""
    from dynspec.runtime.policy.acceptance import TraceReplay, accept_lengths
    from dynspec.runtime.serving.plan import PromptChunk
    from tests.helpers_models import make_tiny_pair

    trace = TraceReplay(str(Path(__file__).parents[1] / "benchmarks" / "traces" / "tiny_pair.json"), seed=1)
    t, d = make_tiny_pair(tmp_path, vocab=96, hidden=32, layers=3, heads=2, kv_heads=1, seed=1, draft_vocab=64,
                          draft_seed=2)
    eng = load_reference_engine(t, d, dtype=torch.float32, max_batch_size=6, max_seq_len=96, max_draft_len=4)
    keys = [3, 11, 12, 40, 41, 77]
    slots = [eng.reserve(80, key=k) for k in keys]
    lens = [5, 9, 6, 12, 7, 10]
    first = make_plan(0, (), (), (), False, eng.buckets,
                      chunks=[PromptChunk(s, 0, tuple(range(1, n + 1)), None) for s, n in zip(slots, lens)])
    firsts = eng.step(first, trace).first_tokens
    pos, pend, seen = list(lens), list(firsts), set()
    for step in range(12):
        row_k = tuple((step + i) % 5 for i in range(6))
        plan = make_plan(max(row_k), pos, pend, (True,) * 6 if step == 0 else (False,) * 6, False, eng.buckets,
                         slots=slots, row_k=row_k)
        res = eng.step(plan, trace)
        want = [accept_lengths(trace, k, p, kk) for k, p, kk in zip(keys, pos, row_k)]
        assert list(res.accepted) == want, (step, res.accepted, want)
        seen.update(want)
        pos = [p + n + 1 for p, n in zip(pos, res.accepted)]
        pend = [em[-1] for em in res.emitted]
    assert len(seen) >= 3                                    # runs of several lengths replayed


def test_probes_ride_along_a_drafting_step_or_come_together():
    """Rows at K=0 for PROBE_EVERY iterations draft one token: beside rows that draft anyway, or
    all in one step once the whole batch has sat at K=0 that long, never one row a step alone."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.per_request import PROBE_EVERY, PerRequestPolicy

    policy = PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))
    low = np.full((4, 4), 0.02)
    due, fresh = [PROBE_EVERY, PROBE_EVERY + 3, 0, 0], [0, 0, 0, 0]

    def decide(rates, idle, since):
        return policy.decide_rows(RowInputs(4, 100.0, (0.5,) * 4, rates, np.asarray(idle), 4, True, since))

    assert decide(low, due, PROBE_EVERY - 1).ks == (0, 0, 0, 0)             # plain decode, nobody probes yet
    d = decide(low, due, PROBE_EVERY)
    assert d.ks == (1, 1, 0, 0) and d.probes == (0, 1) and d.probe
    assert decide(low, fresh, PROBE_EVERY).ks == (0, 0, 0, 0)               # no row is due
    mixed = low.copy()
    mixed[2:] = 0.95
    d = decide(mixed, due, 0)                                               # rows 2, 3 draft: 0, 1 ride along
    assert d.ks[0] == d.ks[1] == 1 and min(d.ks[2:]) >= 2 and d.probes == (0, 1)
    assert decide(mixed, fresh, 0).ks[:2] == (0, 0)


def test_one_k_for_every_row_when_it_is_within_the_margin():
    """Rows at nearly one rate: the per-row optimum gains under the margin (2%) over the best
    uniform K, so every row takes that K (the pure-decode graphs); a bimodal batch keeps its vector."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.per_request import PerRequestPolicy
    from dynspec.runtime.policy.per_row import SplitCost, allocate

    policy = PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))
    near = np.clip(0.7 + np.random.default_rng(0).normal(0, 0.08, (8, 4)), 0, 1)   # rates 0.7 +- 0.08

    def decide(rates):
        return policy.decide_rows(RowInputs(8, 100.0, (0.7,) * 4, rates, np.zeros(8), 4, True, 0))

    raw = allocate(near, SplitCost.at(policy.cost, 8, 96), 4, 40, None)
    assert raw.ks == (2, 2, 2, 1, 2, 2, 2, 2)                               # the optimum alone: per-row, by 0.1%
    d = decide(near)
    assert len(set(d.ks)) == 1 and d.ks[0] >= 1 and d.reason == "uniform"
    bimodal = np.array([[0.95] * 4] * 4 + [[0.1] * 4] * 4)
    assert len(set(decide(bimodal).ks)) > 1


def test_ragged_steps_are_priced_by_their_own_served_ratio():
    """A bimodal batch (4 rows at 0.95, 4 at 0.1) takes a per-row vector at the profile's price;
    served ragged steps measured 30% above their profile (the ragged slot at 1.3, the uniform
    slots at 1.0) make every row take one K; a 10% ratio leaves the vector, whose gain is larger."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.per_request import PerRequestPolicy

    policy = PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))
    bimodal = np.array([[0.95] * 4] * 4 + [[0.1] * 4] * 4)

    def decide(ragged):
        scales = (1.0,) * 7 + (ragged,)                 # K = 0..4, keep-warm, cold, ragged
        return policy.decide_rows(RowInputs(8, 100.0, (0.5,) * 4, bimodal, np.zeros(8), 4, True, 0, scales))

    assert len(set(decide(1.0).ks)) > 1 and len(set(decide(1.1).ks)) > 1
    d = decide(1.3)
    assert len(set(d.ks)) == 1 and d.ks[0] >= 1 and d.reason == "uniform"


def test_a_dear_ragged_price_never_hides_a_uniform_k_nor_prices_one():
    """Every row at 0.5: one K beats plain decode at the uniform steps' own price, so a ragged
    slot at 1.3 (which makes every vector lose at its price) still gets K >= 1 for every row. Rates
    0.4 with the uniform slots at 1.3 and the ragged slot at 1.0: a uniform vector at the ragged
    price would beat plain decode but loses at its own, so plain decode."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.per_request import PerRequestPolicy

    policy = PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))

    def decide(rate, scales):
        return policy.decide_rows(RowInputs(8, 100.0, (rate,) * 4, np.full((8, 4), rate), np.zeros(8), 4, True, 0,
                                            scales))

    d = decide(0.5, (1.0,) * 7 + (1.3,))
    assert len(set(d.ks)) == 1 and d.ks[0] >= 1 and d.gain > 1
    d = decide(0.4, (1.0,) + (1.3,) * 4 + (1.0, 1.3, 1.0))
    assert (d.ks, d.reason) == ((0,) * 8, "plain decode")


def test_an_engine_that_pads_rows_gets_one_k_for_every_row():
    """Engine.packs_rows False (rows padded to max K_i): a row below the max would pay for tokens
    it cannot accept, so the bimodal batch takes one K; low rates give plain decode, and its probe
    is K=1 for every row."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.per_request import PROBE_EVERY, PerRequestPolicy

    policy = PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))
    bimodal = np.array([[0.95] * 4] * 4 + [[0.1] * 4] * 4)

    def decide(rates, idle, since):
        return policy.decide_rows(RowInputs(8, 100.0, (0.5,) * 4, rates, np.asarray(idle), 4, True, since,
                                            packed=False))

    d = decide(bimodal, [0] * 8, 0)
    assert len(set(d.ks)) == 1 and d.ks[0] >= 1 and d.reason == "uniform"
    low = np.full((8, 4), 0.02)
    d = decide(low, [0] * 8, PROBE_EVERY)
    assert (d.ks, d.reason, d.keep_warm) == ((0,) * 8, "plain decode", False)
    d = decide(low, [PROBE_EVERY] * 2 + [0] * 6, PROBE_EVERY)
    assert d.ks == (1,) * 8 and d.probes == tuple(range(8)) and d.reason == "probe"   # every row probed
    assert d.predicted_ms == pytest.approx(policy._split(8, 96).step_ms(16, 1))


def test_a_ragged_step_is_calibrated_in_its_own_slot():
    """KDecider.record: a per-row plan (rows at different K_i) goes to the ragged slot, a uniform
    one to its K's."""
    from types import SimpleNamespace

    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.cost_calibration import CostCalibration
    from dynspec.runtime.policy.per_request import PerRequestPolicy
    from dynspec.runtime.serving.planning import KDecider
    from dynspec.runtime.serving.plan import StepResult

    engine = SimpleNamespace(max_draft_len=4, max_num_tokens=64, max_batch_size=2, packs_rows=True, packs_rows_alone=True, buckets=(1, 2))
    k = KDecider(engine, PerRequestPolicy(linear_split_cost(), AdaptiveSettings()), True)
    for row_k, slot in (((2, 1), CostCalibration(max_k=4).slot(2, False, ragged=True)), ((2, 2), 2)):
        plan = make_plan(2, (9, 9), (1, 1), (False, False), False, (1, 2), slots=(0, 1), row_k=row_k)
        launched = SimpleNamespace(plan=plan, decision=SimpleNamespace(predicted_ms=12.0))
        k.record(launched, StepResult(accepted=(1, 1), emitted=((1, 2), (1, 2)), draft_warm=True), 0.015)
        assert k.pending[3] == slot


def test_a_row_whose_probes_fail_is_probed_ever_more_rarely():
    """probe_interval's example; a row with one probe behind it is due at twice PROBE_EVERY, not
    before; the executor counts a row's probes and clears them when it drafts otherwise."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.per_request import PROBE_BACKOFF, PROBE_EVERY, PerRequestPolicy, probe_interval

    assert probe_interval((0, 1, 5), 3) == [PROBE_EVERY, 2 * PROBE_EVERY, PROBE_EVERY << PROBE_BACKOFF]
    assert probe_interval((), 2) == [PROBE_EVERY] * 2
    policy = PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False))
    low = np.full((2, 4), 0.02)

    def decide(idle, probes):
        return policy.decide_rows(RowInputs(2, 100.0, (0.5,) * 4, low, np.asarray(idle), 4, True, 10 ** 6,
                                            probes=probes))

    assert decide([PROBE_EVERY] * 2, (1, 0)).probes == (1,)                # row 0 backs off
    assert decide([2 * PROBE_EVERY - 1, 0], (1, 0)).ks == (0, 0)
    assert decide([2 * PROBE_EVERY, 0], (1, 0)).probes == (0,)

    from types import SimpleNamespace

    from dynspec.runtime.serving.planning import KDecider
    from dynspec.runtime.serving.requests import Request

    class Scripted(PerRequestPolicy):                      # the rows' K's given, as a probe or not
        def decide_rows(self, x):
            ks, probes = script.pop(0)
            return StepDecision(ks, keep_warm=True, predicted_ms=None, gain=None, probes=probes)

    engine = SimpleNamespace(max_draft_len=4, max_num_tokens=64, max_batch_size=2, packs_rows=True, packs_rows_alone=True, buckets=(1, 2))
    k = KDecider(engine, Scripted(linear_split_cost(), AdaptiveSettings(calibrate=False)), True)
    rows = [Request(i, (1, 2), 8, frozenset(), 0.0, slot=i) for i in range(2)]
    script = [((1, 0), (0,)), ((0, 0), ()), ((1, 1), (0, 1)), ((2, 0), ())]
    seen = []
    for _ in range(4):
        k.decide(rows, [4, 4], (0.5,) * 4)
        seen.append([(r.idle, r.probes) for r in rows])
    assert seen == [[(0, 1), (1, 0)], [(1, 1), (2, 0)], [(0, 2), (0, 1)], [(0, 0), (1, 1)]]


def test_no_probes_without_a_profiled_k1_and_the_cap_0_tier_runs_as_the_schedule():
    """A profile without K=1 leaves rows at K=0 unprobed (a probe's cost is unknown) instead of
    failing the iteration; at a b the schedule caps at K=0 the policy keeps the draft warm as the
    schedule does and reports the profile's own (unscaled) time."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.cost_model import ContextTable, CostModel, Profile
    from dynspec.runtime.policy.per_request import PROBE_EVERY, PerRequestPolicy
    from dynspec.runtime.policy import DraftSchedule

    bs = (1, 4, 16)
    tables = tuple(ContextTable(c, {b: {k: 10 + 0.5 * b * (k + 1) + 0.6 * k for k in (0, 2, 4)} for b in bs},
                                {b: 10 + 0.5 * b for b in bs}) for c in (64, 512))
    no_k1 = PerRequestPolicy(CostModel.from_profile(Profile("synthetic", tables)), AdaptiveSettings(calibrate=False))
    x = RowInputs(2, 100.0, (0.5,) * 4, np.full((2, 4), 0.02), np.array([PROBE_EVERY + 8] * 2), 4, True, PROBE_EVERY + 8)
    assert no_k1.decide_rows(x).ks == (0, 0)
    capped = PerRequestPolicy(linear_split_cost(), AdaptiveSettings(calibrate=False), cap=DraftSchedule.parse("1:4"))
    x = RowInputs(2, 100.0, (0.9,) * 4, np.full((2, 4), 0.9), np.zeros(2), 4, True, 0, (1.5,) * 8)
    d = capped.decide_rows(x)
    raw = capped._split(2, 96)
    assert d.ks == (0, 0) and d.keep_warm and d.predicted_ms == pytest.approx(raw.step_ms(2, 0))


def test_the_pooled_estimate_decays_by_the_rows_that_drafted():
    est = AcceptanceEstimate(prior=0.5, positions=2, half_life=1.0)
    seeded = est.update(1, (1,))                                      # one trial at position 1
    per_row = seeded.update(1, (0, 0, 1), row_k=(0, 0, 1))            # one row drafted: one half-life
    assert per_row.trials[0] == pytest.approx(seeded.trials[0] * 0.5 + 1)


def test_a_per_row_plan_below_the_least_bucket_pads_up_to_a_captured_key(tiny):
    """Per-row K captures no graph more: a chunked plan whose per-row tokens fall below its row
    shape's least captured bucket takes the first captured bucket above (engine._whole_key)."""
    target, draft, _, _ = tiny
    eng = load_reference_engine(target, draft, dtype=DT, max_batch_size=4, max_seq_len=128, max_draft_len=4,
                                max_num_tokens=64)
    eng.capture_whole_graphs()
    eng.whole.graphs = {(32, 4, 3, True): None, (48, 4, 3, True): None, (16, 4, 2, True): None}
    assert eng.whole.captured_above((16, 4, 3, True)) == (32, 4, 3, True)
    assert eng.whole.captured_above((32, 4, 3, True)) == (48, 4, 3, True)
    assert eng.whole.captured_above((48, 4, 3, True)) is None
    assert eng.whole.captured_above((16, 4, 3, False)) is None       # another row shape: never borrowed


def test_the_batch_floor_scores_one_k_on_the_rows_own_rates():
    """The pooled estimate is measured on the rows that drafted: after a vector that drafts only
    the 0.95 rows of a 0.95 / 0.05 batch it reads 0.95, and the batch-level K for every row
    looks far better than it is. The floor scores that K on the rows' own rates, so the
    vector (easy rows drafting, hard rows at K=0) stands; with a pool that is right (the rows'
    mean) the choice is the same."""
    from dynspec.runtime.policy.adaptive import AdaptiveSettings
    from dynspec.runtime.policy.per_request import PerRequestPolicy

    policy = PerRequestPolicy(linear_split_cost(per_token=0.1, per_draft=0.3), AdaptiveSettings(calibrate=False))
    rates = np.array([[0.95] * 4] * 3 + [[0.05] * 4] * 13)

    def decide(pool):
        batch = StepInputs(16, 100.0, (pool,) * 4, max_k=4, bucket=16)
        return policy.decide_rows(RowInputs(16, 100.0, (pool,) * 4, rates, np.zeros(16), 4, True, 0, batch=batch))

    assert policy.choose(StepInputs(16, 100.0, (0.95,) * 4, max_k=4, bucket=16)).k >= 3   # the biased pool
    for pool in (0.95, 0.22):
        d = decide(pool)
        assert {k for k in d.ks[3:]} == {0} and min(d.ks[:3]) >= 2, (pool, d)
