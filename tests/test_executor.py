"""The executor + reference engine are lossless: every request's output equals
`transformers` greedy generation of the target, token for token, whatever K the policy picks
per iteration (float64 on both sides, so no near-tie can flip an argmax)."""
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynspec.errors import DynspecError
from dynspec.runtime.serving.driver import run_closed_loop
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.policy import DraftSchedule
from tests.helpers_models import make_tiny_pair

DT = torch.float64


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("pair"), vocab=96, hidden=64, layers=5, heads=4, kv_heads=2, seed=1,
                          draft_vocab=64, draft_seed=2)


@pytest.fixture(scope="module")
def hf_target(pair):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(pair[0], dtype=DT).eval()


_oracle_cache: dict = {}


def greedy_many(hf, prompts_, n: int, chunk: int = 64) -> list[tuple[int, ...]]:
    """transformers `generate` (greedy), batched with left padding and an explicit attention
    mask; in float64 padding changes logits by ~1e-13, far below any argmax margin here."""
    todo = sorted({tuple(p) for p in prompts_ if (id(hf), tuple(p), n) not in _oracle_cache})
    for i in range(0, len(todo), chunk):
        batch = todo[i: i + chunk]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0, eos_token_id=None)
        for p, row in zip(batch, out[:, width:].tolist()):
            _oracle_cache[(id(hf), p, n)] = tuple(row)
    return [_oracle_cache[(id(hf), tuple(p), n)] for p in prompts_]


def greedy(hf, prompt, n):
    return greedy_many(hf, [prompt], n)[0]


def engine(pair, max_batch=16, max_seq=96, kmax=8):
    return load_reference_engine(*pair, dtype=DT, max_batch_size=max_batch, max_seq_len=max_seq, max_draft_len=kmax)


