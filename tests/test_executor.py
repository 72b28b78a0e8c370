"""The executor + reference engine are lossless: every request's output equals
`transformers` greedy generation of the target, token for token, whatever K the policy picks
per iteration (float64 on both sides, so no near-tie can flip an argmax)."""
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynspec.errors import DynspecError
from dynspec.runtime.driver import run_closed_loop
from dynspec.runtime.engines.reference.engine import load_reference_engine
from dynspec.runtime.executor import Executor
from dynspec.runtime.policy import DraftSchedule
from tests.helpers_models import make_tiny_draft, make_tiny_target

DT = torch.float64


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target = make_tiny_target(root / "target", vocab=96, hidden=64, layers=5, heads=4, kv_heads=2, seed=1)
    draft = make_tiny_draft(root / "draft", target, draft_vocab=64, seed=2)
    return str(target), str(draft)


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
    st = ex.step()
    assert st.batch_size == 2 and ex.waiting == 3
    ex.run_until_idle()
    assert [h.result().output_ids for h in hs] == greedy_many(hf_target, ps, 6)


def test_bernoulli_acceptance_is_refused_outside_benchmarks(pair):
    from dynspec.runtime.acceptance import Bernoulli

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
    from dynspec.runtime.driver import read_prompts

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

    def boom(row0, prompts):
        raise RuntimeError("simulated device failure in prefill")

    ex = Executor(eng, DraftSchedule.static(2, 2))
    real = eng.prefill
    eng.prefill = boom
    h = ex.submit([1, 2, 3], 4)
    with pytest.raises(RuntimeError, match="simulated"):
        ex.step()
    assert h.done and h.result().finish_reason == "error" and list(h.stream(timeout=1)) == []
    eng.prefill = real
    ex = Executor(eng, DraftSchedule.static(2, 2))
    hs = [ex.submit([1, 2, 3], 50) for _ in range(3)]
    ex.start()
    next(hs[0].stream(timeout=30))           # the loop is running
    ex.stop()
    assert all(x.done for x in hs)
    assert {x.result().finish_reason for x in hs} <= {"cancelled", "length"}
