"""runtime/policy/per_row.py: per-row shrinkage, the split step cost, and the per-row K allocation against
an independent exhaustive oracle."""
from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance_estimate import AcceptanceEstimate
from dynspec.runtime.policy.cost_model import PROFILE_FORMAT, CostModel, Profile
from dynspec.runtime.policy.per_row import Allocation, SplitCost, allocate, brute_force, uniform_allocation
from dynspec.runtime.policy.row_table import RowTable


def cost_model(tables: dict, decode: dict | None = None) -> CostModel:
    """tables {context: {b: {K: ms}}}, decode {context: {b: ms}} -> CostModel via the profile reader."""
    doc = {"format": PROFILE_FORMAT, "device": "synthetic", "context_lens": sorted(tables),
           "tables": [{"context_len": c,
                       "iteration_ms": {str(b): {str(k): ms for k, ms in row.items()} for b, row in t.items()},
                       **({"decode_ms": {str(b): ms for b, ms in decode[c].items()}} if decode else {})}
                      for c, t in sorted(tables.items())]}
    return CostModel.from_profile(Profile.from_json(doc))


def linear_model(alpha: float, beta: float, chain: dict[int, float]) -> CostModel:
    """f(n) = alpha + beta n, ms_uniform(b, K) = f(b(K+1)) + chain[K], profiled at b 1 and 2."""
    f = lambda n: alpha + beta * n                                      # noqa: E731
    it = {b: {k: f(b * (k + 1)) + c for k, c in chain.items()} for b in (1, 2)}
    return cost_model({1024: it}, {1024: {1: f(1), 2: f(2)}})


def oracle(rates, cap, budget, alpha, beta, chain):
    """Best tokens/ms over every K vector, E and ms from first principles (no per_row code)."""
    best = 0.0
    for ks in itertools.product(range(cap + 1), repeat=len(rates)):
        v, m = len(ks) + sum(ks), max(ks)
        if v > budget or m not in chain:
            continue
        tokens = 0.0
        for row, k in zip(rates, ks):
            run = 1.0
            tokens += 1.0
            for a in row[:k]:
                run *= a
                tokens += run
        best = max(best, tokens / (alpha + beta * v + chain[m]))
    return best


# ---- the worked example (module docstring) -----------------------------------------------------------
WORKED = linear_model(10.0, 0.5, {0: 0.5, 1: 1.0, 2: 2.0})
WORKED_RATES = np.array([[0.9, 0.9], [0.5, 0.5], [0.1, 0.1]])


def test_worked_example_split_and_allocation():
    sc = SplitCost.at(WORKED, 3, 1024)
    assert sc.uniform_ms == pytest.approx((12.0, 14.0, 16.5))
    assert tuple(sc.chain_ms) == pytest.approx((0.5, 1.0, 2.0))
    assert sc.decode_ms == pytest.approx(11.5) and sc.ms(7, 2) == pytest.approx(15.5)
    a = allocate(WORKED_RATES, sc, 2, 100, sc.decode_ms)
    assert a.ks == (2, 2, 0) and a.reason == "best" and a.probed == ()
    assert a.expected_tokens == pytest.approx(5.46) and a.predicted_ms == pytest.approx(15.5)
    assert a.tokens_per_ms == pytest.approx(5.46 / 15.5) and a.verify_tokens == 7 and a.depth == 2
    assert a == brute_force(WORKED_RATES, sc, 2, 100)
    assert a.tokens_per_ms > 5.57 / 16.5 > 4.5 / 14.0 > 3 / 11.5       # uniform K=2, K=1, plain decode
    assert allocate(WORKED_RATES, sc, 1, 100, sc.decode_ms).ks == (1, 1, 0)   # 4.4 / 13.5
    u = uniform_allocation(WORKED_RATES, sc, 2, 100)                   # the best one K for every row
    assert u.ks == (2, 2, 2) and u.reason == "uniform" and u.expected_tokens == pytest.approx(5.57)
    assert u.predicted_ms == pytest.approx(16.5) and u.tokens_per_ms == pytest.approx(5.57 / 16.5)
    assert uniform_allocation(WORKED_RATES, sc, 2, 8).ks == (1, 1, 1)     # 9 tokens do not fit a budget of 8
    assert uniform_allocation(WORKED_RATES, sc, 0, 100) is None