def prompts(n, seed=0, lo=3, hi=20, vocab=96):
    rng = random.Random(seed)
    return [tuple(rng.randrange(vocab) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


@pytest.mark.parametrize(
    "policy",
    [DraftSchedule.static(3, 64), DraftSchedule(), DraftSchedule.threshold(4, 3), DraftSchedule.parse("2:5,5:2,8:1")],
    ids=["static3", "k0", "threshold", "tiers"],
)
def test_lossless_under_policies(pair, hf_target, policy):
    eng = engine(pair)
    ps = prompts(12, seed=3)
    res = run_closed_loop(Executor(eng, policy), ps, 20, concurrency=6)
    assert [r.output_ids for r in res] == greedy_many(hf_target, ps, 20)


def test_the_fields_failure_case_concurrency_10_threshold_5_k_15(pair, hf_target):
    """The users' crash: 10 requests x 16 draft tokens vs a decode batch. Here K is decided
    before the batch is shaped, so the fallback to K=0 above batch 5 is just another plan."""
    eng = engine(pair, max_batch=10, max_seq=80, kmax=15)
    ex = Executor(eng, DraftSchedule.threshold(max_draft_len=15, disable_above=5))
    ps = prompts(14, seed=4)
    res = run_closed_loop(ex, ps, 24, concurrency=10)
    assert {s.k for s in ex.stats} == {0, 15}
    assert any(s.batch_size == 10 and s.k == 0 for s in ex.stats)
    assert [r.output_ids for r in res] == greedy_many(hf_target, ps, 24)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tiers=st.lists(st.tuples(st.integers(1, 10), st.integers(0, 6)), min_size=1, max_size=3),
    seed=st.integers(0, 10_000),
)
def test_lossless_under_generated_schedules_and_random_arrivals(pair, hf_target, tiers, seed):
    bounds = sorted({b for b, _ in tiers})
    ks = sorted((k for _, k in tiers), reverse=True)[: len(bounds)]
    policy = DraftSchedule(tuple(zip(bounds, ks)))
    eng = engine(pair, max_batch=6, kmax=6)
    ex = Executor(eng, policy)
    rng = random.Random(seed)
    ps = prompts(8, seed=seed)
    lens = [rng.randint(1, 16) for _ in ps]
    handles, i = [], 0
    while i < len(ps) or ex.active or ex.waiting:
        while i < len(ps) and rng.random() < 0.5:      # random arrivals between iterations
            handles.append(ex.submit(ps[i], lens[i]))
            i += 1
        if not ex.step() and i < len(ps):
            handles.append(ex.submit(ps[i], lens[i]))
            i += 1
    refs = greedy_many(hf_target, ps, 16)
    for ref, n, h in zip(refs, lens, handles):
        assert h.result().output_ids == ref[:n]


def test_soak_500_requests_schedule_flipping(pair, hf_target):
    """500 random-length requests, a policy whose tiers flip K at almost every batch size;
    all complete, all lossless, and no row leaks (rows stay a prefix; none left at the end)."""
    eng = engine(pair, max_batch=12, max_seq=64, kmax=5)
    policy = DraftSchedule.parse("1:5,3:4,5:3,7:2,9:1")
    ex = Executor(eng, policy)
    rng = random.Random(7)
    ps = [tuple(rng.randrange(96) for _ in range(rng.randint(1, 12))) for _ in range(500)]
    lens = [rng.randint(1, 12) for _ in ps]
    handles, i = [], 0
    while i < len(ps) or ex.active or ex.waiting:
        for _ in range(rng.randint(0, 3)):
            if i < len(ps):
                handles.append(ex.submit(ps[i], lens[i]))
                i += 1
        if rng.random() < 0.05 and ex.active:
            handles[rng.randrange(len(handles))].cancel()   # cancellations free rows too
        ex.step()
    assert ex.active == 0 and ex.waiting == 0
    assert len({s.k for s in ex.stats}) >= 4
    refs = greedy_many(hf_target, ps, 12)            # greedy is a prefix-stable oracle: truncate to n
    for ref, n, h in zip(refs, lens, handles):
        r = h.result()
        if r.finish_reason == "cancelled":
            assert r.output_ids == ref[: len(r.output_ids)]
        else:
            assert r.finish_reason == "length" and r.output_ids == ref[:n]


def test_stop_ids_end_a_request_early(pair, hf_target):
    eng = engine(pair)
    p = prompts(1, seed=11)[0]
    ref = greedy(hf_target, p, 20)
    stop = ref[5]
    r = run_closed_loop(Executor(eng, DraftSchedule.static(4, 16)), [p], 20, 1, stop_ids=[stop])[0]
    assert r.finish_reason == "stop" and r.output_ids == ref[: ref.index(stop) + 1]


def test_prompt_longer_than_the_cache_is_refused_clearly(pair):
    ex = Executor(engine(pair, max_seq=32, kmax=4), DraftSchedule.static(4, 16))
    with pytest.raises(DynspecError, match="exceeds the cache length max_seq_len=32"):
        ex.submit(list(range(30)), 4)
    with pytest.raises(DynspecError, match="max_new_tokens=0"):
        ex.submit([1, 2], 0)
    with pytest.raises(DynspecError, match="empty"):
        ex.submit([], 3)


def test_requests_wait_for_a_free_row_and_nothing_crashes(pair, hf_target):
    eng = engine(pair, max_batch=2)
    ex = Executor(eng, DraftSchedule.static(3, 2))
    ps = prompts(5, seed=12)
    hs = [ex.submit(p, 6) for p in ps]          # 5 requests, 2 rows
    st = ex.step()                              # both prompts in one iteration: no decode row yet
    assert st.decode_rows == 0 and st.prefill_tokens == sum(map(len, ps[:2])) and ex.waiting == 3
    assert ex.step().batch_size == 2
    ex.run_until_idle()
    assert [h.result().output_ids for h in hs] == greedy_many(hf_target, ps, 6)


def test_bernoulli_acceptance_is_refused_outside_benchmarks(pair):
    from dynspec.runtime.policy.acceptance import Bernoulli

    with pytest.raises(DynspecError, match="only benchmarks"):
        Executor(engine(pair), DraftSchedule.static(2, 4), acceptance=Bernoulli(0.7))
    ex = Executor(engine(pair), DraftSchedule.static(4, 16), acceptance=Bernoulli(0.7), allow_lossy=True)
    run_closed_loop(ex, prompts(6, seed=5), 30, 6)
    spec = [s for s in ex.stats if s.k]
    rate = sum(s.accepted for s in spec) / sum(s.drafted for s in spec)
    assert 0.3 < rate < 0.75     # E[prefix]/K for p=0.7, K=4 is 0.55


def test_stats_are_bounded_and_pollable(pair):
    ex = Executor(engine(pair), DraftSchedule.static(2, 16), stats_limit=5)
    run_closed_loop(ex, prompts(4, seed=9), 12, 4)
    assert len(ex.stats) == 5
    last = ex.stats[-1].iteration
    assert [s.iteration for s in ex.stats] == list(range(last - 4, last + 1))
    assert [s.iteration for s in ex.stats_since(last - 1)] == [last - 1, last]


def test_bad_prompt_lines_name_the_file_and_line(tmp_path):
    from dynspec.runtime.serving.driver import read_prompts

    f = tmp_path / "in.jsonl"
    f.write_text('{"id": "a", "input_ids": [1, 2]}\n\n{"id": "b", "input_ids": [1, \n')
    with pytest.raises(DynspecError, match=rf"{f}:3: not valid JSON"):
        read_prompts(f, None)
    f.write_text('{"id": "a", "input_ids": []}\n')
    with pytest.raises(DynspecError, match=rf"{f}:1: field 'input_ids'"):
        read_prompts(f, None)
    f.write_text('{"id": "a", "prompt": "x"}\n')
    with pytest.raises(DynspecError, match="needs a tokenizer"):
        read_prompts(f, None)
    with pytest.raises(DynspecError, match="does not exist"):
        read_prompts(tmp_path / "missing.jsonl", None)
    f.write_text('{"id": "a", "input_ids": [3]}\n{"prompt_id": 1}\n')
    with pytest.raises(DynspecError, match=rf"{f}:2: needs field 'input_ids' or 'prompt'"):
        read_prompts(f, None)


def test_a_failing_prefill_finishes_its_requests_and_stop_cancels_the_rest(pair):
    """Clients never hang: requests popped for a prefill that raises end as "error", and
    stop() ends whatever is still running or waiting as "cancelled"."""
    eng = engine(pair, max_batch=2)

    def boom(plan, acceptance):
        raise RuntimeError("simulated device failure in prefill")

    ex = Executor(eng, DraftSchedule.static(2, 2))
    real = eng.step
    eng.step = boom
    h = ex.submit([1, 2, 3], 4)
    with pytest.raises(RuntimeError, match="simulated"):
        ex.step()                            # the prompt-only iteration
    assert h.done and h.result().finish_reason == "error" and list(h.stream(timeout=1)) == []
    ex.step()
    assert eng.free_blocks == eng.blocks.num_blocks - 1     # its blocks went back
    eng.step = real
    ex = Executor(eng, DraftSchedule.static(2, 2))
    hs = [ex.submit([1, 2, 3], 50) for _ in range(3)]
    ex.start()
    next(hs[0].stream(timeout=30))           # the loop is running
    ex.stop()
    assert all(x.done for x in hs)
    assert {x.result().finish_reason for x in hs} <= {"cancelled", "length"}


# ---- issue 13 (5, 6, 11, 12) and issue 14 (4, 5, 6): the executor under a careless client ----

def test_stats_since_survives_a_loop_thread_appending(pair):
    """Issue 13.5: polling while the loop appends raised "deque mutated during iteration"."""
    import sys
    import threading

    ex = Executor(engine(pair), DraftSchedule.static(2, 16), stats_limit=4)
    errors, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            try:
                ex.stats_since(0)
            except RuntimeError as e:
                errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=poll)
    t.start()
    try:
        run_closed_loop(ex, prompts(6, seed=21), 24, 6)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert errors == []


