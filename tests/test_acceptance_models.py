"""Per-request benchmark acceptance models (runtime/policy/acceptance.py) and the reference engine's
per-slot rates: parsing, the rate each request key gets, and the engine's draws at those rates."""
import math
import random

import pytest
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import (Bernoulli, BernoulliMix, Greedy, Shift, draft_uniforms, key_uniform,
                                        parse_acceptance, rate_of, resolve)
from dynspec.runtime.serving.driver import run_closed_loop
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.policy import DraftSchedule
from tests.helpers_models import make_tiny_pair

DT = torch.float64


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("pair"), vocab=96, hidden=32, layers=4, heads=4, kv_heads=2, seed=1,
                          draft_vocab=64, draft_seed=2)


def engine(pair, max_batch=8, kmax=4):
    return load_reference_engine(*pair, dtype=DT, max_batch_size=max_batch, max_seq_len=64, max_draft_len=kmax)


def test_parse_round_trips_and_models():
    assert parse_acceptance("real") == Greedy() and rate_of(Greedy(), 3) is None
    assert parse_acceptance("bernoulli:0.7", seed=2) == Bernoulli(0.7, 2)
    mix = parse_acceptance("bernoulli-mix:0.9@0.5,0.2@0.5", seed=4)
    assert mix == BernoulliMix(((0.9, 0.5), (0.2, 0.5)), 4)
    assert parse_acceptance("shift:0.8,0.2@0.5") == Shift(0.8, 0.2, 0.5)
    assert parse_acceptance("shift:0.8,0.2@100") == Shift(0.8, 0.2, 100)
    for text in ("bernoulli:0.7", "bernoulli-mix:0.9@0.5,0.2@0.5", "shift:0.8,0.2@0.5", "shift:0.8,0.2@100",
                 "bernoulli-mix:0.1@0.3333333333333333,0.5@0.6666666666666667"):
        m = parse_acceptance(text)
        assert str(m) == text and parse_acceptance(str(m)) == m and not m.lossless


@pytest.mark.parametrize("text, says", [
    ("bernoulli-mix:0.9@0.5,0.2@0.4", "weights sum to 0.9, not 1"),
    ("bernoulli-mix:0.9@0.5,1.2@0.5", "rate 1.2"),
    ("bernoulli-mix:0.9@0.5,0.2", "is not 'real'"),
    ("bernoulli-mix:", "is not 'real'"),
    ("shift:0.8,0.2@1.0", "not a fraction in (0, 1)"),
    ("shift:0.8,1.5@0.5", "shift rate after 1.5"),
    ("shift:0.8@0.5", "is not 'real'"),
    ("bernoulli:2", "outside [0, 1]"),
])
def test_bad_text_is_one_line_naming_it(text, says):
    with pytest.raises(DynspecError) as e:
        parse_acceptance(text)
    msg = str(e.value)
    assert repr(text) in msg and says in msg and "\n" not in msg


def test_weights_sum_within_1e9():
    BernoulliMix(((0.9, 0.5), (0.2, 0.5 + 5e-10)))
    with pytest.raises(DynspecError, match="sum to"):
        BernoulliMix(((0.9, 0.5), (0.2, 0.5 + 5e-9)))


def test_mix_rate_is_a_fixed_hash_of_seed_and_key_in_proportion():
    """Each key's rate is the same on every call; over 20,000 keys each part's share is its
    weight within 0.015 (sd of a share at 0.3 over 20,000 keys: 0.0032, so about 4.6 sd)."""
    mix = BernoulliMix(((0.9, 0.2), (0.5, 0.3), (0.1, 0.5)), seed=7)
    keys = range(20000)
    rates = [rate_of(mix, k) for k in keys]
    assert rates == [rate_of(BernoulliMix(mix.parts, seed=7), k) for k in keys]
    for rate, weight in mix.parts:
        assert abs(rates.count(rate) / len(rates) - weight) < 0.015
    other = [rate_of(BernoulliMix(mix.parts, seed=8), k) for k in keys]
    assert sum(a != b for a, b in zip(rates, other)) > 0.4 * len(keys)          # another seed picks anew
    # the pick is by key_uniform against the cumulative weights 0.2, 0.5, 1.0
    for k in range(50):
        u = key_uniform(7, k)
        assert rate_of(mix, k) == (0.9 if u < 0.2 else 0.5 if u < 0.5 else 0.1)


def test_shift_changes_rate_at_its_key_and_resolves_per_run():
    s = Shift(0.8, 0.2, 10)
    assert [rate_of(s, k) for k in (0, 9, 10, 11, 500)] == [0.8, 0.8, 0.2, 0.2, 0.2]
    half = parse_acceptance("shift:0.8,0.2@0.5")
    with pytest.raises(DynspecError, match="resolve"):
        rate_of(half, 0)
    assert resolve(half, 40) == Shift(0.8, 0.2, 20)
    assert resolve(half, 40, first_key=2) == Shift(0.8, 0.2, 22)
    assert resolve(half, 3) == Shift(0.8, 0.2, 2)          # round(1.5) = 2
    assert resolve(s, 40) is s and resolve(Bernoulli(0.5), 4) == Bernoulli(0.5)
    with pytest.raises(DynspecError, match="no shift point"):
        resolve(half, 0)