# ---- 1. shrinkage (runtime/policy/row_table.py) -----------------------------------------------------------
def rates_after(steps, prior, weight, positions=None):
    """One slot's shrunk rates after (k, accepted) steps."""
    t = RowTable(2, positions or len(prior))
    for k, n in steps:
        t.update([1], [k], [n])
    return tuple(t.rates([1], prior, weight)[0])


def test_new_request_is_the_prior_and_a_worked_example():
    assert rates_after([], (0.6, 0.5, 0.4), 4.0) == pytest.approx((0.6, 0.5, 0.4))
    # 10 steps at K=1, 9 accepted: (9 + 4 x 0.6) / (10 + 4) = 0.814 at position 1; position 2 never tried
    r = rates_after([(1, 1)] * 9 + [(1, 0)], (0.6, 0.6), 4.0)
    assert r == pytest.approx(((9 + 2.4) / 14, 0.6)) and r[0] == pytest.approx(0.814, abs=5e-4)


def test_converges_to_its_own_rate_as_counts_grow():
    errs = []
    for n in (10, 100, 1000):
        r = rates_after([(1, 1)] * (9 * n // 10) + [(1, 0)] * (n // 10), (0.3,), 4.0)[0]
        errs.append(abs(r - 0.9))
    assert errs == sorted(errs, reverse=True) and errs[-1] < 1e-2 and errs[0] > 0.1


def test_update_counts_the_positions_tried_and_hit():
    t = RowTable(2, 4)
    t.update([1], [0], [0])
    assert t.trials[1].tolist() == [0, 0, 0, 0]
    t.update([1], [3], [1])                         # tried 1, 2 (2 rejected), 3 never tried
    assert t.hits[1].tolist() == [1, 0, 0, 0] and t.trials[1].tolist() == [1, 1, 0, 0]
    t.update([1], [3], [3])                         # all three accepted: position 4 not drafted
    assert t.hits[1].tolist() == [2, 1, 1, 0] and t.trials[1].tolist() == [2, 2, 1, 0]
    t.update([1], [2], [0])
    assert t.trials[1].tolist() == [3, 2, 1, 0]


def test_update_of_many_rows_equals_one_row_at_a_time():
    """A step's rows at once (arrays) and one row at a time (the one-row path) count alike, and
    both refuse more accepted than drafted."""
    rnd = random.Random(5)
    many, one = RowTable(8, 4), RowTable(8, 4)
    for _ in range(100):
        slots = rnd.sample(range(8), rnd.randint(2, 8))
        ks = [rnd.randint(0, 4) for _ in slots]
        ns = [rnd.randint(0, k) for k in ks]
        many.update(slots, ks, ns)
        for s, k, n in zip(slots, ks, ns):
            one.update([s], [k], [n])
    assert many.hits.tolist() == one.hits.tolist() and many.trials.tolist() == one.trials.tolist()
    for pool in ((0.7, 0.6, 0.5, 0.4), (0.7, 0.6), ()):           # a short pool repeats its last rate
        both = many.rates([2, 5], pool, 3.0)
        assert both.shape == (2, 4) and [many.rates([s], pool, 3.0)[0].tolist() for s in (2, 5)] == both.tolist()
    for slots in ([3], [3, 4]):
        with pytest.raises(DynspecError, match="exceeds the drafted"):
            many.update(slots, [1] * len(slots), [2] * len(slots))


def test_update_matches_the_pooled_estimate_for_one_row():
    rnd = random.Random(7)
    t, est = RowTable(2, 4), AcceptanceEstimate(positions=4, half_life=1e300)
    for _ in range(200):
        k = rnd.randint(0, 4)
        n = rnd.randint(0, k)
        t.update([1], [k], [n])
        est = est.update(k, [n])
    assert t.hits[1] == pytest.approx(est.hits) and t.trials[1] == pytest.approx(est.trials)


@pytest.mark.parametrize("call, match", [
    (lambda: RowTable(0, 2), "slots >= 1"),
    (lambda: RowTable(2, 2).update([0], [1], [2]), "exceeds the drafted"),
    (lambda: RowTable(2, 2).rates([0], (0.5, 0.5), 0.0), "weight 0.0"),
])
def test_bad_inputs_name_the_field(call, match):
    with pytest.raises(DynspecError, match=match):
        call()



# ---- 2. split cost ------------------------------------------------------------------------------------
def random_profile(rnd: random.Random, contexts=(512, 2048), bs=(1, 2, 4, 8), ks=(0, 1, 2, 3, 4), decode=True):
    """Increasing, non-linear (bent, noisy) times in b, K and context."""
    tables, dec = {}, {}
    for c in contexts:
        base = rnd.uniform(3, 8) * (1 + c / 8192)
        knee, slope = rnd.uniform(2, 16), rnd.uniform(0.05, 0.6)
        f = lambda n: base + slope * max(0.0, n - knee) + 0.02 * n + rnd.uniform(0, 0.05)   # noqa: E731
        dec[c] = {b: f(b) for b in bs}
        draft = rnd.uniform(0.1, 1.5)
        tables[c] = {b: {k: f(b * (k + 1)) * rnd.uniform(0.9, 1.1) + draft * k + 0.3 for k in ks} for b in bs}
    return cost_model(tables, dec if decode else None)


def test_split_cost_reproduces_the_uniform_table_at_every_profiled_point():
    rnd = random.Random(3)
    for decode in (True, False):
        cm = random_profile(rnd, decode=decode)
        for ci, ctx in enumerate(cm.context_lens):
            for bi, b in enumerate(cm.batch_sizes):
                sc = SplitCost.at(cm, b, ctx)
                for kj, k in enumerate(cm.draft_lens):
                    assert sc.ms(b * (k + 1), k) == pytest.approx(cm.ms[ci][bi][kj], rel=1e-12)
                plain = cm.decode[ci][bi] if decode else cm.ms[ci][bi][0]
                assert sc.f_ms[b] == pytest.approx(plain, rel=1e-12)
                assert (sc.chain_ms[0] == pytest.approx(cm.ms[ci][bi][0] - plain)) and (decode or sc.chain_ms[0] == 0)


def test_f_is_the_cost_models_plain_step_everywhere_it_is_read():
    cm = random_profile(random.Random(5))
    for ctx in (100, 512, 1300, 2048, 5000):            # below, at, between, above the contexts
        for b in (1, 3, 8):
            sc = SplitCost.at(cm, b, ctx)
            assert len(sc.f_ms) == b * 5 + 1 and sc.extrapolated == (b * 5 > 8 or not 512 <= ctx <= 2048)
            for n in range(1, b * 5 + 1):               # up to 40 tokens: past the profiled b=8
                assert sc.f_ms[n] == pytest.approx(cm.row(n, ctx)[1], rel=1e-12)
            assert sc.uniform_ms == cm.row(b, ctx)[0]


def test_unprofiled_depths_are_never_priced():
    cm = cost_model({1024: {1: {0: 5.0, 2: 7.0}, 4: {0: 6.0, 2: 9.0}}}, {1024: {1: 4.8, 4: 5.7}})
    sc = SplitCost.at(cm, 3, 1024)
    assert math.isinf(sc.chain_ms[1]) and math.isinf(sc.ms(5, 1)) and math.isfinite(sc.ms(5, 2))
    a, opt = allocate(np.full((3, 2), 0.95), sc, 2, 100), brute_force(np.full((3, 2), 0.95), sc, 2, 100)
    assert a.ks == opt.ks == (2, 2, 2) and a.tokens_per_ms == pytest.approx(opt.tokens_per_ms, rel=1e-12)
    with pytest.raises(DynspecError, match=r"probes need K=1 profiled \(profiled K: \[0, 2\]\)"):
        allocate(np.full((3, 2), 0.01), sc, 2, 100, 0.1, probe_rows=[0])
    with pytest.raises(DynspecError, match="V=2, m=0 is not a step of b=3 rows"):
        sc.ms(2, 0)
    with pytest.raises(DynspecError, match="batch size 0"):
        SplitCost.at(cm, 0, 1024)


# ---- 3. allocation against the oracles ---------------------------------------------------------------
def random_rates(rnd: random.Random, b: int, cap: int) -> np.ndarray:
    kind = rnd.random()
    if kind < 0.3:                                       # ties and the ends of [0, 1]
        return np.array([[rnd.choice((0.0, 0.5, 0.7, 0.9, 1.0)) for _ in range(cap)] for _ in range(b)])
    return np.array([[rnd.uniform(0, 1) ** rnd.choice((0.3, 1, 3)) for _ in range(cap)] for _ in range(b)])


@pytest.mark.parametrize("falling", [False, True])
def test_allocation_is_exact_with_linear_f(falling):
    """Non-decreasing chain: the top-c prefixes alone are exact. A chain that falls with m (a noisy
    profile) needs the forced sets too (exact for b <= FORCED_ROWS)."""
    rnd = random.Random(11 + falling)
    for _ in range(300):
        b, cap = rnd.randint(1, 5), rnd.randint(0, 4)
        chain, c = {}, rnd.uniform(0, 1)
        for k in range(5):
            chain[k], c = c, (c + rnd.uniform(0, 3) if not falling else rnd.uniform(0, 4))
        alpha, beta = rnd.uniform(2, 20), rnd.uniform(0, 2)
        sc = SplitCost.at(linear_model(alpha, beta, chain), b, 1024)
        rates = random_rates(rnd, b, cap)
        budget = rnd.randint(b, b * (cap + 1) + 2)
        a = allocate(rates, sc, cap, budget)
        want = oracle(rates.tolist(), cap, budget, alpha, beta, chain)
        assert a.tokens_per_ms == pytest.approx(want, rel=1e-9)
        assert brute_force(rates, sc, cap, budget).tokens_per_ms == pytest.approx(want, rel=1e-9)
        check_consistent(a, rates, sc, cap, budget)


def check_consistent(a: Allocation, rates, sc: SplitCost, cap: int, budget: int) -> None:
    """The allocation's own numbers recomputed from its ks, and the guarantees."""
    assert len(a.ks) == sc.b and all(0 <= k <= cap for k in a.ks) and a.verify_tokens <= budget
    tokens = sum(1 + sum(np.prod(row[:j]) for j in range(1, k + 1)) for row, k in zip(rates, a.ks))
    assert a.expected_tokens == pytest.approx(tokens, rel=1e-9)
    if a.reason != "plain decode":
        assert a.predicted_ms == pytest.approx(sc.ms(a.verify_tokens, a.depth), rel=1e-12)


def test_allocation_is_near_optimal_on_profiled_nonlinear_costs():
    rnd = random.Random(13)
    worst = 1.0
    for _ in range(300):
        cm = random_profile(rnd)
        b, cap = rnd.randint(1, 5), rnd.randint(0, 4)
        sc = SplitCost.at(cm, b, rnd.choice((512, 1000, 2048, 3000)))
        rates = random_rates(rnd, b, cap)
        budget = rnd.randint(b, b * (cap + 1) + 2)
        a, opt = allocate(rates, sc, cap, budget), brute_force(rates, sc, cap, budget)
        assert a.tokens_per_ms <= opt.tokens_per_ms * (1 + 1e-12)
        worst = min(worst, a.tokens_per_ms / opt.tokens_per_ms)
        check_consistent(a, rates, sc, cap, budget)
    assert worst >= 0.995
    assert worst == pytest.approx(1.0, rel=1e-12)          # b <= FORCED_ROWS: exact


# ---- guarantees ---------------------------------------------------------------------------------------
def test_plain_decode_when_it_wins():
    sc = SplitCost.at(WORKED, 3, 1024)
    low = np.full((3, 2), 0.1)
    a = allocate(low, sc, 2, 100, sc.decode_ms)
    assert a == Allocation((0, 0, 0), 3.0, 11.5, 3 / 11.5, "plain decode")
    assert allocate(low, sc, 2, 100).reason == "best"       # no decode_ms: the scan's own best
    rnd = random.Random(17)
    for _ in range(100):
        rates = random_rates(rnd, 3, 2)
        decode = rnd.uniform(8, 16)
        a = allocate(rates, sc, 2, 100, decode)
        assert a.tokens_per_ms >= 3 / decode and (a.reason == "plain decode") == (a.ks == (0, 0, 0))


def test_caps_and_token_budget():
    sc = SplitCost.at(WORKED, 3, 1024)
    high = np.full((3, 2), 0.99)
    assert allocate(high, sc, 2, 100).ks == (2, 2, 2)
    assert allocate(high, sc, 1, 100).ks == (1, 1, 1)
    assert allocate(high, sc, 0, 100).ks == (0, 0, 0)
    assert allocate(WORKED_RATES, sc, 2, 4).ks == (1, 0, 0)            # V <= 4: one draft, the best row
    assert allocate(WORKED_RATES, sc, 2, 3).ks == (0, 0, 0)
    assert allocate(high[:, :1], sc, 1, 100).ks == (1, 1, 1)            # rates narrower than the profile
    assert allocate(np.full((3, 6), 0.99), sc, 6, 100).depth == 2       # cap above the profiled K: lowered


def test_probes_raise_rows_at_zero_and_are_priced():
    sc = SplitCost.at(WORKED, 3, 1024)
    a = allocate(WORKED_RATES, sc, 2, 100, sc.decode_ms, probe_rows=[2, 0])
    assert a.ks == (2, 2, 1) and a.reason == "probe" and a.probed == (2,)
    assert a.expected_tokens == pytest.approx(5.56) and a.predicted_ms == pytest.approx(16.0)
    low = np.full((3, 2), 0.1)
    p = allocate(low, sc, 2, 100, sc.decode_ms, probe_rows=[1])
    assert p.ks == (0, 1, 0) and p.predicted_ms == pytest.approx(13.0) and p.expected_tokens == pytest.approx(3.1)
    tight = allocate(WORKED_RATES, sc, 2, 4, None, probe_rows=[2])     # the probe's token kept in reserve
    assert tight.ks == (0, 0, 1) and tight.verify_tokens == 4
    assert allocate(WORKED_RATES, sc, 2, 3, None, probe_rows=[2]).ks == (0, 0, 0)   # no room
    assert allocate(WORKED_RATES, sc, 0, 100, None, probe_rows=[2]).ks == (0, 0, 0)  # cap 0: none
    assert allocate(WORKED_RATES, sc, 2, 100, None, probe_rows=[0]).reason == "best"  # already drafting


@pytest.mark.parametrize("kwargs, match", [
    (dict(rates=np.full((2, 2), 0.5)), r"shape \(2, 2\); it must be \[b=3"),
    (dict(rates=np.full((3, 2), np.nan)), "in \\[0, 1\\]"),
    (dict(cap=3), "cap 3 is not an integer in 0..2"),
    (dict(token_budget=2), "token_budget 2 is below b=3"),
    (dict(decode_ms=-1.0), "decode_ms -1.0"),
    (dict(probe_rows=[3]), "probe_rows entry 3"),
])
def test_allocate_refuses_bad_inputs(kwargs, match):
    args = dict(rates=WORKED_RATES, cost=SplitCost.at(WORKED, 3, 1024), cap=2, token_budget=100) | kwargs
    with pytest.raises(DynspecError, match=match):
        allocate(**args)


def test_runs_at_256_rows():
    """Not timed here; on a 2-core CPU host SplitCost.at takes ~50 us and allocate ~150 us."""
    cm = random_profile(random.Random(19), bs=(1, 16, 64, 256))
    sc = SplitCost.at(cm, 256, 1024)
    rates = np.random.default_rng(0).uniform(0.2, 1.0, (256, 4))
    a = allocate(rates, sc, 4, 1024, sc.decode_ms, probe_rows=range(0, 256, 16))
    assert len(a.ks) == 256 and a.verify_tokens <= 1024 and max(a.ks) <= 4
    ties = np.random.default_rng(1).choice([0.5, 1.0], (256, 4))       # equal gains: prefixes must hold
    lin = SplitCost.at(linear_model(5.0, 0.01, {0: 0.2, 1: 0.5, 2: 0.8, 3: 1.1, 4: 1.4}), 256, 1024)
    for budget in (300, 500, 700):
        a = allocate(ties, lin, 4, budget)
        assert a.verify_tokens == budget and a.depth >= 1
        check_consistent(a, ties, lin, 4, budget)


def test_calibrated_split_cost_scales_each_uniform_step_and_plain_decode():
    """calibrated(scales): every profiled uniform (b, K) costs s_K times its profile (K=0: the
    keep-warm slot), plain decode s_0 times; an empty scale tuple changes nothing."""
    from dynspec.runtime.policy.cost_model import ContextTable, CostModel, Profile
    from dynspec.runtime.policy.per_row import SplitCost

    bs = (1, 4, 16)
    tables = tuple(ContextTable(c, {b: {k: 5 + 0.3 * b * (k + 1) + 0.7 * k for k in range(4)} for b in bs},
                                {b: 4.8 + 0.3 * b for b in bs}) for c in (64, 256))
    cost = SplitCost.at(CostModel.from_profile(Profile("synthetic", tables)), 4, 100.0)
    scales = (1.02, 1.10, 1.07, 1.04, 1.05, 1.3, 1.2)     # K = 0..3, keep-warm, cold, ragged
    cal = cost.calibrated(scales)
    for k, ms in zip(cost.draft_lens, cost.uniform_ms):
        s = scales[4] if k == 0 else scales[k]
        assert cal.ms(4 * (k + 1), k) == pytest.approx(s * ms)
    assert cal.decode_ms == pytest.approx(1.02 * cost.decode_ms)
    assert cost.calibrated(()) is cost


def test_ragged_split_cost_scales_every_vector_alike():
    """ragged(scales): f, chain and the floor times the ragged slot's ratio (so allocate picks the
    profile's vector, at that price), plain decode times s_0; the docstring's example."""
    sc = SplitCost.at(WORKED, 3, 1024)
    scales = (1.02, 1.1, 1.3, 1.05, 1.4, 1.2)            # K = 0..2, keep-warm, cold, ragged
    rg = sc.ragged(scales)
    assert rg.f_ms.tolist() == pytest.approx([1.2 * x for x in sc.f_ms.tolist()])
    assert rg.chain_ms.tolist() == pytest.approx([1.2 * x for x in sc.chain_ms.tolist()])
    assert (rg.floor_ms, rg.decode_ms) == pytest.approx((1.2 * sc.floor_ms, 1.02 * sc.decode_ms))
    rates = np.array([[0.9, 0.9], [0.5, 0.5], [0.1, 0.1]])
    a, b = allocate(rates, sc, 2, 9), allocate(rates, rg, 2, 9)
    assert a.ks == b.ks == (2, 2, 0) and b.predicted_ms == pytest.approx(1.2 * a.predicted_ms)
    assert sc.ragged(()) is sc


def test_the_small_scan_equals_the_numpy_scan(monkeypatch):
    """b x cap <= SMALL runs in plain Python: the same K vectors, tokens and ms as the numpy scan
    (ties included), on random rates and profiled costs whose chain does not fall; and
    uniform_allocation's plain-Python gains pick the numpy sum's K."""
    from dynspec.runtime.policy import per_row

    rnd = random.Random(17)
    cases = 0
    for _ in range(400):
        cm = random_profile(rnd)
        b, cap = rnd.randint(1, 4), rnd.randint(1, 4)
        sc = SplitCost.at(cm, b, rnd.choice((512, 1000, 2048)))
        chain = sc.chain_ms.tolist()
        if any(x > y for x, y in zip(chain[1:cap], chain[2:cap + 1])):
            continue
        rates, budget = random_rates(rnd, b, cap), rnd.randint(b, b * (cap + 1) + 2)
        small, uniform = allocate(rates, sc, cap, budget), uniform_allocation(rates, sc, cap, budget)
        with monkeypatch.context() as m:
            m.setattr(per_row, "SMALL", 0)
            assert allocate(rates, sc, cap, budget) == small
            numpy_uniform = uniform_allocation(rates, sc, cap, budget)
            assert (numpy_uniform is None) == (uniform is None)
            if uniform is not None:                        # the gains summed in another order: to rounding
                assert numpy_uniform.ks == uniform.ks
                assert numpy_uniform.tokens_per_ms == pytest.approx(uniform.tokens_per_ms, rel=1e-12)
        cases += 1
    assert cases >= 100