def test_no_token_lands_after_cancel(pair):
    """Issue 13.6: cancel() while an iteration runs (as a client thread does); the tokens of
    that iteration are neither appended nor streamed."""
    eng = engine(pair)
    ex = Executor(eng, DraftSchedule.static(3, 16))
    h = ex.submit(prompts(1, seed=22)[0], 40)
    ex.step()
    before = h.tokens()
    real = eng.step

    def cancelled_midway(plan, acceptance):
        out = real(plan, acceptance)
        h.cancel()                       # the client cancels while the device works
        return out

    eng.step = cancelled_midway
    ex.step()
    assert h.tokens() == before and sum(h.stream(timeout=1), []) == before
    assert h.result().finish_reason == "cancelled"


def test_out_of_vocabulary_ids_are_refused_at_submit_and_hurt_nobody(pair, hf_target):
    """Issue 14.4: an id past the vocabulary (or negative) is refused at submit; the running
    requests finish normally and the executor takes new work."""
    ex = Executor(engine(pair), DraftSchedule.static(2, 16))
    ps = prompts(3, seed=23)
    hs = [ex.submit(p, 8) for p in ps]
    ex.step()
    for bad in ([1, 2, 96], [1, -1], [10**23]):
        with pytest.raises(DynspecError, match=r"outside the vocabulary 0\.\.95"):
            ex.submit(bad, 5)
    ex.run_until_idle()
    assert [h.result().output_ids for h in hs] == greedy_many(hf_target, ps, 8)
    h = ex.submit(ps[0], 4)
    ex.run_until_idle()
    assert h.result().output_ids == greedy(hf_target, ps[0], 4)