def test_engine_accept_reads_the_slot_rate(pair):
    """engine.accept draws row r with slot_p[slot of r]: set at reserve (key -> rate_of) and refilled
    when the model changes; a row whose slot rate is forced to 1 or 0 accepts all or none."""
    eng = engine(pair)
    mix = BernoulliMix(((0.9, 0.5), (0.2, 0.5)), seed=3)
    slots = [eng.reserve(20, key=k) for k in (5, 6, 7, 8)]
    eng.slots.set_acceptance(mix)
    assert eng.slot_p[slots].tolist() == pytest.approx([rate_of(mix, k) for k in (5, 6, 7, 8)])
    late = eng.reserve(20, key=9)                                  # reserved after the model is set
    assert eng.slot_p[late].item() == pytest.approx(rate_of(mix, 9))
    eng.slots.set_acceptance(Shift(0.8, 0.2, 7))
    assert eng.slot_p[slots + [late]].tolist() == pytest.approx([0.8, 0.8, 0.2, 0.2, 0.2])
    B, K = 5, 4
    rows = slots + [late]
    eng.slot[:B] = torch.tensor(rows)
    eng.pos[:B] = torch.tensor([3, 4, 5, 6, 7])
    D = torch.zeros(B, K, dtype=torch.long)
    g = torch.ones(B, K + 1, dtype=torch.long)                     # greedy would accept nothing
    u = draft_uniforms(eng.accept_seed, eng.slot_key[eng.slot[:B]], eng.pos[:B, None] + torch.arange(1, K + 1))
    want = (u < eng.slot_p[eng.slot[:B]][:, None]).long().cumprod(1).sum(1)
    n, _ = eng.accept(D, g)
    assert torch.equal(n, want)
    eng.slot_p[rows[0]], eng.slot_p[rows[1]] = 1.0, 0.0
    n, _ = eng.accept(D, g)
    assert n[0].item() == K and n[1].item() == 0 and torch.equal(n[2:], want[2:])


def test_engine_bernoulli_draws_are_unchanged(pair):
    """Bernoulli(p): every slot's rate is float32(p), so u < slot_p is u < p exactly as one scalar."""
    eng = engine(pair)
    slots = [eng.reserve(20, key=k) for k in range(6)]
    eng.slots.set_acceptance(Bernoulli(0.7, seed=5))
    assert eng.accept_seed.item() == 5
    assert torch.equal(eng.slot_p[slots], torch.full((6,), 0.7, dtype=torch.float32))
    eng.slot[:6] = torch.tensor(slots)
    eng.pos[:6] = torch.arange(6) + 3
    u = draft_uniforms(5, torch.arange(6), eng.pos[:6, None] + torch.arange(1, 4))
    scalar = (u < torch.tensor(0.7, dtype=torch.float32)).long().cumprod(1).sum(1)
    n, _ = eng.accept(torch.zeros(6, 3, dtype=torch.long), torch.ones(6, 4, dtype=torch.long))
    assert torch.equal(n, scalar)


def _run(pair, model, n_requests, k=4, concurrency=6, out=20):
    """Closed loop at static K; every drafting row-step as (request key, position, K, accepted)."""
    eng = engine(pair)
    keys, seen, real_reserve, real_step = {}, [], eng.reserve, eng.step

    def reserve(tokens, key=0):
        slot = real_reserve(tokens, key)
        if slot is not None:
            keys[slot] = key
        return slot

    def step(plan, acc):
        res = real_step(plan, acc)
        if plan.k:
            seen.extend((keys[s], p, plan.k, a) for s, p, a in zip(plan.slots, plan.positions, res.accepted))
        return res

    eng.reserve, eng.step = reserve, step
    rng = random.Random(11)
    prompts = [[rng.randrange(96) for _ in range(rng.randint(3, 10))] for _ in range(n_requests)]
    run_closed_loop(Executor(eng, DraftSchedule.static(k, 16), acceptance=model, allow_lossy=True),
                    prompts, out, concurrency)
    return seen


def _trial_rate(rows):
    """Each examined draft is one Bernoulli(p) trial: accepted ones, plus one rejection per row-step
    that stopped short of K -> (accepted / trials, trials)."""
    acc = sum(a for _, _, _, a in rows)
    trials = acc + sum(1 for _, _, k, a in rows if a < k)
    return acc / trials, trials


def _check_rows(rows, model, seed):
    """Every row-step accepted exactly the prefix draft_uniforms(seed, key, pos+i) < rate_of(key)."""
    for key, pos, k, a in rows:
        u = draft_uniforms(seed, torch.tensor([key]), torch.tensor([[pos + i for i in range(1, k + 1)]]))[0]
        assert a == int((u < torch.tensor(rate_of(model, key), dtype=torch.float32)).long().cumprod(0).sum())


def _check_group(rows, rate):
    """The group's trial rate is within 4.5 sd of its model rate (sd = sqrt(p(1-p)/trials))."""
    got, trials = _trial_rate(rows)
    assert trials >= 150, trials
    assert abs(got - rate) < 4.5 * math.sqrt(rate * (1 - rate) / trials) + 1e-9, (got, rate, trials)


def test_executor_runs_a_mix_at_each_requests_rate(pair):
    mix = parse_acceptance("bernoulli-mix:0.9@0.5,0.2@0.5", seed=3)
    rows = _run(pair, mix, 40)
    _check_rows(rows, mix, 3)
    high = [r for r in rows if rate_of(mix, r[0]) == 0.9]
    low = [r for r in rows if rate_of(mix, r[0]) == 0.2]
    assert {r[0] for r in high} and {r[0] for r in low}
    _check_group(high, 0.9)
    _check_group(low, 0.2)


def test_executor_runs_a_shift_changing_rate_at_its_key(pair):
    """shift:0.9,0.2@0.5 over a run of 40 requests: keys 0..19 at 0.9, keys 20..39 at 0.2."""
    model = resolve(parse_acceptance("shift:0.9,0.2@0.5", seed=1), 40)
    assert model == Shift(0.9, 0.2, 20, 1)
    rows = _run(pair, model, 40)
    _check_rows(rows, model, 1)
    _check_group([r for r in rows if r[0] < 20], 0.9)
    _check_group([r for r in rows if r[0] >= 20], 0.2)