def test_a_failing_step_fails_only_its_requests_and_the_loop_goes_on(pair, hf_target):
    """An engine error in one iteration ends that iteration's requests as "error"; the
    background loop keeps serving the next ones."""
    eng = engine(pair, max_batch=2)
    serves_on_after_a_failing(Executor(eng, DraftSchedule.static(2, 2)), eng, "step", 2, hf_target)


def serves_on_after_a_failing(ex, eng, method: str, nth: int, hf_target) -> None:
    """eng.<method> raises on its nth call: the request then running ends as "error", one step
    error is counted, and a later request is served with transformers' greedy tokens."""
    real, calls = getattr(eng, method), []

    def flaky(plan, acceptance):
        calls.append(plan)
        if len(calls) == nth:
            raise RuntimeError(f"simulated device failure in {method}")
        return real(plan, acceptance)

    setattr(eng, method, flaky)
    first = ex.submit([1, 2, 3], 20)
    ex.start()
    try:
        list(first.stream(timeout=30))
        assert first.result().finish_reason == "error"
        p = prompts(1, seed=24)[0]
        later = ex.submit(p, 6)
        list(later.stream(timeout=30))
        assert later.result().output_ids == greedy(hf_target, p, 6)
        assert ex.step_errors == 1
    finally:
        ex.stop()


def test_submit_after_stop_raises_at_once(pair):
    """Issue 14.5: submit after stop() used to hang its stream forever."""
    ex = Executor(engine(pair), DraftSchedule.static(2, 16))
    ex.start()
    ex.stop()
    with pytest.raises(DynspecError, match="stopped"):
        ex.submit([1, 2, 3], 4)
    ex2 = Executor(engine(pair), DraftSchedule.static(2, 16))
    ex2.stop()
    with pytest.raises(DynspecError, match="stopped"):
        ex2.submit([1, 2, 3], 4)


def test_a_cancelled_queued_request_ends_at_the_next_iteration(pair):
    """Issue 14.6: a cancelled request still waiting for a row ended only when a row freed."""
    ex = Executor(engine(pair, max_batch=1), DraftSchedule.static(2, 16))
    running = ex.submit([1, 2, 3], 40)
    queued = ex.submit([4, 5, 6], 40)
    ex.step()
    queued.cancel()
    ex.step()
    assert queued.done and queued.result().finish_reason == "cancelled" and queued.tokens() == []
    assert not running.done and ex.waiting == 0


def test_engines_keep_their_own_kernels_and_random_state(pair):
    """Issue 13.11: one engine's fused kernels are not switched on for every engine, and the
    Bernoulli model's draws leave the global torch RNG alone (they are a hash: acceptance.py)."""
    from dynspec.runtime.policy.acceptance import Bernoulli

    fused = load_reference_engine(*pair, dtype=DT, max_batch_size=2, max_seq_len=64, max_draft_len=4,
                                  fused_kernels=True)
    plain = engine(pair)
    assert fused.target.kernels.compiled and not plain.target.kernels.compiled
    assert fused.draft.kernels is fused.target.kernels and not plain.draft.kernels.compiled   # the draft's glue too
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    ex = Executor(plain, DraftSchedule.static(4, 16), acceptance=Bernoulli(0.5, seed=3), allow_lossy=True)
    run_closed_loop(ex, prompts(3, seed=25), 12, 3)
    assert torch.equal(torch.get_rng_state(), state)
    again = Executor(engine(pair), DraftSchedule.static(4, 16), acceptance=Bernoulli(0.5, seed=3), allow_lossy=True)
    a = [s.accepted for s in ex.stats]
    run_closed_loop(again, prompts(3, seed=25), 12, 3)
    assert [s.accepted for s in again.stats] == a       # same seed, same draws


def test_draft_uniforms_are_a_fixed_hash_of_key_and_position():
    """u(seed, key, position): the same on every call, in [0, 1), about p of them below p,
    with no correlation between neighbouring positions or keys; another seed or key draws anew."""
    from dynspec.runtime.policy.acceptance import draft_uniforms

    keys, pos = torch.arange(1000), torch.arange(400)[None].expand(1000, 400)
    u = draft_uniforms(3, keys, pos)
    assert torch.equal(u, draft_uniforms(torch.tensor(3), keys, pos))
    assert u.dtype == torch.float32 and 0 <= u.min() and u.max() < 1
    assert abs((u < 0.7).double().mean().item() - 0.7) < 0.003          # 400k draws: sd 0.0007

    def corr(a, b):
        a, b = (a < 0.7).double(), (b < 0.7).double()
        return (((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std())).item()

    assert abs(corr(u[:, :-1], u[:, 1:])) < 0.01                         # next position
    assert abs(corr(u[:-1], u[1:])) < 0.01                               # next key
    assert abs(corr(u, draft_uniforms(4, keys, pos))) < 0.01             # next seed
    assert draft_uniforms(3, torch.tensor([5]), torch.tensor([[9]])).item() != u[6, 9].item()


def test_bernoulli_acceptance_is_fixed_by_request_and_position(pair):
    """Common random numbers: the drafts at positions pos+1..pos+K of the request with id r are
    accepted as far as draft_uniforms(seed, r, position) < p holds, in every step. Three
    requests one after another reuse slot 0 with ids 0, 1, 2, so the key is the request's id,
    not its slot, and K differs per run (3, then 5) over the same requests."""
    from dynspec.runtime.policy.acceptance import Bernoulli, draft_uniforms

    for k in (3, 5):
        eng = engine(pair)
        seen, real = [], eng.step
        eng.step = lambda plan, acc: (lambda res: (seen.append((plan, res)), res)[1])(real(plan, acc))
        ex = Executor(eng, DraftSchedule.static(k, 16), acceptance=Bernoulli(0.5, seed=3), allow_lossy=True)
        run_closed_loop(ex, prompts(3, seed=27), 12, 1)
        rid, checked = -1, 0
        for plan, res in seen:
            rid += sum(c.start == 0 for c in plan.chunks)          # a new request's first chunk
            if plan.k and plan.batch_size:
                assert plan.slots == (0,)
                u = draft_uniforms(3, torch.tensor([rid]), torch.tensor([[plan.positions[0] + i + 1
                                                                          for i in range(plan.k)]]))
                assert res.accepted[0] == int((u[0] < 0.5).long().cumprod(0).sum()), (rid, plan.positions)
                checked += 1
        assert rid == 2 and checked >= 6


def test_one_host_read_per_step(pair, monkeypatch):
    """Issue 13.11: a step reads the device once (the results), whatever the acceptance model."""
    from dynspec.runtime.policy.acceptance import Bernoulli

    eng = engine(pair)
    ex = Executor(eng, DraftSchedule.static(3, 16), acceptance=Bernoulli(0.6), allow_lossy=True)
    for p in prompts(3, seed=26):
        ex.submit(p, 30)
    ex.step()                                   # admission (prefill) happens here
    reads = []
    for name in ("__bool__", "item", "tolist", "__int__", "__float__", "numpy", "cpu"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _n=name, _r=real, **k: (reads.append(_n), _r(self, *a, **k))[1])
    plan_steps = 3
    for _ in range(plan_steps):
        ex.step()
    monkeypatch.undo()
    assert reads == ["tolist"] * plan_steps


def test_graph_keys_name_one_thing_per_field():
    """Issue 13.12: GraphKey.k is the draft count only; the draft sync has its own field."""
    from dynspec.runtime.engines.reference.graph_keys import GraphKey, reachable_graphs

    keys = reachable_graphs([DraftSchedule.threshold(4, 5)], 8, "warm")
    assert GraphKey("decode", 8, 0, sync="warm") in keys and GraphKey("decode", 8, 0, sync="warm").keep_warm
    assert GraphKey("decode", 8, sync="lazy") in reachable_graphs([DraftSchedule.threshold(4, 5)], 8, "lazy")
    assert GraphKey("spec", 8, 4) in keys and GraphKey("refresh", 8) in keys
    assert all(g.k == 0 for g in keys if g.kind != "spec")


def test_a_request_larger_than_the_cache_pool_is_refused_at_submit(pair):
    """A reservation the pool can never grant used to wait forever and block the queue behind it."""
    target, draft = pair
    eng = load_reference_engine(target, draft, dtype="float64", max_batch_size=4, max_seq_len=96, max_draft_len=4,
                                block_size=16, num_blocks=3)            # 2 usable blocks: 32 tokens
    assert eng.max_reservation == 32
    ex = Executor(eng, DraftSchedule.static(4, 4))
    with pytest.raises(DynspecError, match="45 exceeds the 32 tokens the KV cache pool"):
        ex.submit(list(range(1, 11)), 30)                               # 10 + 30 + 5 = 45
    small = ex.submit([1, 2, 3], 8)                                     # 3 + 8 + 5 = 16 fits
    ex.run_until_idle()
    assert small.done and small.result().finish_reason == "length" and eng.free_blocks == 2


def test_a_failing_policy_ends_its_requests_and_the_loop_serves_on(pair):
    """A policy that raises (here: K above the engine's) used to leave its rows unfinished while
    the loop retried forever; now the iteration's requests end as "error"."""
    target, draft = pair
    eng = load_reference_engine(target, draft, dtype="float64", max_batch_size=4, max_seq_len=96, max_draft_len=4)
    class Faulty:
        """Claims K <= 4 (runtime/policy/__init__.py Policy), gives 7 > max_draft_len at b=2."""
        max_draft_len, drafts, chooses_keep_warm = 4, True, False

        def __call__(self, b: int) -> int:
            return 7 if b == 2 else 4

        def choices(self, b: int) -> tuple[int, ...]:
            return (self(b),)

        def decide(self, x):
            from dynspec.runtime.policy.step_decision import one_k

            return one_k(self(x.batch_size), x)

    ex = Executor(eng, Faulty())
    h1, h2 = ex.submit([1, 2, 3], 8), ex.submit([4, 5, 6], 8)
    with pytest.raises(DynspecError, match="policy gave K=7 for batch 2"):
        ex.run_until_idle()
    assert h1.result().finish_reason == h2.result().finish_reason == "error"
    ex.step()                                                           # releases their blocks
    assert ex.active == 0 and eng.free_blocks == eng.blocks.num_blocks - 1
    h3 = ex.submit([7, 8], 4)                                           # b=1: K=4 works
    ex.run_until_idle()
    assert h3.result().finish_reason == "length"


def test_a_failing_reserve_ends_that_request_instead_of_retrying_it_forever(pair):
    """reserve() raising (a TP leader whose worker is gone) used to leave the request at the head
    of the queue, so every later step retried it and raised again; now it ends as "error" and the
    next request is served."""
    target, draft = pair
    eng = load_reference_engine(target, draft, dtype="float64", max_batch_size=4, max_seq_len=96, max_draft_len=4)
    real, calls = eng.reserve, []

    def reserve(tokens, key=0):
        calls.append(tokens)
        if len(calls) == 1:
            raise RuntimeError("TP rank 1: broadcast failed")
        return real(tokens, key)
    eng.reserve = reserve
    ex = Executor(eng, DraftSchedule.static(4, 4))
    h1, h2 = ex.submit([1, 2, 3], 6), ex.submit([4, 5], 6)
    with pytest.raises(RuntimeError, match="broadcast failed"):
        ex.step()
    assert h1.result().finish_reason == "error" and not h2.done
    ex.run_until_idle()
    assert h2.result().finish_reason == "length" and len(calls) == 2


def test_reference_graphs_setting_round_trips_and_retired_keys_are_refused(tmp_path):
    """engine.json's reference.graphs is "full" or "eager" (GraphMode); a file that still carries
    one of the retired execution switches gets one line naming it and asking for a rebuild."""
    import json

    from dynspec.config import EngineConfig, GraphMode, ReferenceSettings
    from dynspec.runtime.generate.session import engine_config_for, tiny_pair_dirs

    cfg = engine_config_for(*tiny_pair_dirs(), DraftSchedule.parse("4:4"),
                            ReferenceSettings(graphs=GraphMode.EAGER))
    cfg.write(tmp_path)
    doc = json.loads((tmp_path / "engine.json").read_text())
    assert doc["reference"]["graphs"] == "eager"
    assert EngineConfig.load(tmp_path).reference.graphs is GraphMode.EAGER
    assert ReferenceSettings().graphs is GraphMode.FULL and ReferenceSettings(graphs="full").graphs is GraphMode.FULL
    for bad, match in (({"cuda_graphs": False}, r"engine.json: field 'reference.cuda_graphs' is retired.*rebuild"),
                       ({"fused_rope": True}, r"'reference.fused_rope' is retired"),
                       ({"graphs": "piecewise"}, r"engine.json: reference.graphs='piecewise' is not one of "
                                                 r"\['full', 'eager'\]")):
        (tmp_path / "engine.json").write_text(json.dumps(dict(doc, reference=dict(doc["reference"], **bad))))
        with pytest.raises(DynspecError, match=match):
            EngineConfig.load(tmp_path)


def test_mixed_warm_up_runs_every_speculative_row_shape_and_serving_stays_lossless(pair, hf_target):
    """warm_mixed: one mixed iteration per spec (bucket, K) on the padding slot (and a long chunk
    once per K); the requests served afterwards match transformers greedy token for token."""
    from dynspec.runtime.engines.reference.graph_keys import reachable_graphs

    eng = engine(pair, max_batch=4, max_seq=96, kmax=3)
    pol = DraftSchedule.parse("2:3,4:1")
    keys = reachable_graphs([pol], eng.max_batch_size, True, eng.max_num_tokens)
    spec = {(g.bucket, g.k) for g in keys if g.kind == "spec"}
    assert spec == {(1, 3), (2, 3), (4, 1), (1, 1), (2, 1)}     # b <= 2 with prompts ending beside: K=1
    eng.capture_whole_graphs(keys)                        # CPU: the whole-forward functions, run uncaptured
    runs = []
    real = eng.whole.run
    eng.whole.run = lambda key, *a: runs.append(key) or real(key, *a)
    assert eng.warm_mixed(keys) == 4 * len(spec)          # 5, to a multiple of 16, 300 (capped), 7 + 3
    assert max(n for n, _, _, _ in runs) > eng.block_size    # a padding-slot chunk over several blocks, staged
    ps = prompts(8, seed=11)
    res = run_closed_loop(Executor(eng, pol), ps, 16, concurrency=4)
    assert [r.output_ids for r in res] == greedy_many(hf_target, ps, 16)
