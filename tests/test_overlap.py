"""The overlapped executor loop (Executor(loop=Loop.OVERLAPPED); docs/design.md, "The overlapped loop"):
iteration i+1 is planned and launched before iteration i's result is read, its rows continuing
from i's tokens and positions on the device. Every output equals the serial executor's and transformers greedy
(float64, CPU), through arrivals, K flips, chunked prompts, cancels, stop ids and max_new_tokens
inside a verify window; one host read per iteration, none inside a launch."""
from __future__ import annotations

import random

import pytest
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.policy.adaptive import AdaptivePolicy, AdaptiveSettings
from dynspec.runtime.serving.driver import run_closed_loop
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.loop import Loop
from dynspec.runtime.serving.overlap import cache_slack, row_inputs
from dynspec.runtime.serving.plan import batch_buckets
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.generate.session import tiny_pair_dirs
from tests.test_adaptive_lossless import linear_cost
from tests.test_executor import DT, greedy_many, hf_target, pair, prompts, serves_on_after_a_failing  # noqa: F401


def engine(pair, *, budget=8192, max_batch=8, max_seq=128, kmax=6):
    return load_reference_engine(*pair, dtype=DT, max_batch_size=max_batch, max_seq_len=max_seq,
                                 max_draft_len=kmax, max_num_tokens=budget)


class Spy:
    """Records every launch's plan and every result, in call order, on an engine instance."""

    def __init__(self, eng):
        self.plans, self.results, self.log = [], [], []
        launch, result = eng.launch, eng.result

        def spy_launch(plan, acceptance):
            self.log.append(("launch", len(self.plans)))
            self.plans.append(plan)
            return launch(plan, acceptance)

        def spy_result(handle):
            out = result(handle)
            self.log.append(("result", len(self.results)))
            self.results.append(out)
            return out

        eng.launch, eng.result = spy_launch, spy_result


def serve(ex, ps, lens, seed, stop_ids=()):
    """Prompts arriving 0..2 an iteration while others decode; handles in prompt order."""
    rng = random.Random(seed)
    handles, i = [], 0
    while i < len(ps) or ex.active or ex.waiting:
        for _ in range(rng.randint(0, 2)):
            if i < len(ps):
                handles.append(ex.submit(ps[i], lens[i], stop_ids))
                i += 1
        ex.step()
    ex.run_until_idle()                       # the last (wasted) iteration's result
    return handles


# ---- the pure rule -----------------------------------------------------------------------------

def test_row_inputs_bound_each_row_and_the_cache_slack_covers_two_windows():
    r = row_inputs([40, 11], [7, None], [3, 0])               # A decoding at K=3, B's last chunk in flight
    assert r.positions == (44, 12) and r.context == (41, 12) and r.from_device == (True, True)
    assert r.pending == (0, 0)
    exact = row_inputs([40, 11], [7, 9], None)
    assert exact.positions == exact.context == (40, 11) and exact.pending == (7, 9) and not any(exact.from_device)
    with pytest.raises(ValueError, match="without a token"):
        row_inputs([40], [None], None)
    assert cache_slack(4, Loop.SERIAL) == 5 and cache_slack(4, Loop.OVERLAPPED) == 10


# ---- lossless against the serial executor and transformers --------------------------------------

@pytest.mark.parametrize("padded", [False, True])
def test_arrivals_k_flips_and_chunked_prompts_equal_serial_and_transformers(pair, hf_target, padded):
    """Tiers flip K with b (including K=0 with keep-warm) while prompts of up to 30 tokens arrive
    under a budget of 20, so prompts split over iterations and ride beside carried decode rows.
    padded: the CUDA row buckets on CPU (padding rows behind the carried ones)."""
    ps = prompts(14, seed=34, lo=4, hi=30)
    lens = [random.Random(34 + i).randint(2, 14) for i in range(len(ps))]
    outs = {}
    for loop in Loop:
        eng = engine(pair, budget=20, max_batch=6)
        if padded:
            eng.buckets = batch_buckets(eng.max_batch_size)
        spy = Spy(eng)
        ex = Executor(eng, DraftSchedule.parse("1:5,2:3,3:2,4:1"), loop=loop)
        outs[loop] = [h.result().output_ids for h in serve(ex, ps, lens, seed=34)]
    refs = greedy_many(hf_target, ps, 14)
    assert outs[Loop.SERIAL] == [r[:n] for r, n in zip(refs, lens)]
    assert outs[Loop.OVERLAPPED] == outs[Loop.SERIAL]
    ks = [p.k for p in spy.plans if p.batch_size]
    assert {0, 1, 2, 3, 5} <= set(ks)
    carried_mixed = [p for p in spy.plans if p.chunks and p.carried_rows]
    assert carried_mixed and any(p.k > 0 for p in carried_mixed)          # chunks beside carried rows
    assert any(c.start > 0 for p in spy.plans for c in p.chunks)           # a prompt split over iterations
    assert all(p.carry for p in spy.plans) and sum(p.carried_rows for p in spy.plans) > 20
    assert all(s.decode_rows * (s.k + 1) + s.prefill_tokens <= 20 for s in ex.stats)


def test_whole_mixed_forwards_take_the_carried_rows(pair, hf_target):
    """Mixed iterations through mixed_graphs.py's whole forward (uncaptured on CPU), which reads
    the decode rows' tokens and positions from the engine's inputs on the device."""
    ps = prompts(10, seed=35, lo=6, hi=30)
    lens = [3 + i % 9 for i in range(len(ps))]
    eng = engine(pair, budget=24, max_batch=6)
    eng.buckets = batch_buckets(eng.max_batch_size)
    eng.capture_whole_graphs()
    runs = []
    real = eng.whole.run
    eng.whole.run = lambda key: runs.append(key) or real(key)
    ex = Executor(eng, DraftSchedule.parse("2:4,4:0"), loop=Loop.OVERLAPPED)
    out = [h.result().output_ids for h in serve(ex, ps, lens, seed=35)]
    refs = greedy_many(hf_target, ps, max(lens))
    assert out == [r[:n] for r, n in zip(refs, lens)]
    assert any(B for _, B, _, _ in runs)                                 # with decode rows in the forward


def test_the_adaptive_policy_overlapped_is_lossless_and_moves_k():
    """The tiny trained pair (the draft matches often): K chosen per iteration by the adaptive
    policy from the estimate one iteration behind, tokens still transformers'."""
    from transformers import LlamaForCausalLM

    target, draft = tiny_pair_dirs()
    hf = LlamaForCausalLM.from_pretrained(target, dtype=DT).eval()
    eng = load_reference_engine(target, draft, dtype=DT, max_batch_size=4, max_seq_len=128, max_draft_len=4)
    rng = random.Random(1)
    ps = [tuple(rng.randrange(eng.vocab_size) for _ in range(24)) for _ in range(8)]
    policy = AdaptivePolicy(linear_cost(), AdaptiveSettings(calibrate=False))
    ex = Executor(eng, policy, stats_limit=None, loop=Loop.OVERLAPPED)
    res = run_closed_loop(ex, ps, 24, concurrency=3)
    assert [r.output_ids for r in res] == greedy_many(hf, ps, 24)
    stats = [s for s in ex.stats if s.batch_size]
    assert all(s.policy == "adaptive" and s.overlapped for s in stats)
    assert len({s.k for s in stats}) >= 2 and sum(s.accepted for s in stats) > len(stats)


# ---- ends inside a verify window -----------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaForCausalLM

    target, draft = tiny_pair_dirs()
    return target, draft, LlamaForCausalLM.from_pretrained(target, dtype=DT).eval()


def tiny_engine(tiny, kmax=4):
    return load_reference_engine(tiny[0], tiny[1], dtype=DT, max_batch_size=4, max_seq_len=128, max_draft_len=kmax)


def windows(spy):
    """Per request (numbered in admission order, each in a slot of its own): the emitted windows
    of each result, in order."""
    slot_of: dict = {}
    for plan in spy.plans:
        for c in plan.chunks:
            if c.start == 0:
                slot_of[c.slot] = len(slot_of)
    out: dict = {}
    for plan, res in zip(spy.plans, spy.results):
        for slot, toks in zip(plan.slots, res.emitted):
            if slot in slot_of:
                out.setdefault(slot_of[slot], []).append(toks)
    return out


def test_stop_id_and_max_new_tokens_inside_a_verify_window(tiny):
    """K=4 on the tiny pair accepts several drafts a step. Request 0 stops at a token that lands
    inside a window of accepted drafts; request 1's max_new_tokens falls inside a window. The rows
    still run the iteration after (launched before the host saw the end) and keep nothing of it."""
    eng = tiny_engine(tiny)
    rng = random.Random(0)
    ps = [tuple(rng.randrange(eng.vocab_size) for _ in range(20)) for _ in range(2)]
    ref = greedy_many(tiny[2], ps, 30)
    spy = Spy(eng)
    ex = Executor(eng, DraftSchedule.static(4, 4))
    for p in ps:
        ex.submit(p, 30)
    ex.run_until_idle()
    wins = windows(spy)
    starts = {rid: [1 + sum(map(len, w[:j])) for j in range(len(w))] for rid, w in wins.items()}   # after g0
    j0 = next(j for j, w in enumerate(wins[0]) if len(w) >= 3 and w[1] not in ref[0][:starts[0][j] + 1])
    stop, stop_at = wins[0][j0][1], starts[0][j0] + 1                      # 2nd token of a window
    j1 = next(j for j, w in enumerate(wins[1]) if len(w) >= 3 and starts[1][j] >= 2)
    max_new = starts[1][j1] + 2                                            # ends after its 2nd token

    eng = tiny_engine(tiny)
    spy = Spy(eng)
    ex = Executor(eng, DraftSchedule.static(4, 4), loop=Loop.OVERLAPPED)
    h0, h1 = ex.submit(ps[0], 30, [stop]), ex.submit(ps[1], max_new)
    ex.run_until_idle()
    r0, r1 = h0.result(), h1.result()
    assert r0.output_ids == tuple(ref[0][:stop_at + 1]) and r0.finish_reason == "stop"
    assert r1.output_ids == tuple(ref[1][:max_new]) and r1.finish_reason == "length"
    assert sum(h0.stream(timeout=1), []) == list(r0.output_ids)
    assert sum(h1.stream(timeout=1), []) == list(r1.output_ids)
    got = windows(spy)
    for rid, out in ((0, r0.output_ids), (1, r1.output_ids)):
        ends = [1 + sum(map(len, got[rid][:j + 1])) for j in range(len(got[rid]))]   # output length after each
        e = next(j for j, n in enumerate(ends) if n >= len(out))
        assert ends[e] > len(out), (rid, got[rid])       # the window that ended it ran past the end
        assert len(got[rid]) == e + 2                    # and exactly one more step ran it


def test_a_finished_row_emits_nothing_in_the_extra_iteration(pair, hf_target):
    """K=0: A (3 tokens) ends at the result of iteration j, which the host reads after launching
    j+1 with A in it; j+1's stats count B's token only and A streams exactly its 3 tokens."""
    eng = engine(pair)
    spy = Spy(eng)
    ex = Executor(eng, DraftSchedule(), loop=Loop.OVERLAPPED)
    pa, pb = prompts(2, seed=40)
    a, b = ex.submit(pa, 3), ex.submit(pb, 8)
    ex.run_until_idle()
    assert a.result().output_ids == greedy(hf_target, pa, 3) and b.result().output_ids == greedy(hf_target, pb, 8)
    assert sum(a.stream(timeout=1), []) == list(a.result().output_ids)
    slot_a = spy.plans[0].chunks[0].slot
    with_a = [i for i, p in enumerate(spy.plans) if slot_a in p.slots]
    # iterations: 0 prefill (first tokens), then A decodes at 1, 2 -> 3 tokens after result 2;
    # iteration 3 was launched before result 2 was read: A rides in it and keeps nothing
    assert with_a == [1, 2, 3]
    st = {s.iteration: s for s in ex.stats}
    assert st[3].batch_size == 2 and st[3].emitted == 1
    assert spy.results[3].emitted[spy.plans[3].slots.index(slot_a)]             # the device did produce one


def greedy(hf, p, n):
    return greedy_many(hf, [p], n)[0]


# ---- cancels, syncs, failures ----------------------------------------------------------------------

def test_cancel_mid_stream_from_a_client_thread(pair, hf_target):
    """The background loop overlapped: a streaming client cancels after its second chunk; it keeps
    a prefix of its greedy output and nothing after cancel() returns; the others finish exactly."""
    eng = engine(pair)
    ex = Executor(eng, DraftSchedule.static(2, 8), loop=Loop.OVERLAPPED)
    ps = prompts(4, seed=41)
    hs = [ex.submit(p, 30) for p in ps]
    ex.start()
    try:
        got = []
        for chunk in hs[0].stream(timeout=30):
            got += chunk
            if len(got) >= 2:
                hs[0].cancel()
                kept = hs[0].tokens()
                break
        rest = sum(hs[0].stream(timeout=30), [])
        for h in hs[1:]:
            list(h.stream(timeout=30))
    finally:
        ex.stop()
    refs = greedy_many(hf_target, ps, 30)
    r0 = hs[0].result()
    assert r0.finish_reason == "cancelled" and r0.output_ids == tuple(kept) == tuple(got + rest)
    assert r0.output_ids == refs[0][:len(r0.output_ids)]
    assert [h.result().output_ids for h in hs[1:]] == refs[1:]


def test_one_host_read_per_iteration_and_none_inside_a_launch(pair, monkeypatch):
    """Every device -> host read the executor's iterations make, logged beside the engine's launch
    and result calls: launch i+1 comes before result i, launches read nothing, and each result
    reads once (Bernoulli acceptance: its draws are on the device too)."""
    from dynspec.runtime.policy.acceptance import Bernoulli

    eng = engine(pair)
    spy = Spy(eng)
    ex = Executor(eng, DraftSchedule.static(3, 16), acceptance=Bernoulli(0.6), allow_lossy=True,
                  loop=Loop.OVERLAPPED)
    for p in prompts(3, seed=26):
        ex.submit(p, 30)
    ex.step()                                   # admission and the first launch
    for name in ("__bool__", "item", "tolist", "__int__", "__float__", "numpy", "cpu"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _n=name, _r=real, **k:
                            (spy.log.append(("read", _n)), _r(self, *a, **k))[1])
    for _ in range(4):
        ex.step()
    monkeypatch.undo()
    tail = spy.log[spy.log.index(("launch", 1)):]
    assert tail == [("launch", 1), ("read", "tolist"), ("result", 0), ("launch", 2), ("read", "tolist"),
                    ("result", 1), ("launch", 3), ("read", "tolist"), ("result", 2), ("launch", 4),
                    ("read", "tolist"), ("result", 3)]


def test_iteration_stats_record_device_time_and_idle(pair):
    eng = engine(pair)
    ex = Executor(eng, DraftSchedule.static(2, 8), loop=Loop.OVERLAPPED)
    for p in prompts(3, seed=42):
        ex.submit(p, 10)
    ex.run_until_idle()
    st = ex.stats
    assert st[0].gpu_idle_s is None or st[0].gpu_idle_s >= 0
    assert all(s.overlapped and s.device_seconds is not None and s.seconds == s.device_seconds for s in st)
    assert all(s.gpu_idle_s is not None and s.gpu_idle_s >= 0 and s.fold_seconds >= 0 for s in st[1:])
    assert [s.iteration for s in st] == list(range(len(st)))


def test_a_failing_launch_ends_its_and_the_in_flight_requests_and_the_loop_serves_on(pair, hf_target):
    eng = engine(pair, max_batch=2)
    serves_on_after_a_failing(Executor(eng, DraftSchedule.static(2, 2), loop=Loop.OVERLAPPED), eng, "launch", 3,
                              hf_target)


def test_the_cache_bound_at_submit_counts_two_windows(pair):
    eng = engine(pair, max_seq=40, kmax=4)
    Executor(eng, DraftSchedule.static(4, 8)).submit([1] * 20, 15)              # 20 + 15 + 5 = 40
    with pytest.raises(DynspecError, match=r"\+10 verify slack\) = 45 exceeds the cache length max_seq_len=40"):
        Executor(eng, DraftSchedule.static(4, 8), loop=Loop.OVERLAPPED).submit([1] * 20, 15)


# ---- the one switch: engine.json reference.overlap ------------------------------------------------

def test_engine_json_overlap_switch_round_trips_and_generate_honours_it(tmp_path, capsys):
    """reference.overlap (default "auto": overlapped on CUDA, serial elsewhere) round-trips through
    engine.json, anything else is refused in one line, and `dynspec generate --engine-dir` gives
    the same tokens with it on, its stats saying the loop was overlapped (auto on CPU: serial)."""
    import json
    from dataclasses import replace

    from dynspec.cli import main as dynspec_main
    from dynspec.config import EngineConfig, ReferenceSettings
    from dynspec.runtime.generate.session import engine_config_for

    auto = ReferenceSettings()
    assert auto.overlap == "auto" and auto.loop("cuda:0") is Loop.OVERLAPPED and auto.loop("cpu") is Loop.SERIAL
    assert ReferenceSettings(overlap=False).loop("cuda") is Loop.SERIAL
    assert ReferenceSettings(overlap=True).loop("cpu") is Loop.OVERLAPPED
    with pytest.raises(DynspecError, match=r'^reference.overlap=.yes. must be true, false or "auto"$'):
        ReferenceSettings(overlap="yes")
    cfg = engine_config_for(*tiny_pair_dirs(), DraftSchedule.parse("4:3"), ReferenceSettings(dtype="float64"))
    outs = {}
    for on in (False, True, "auto"):
        d = tmp_path / f"engine_{on}"
        d.mkdir()
        replace(cfg, reference=replace(cfg.reference, overlap=on)).write(d)
        assert EngineConfig.load(d).reference.overlap == on
        out, stats = tmp_path / f"out_{on}.jsonl", tmp_path / f"stats_{on}.jsonl"
        assert dynspec_main(["generate", "--engine-dir", str(d), "--num-prompts", "3", "--max-new-tokens", "10",
                             "--concurrency", "2", "--modes", "dynamic", "--out", str(out), "--stats", str(stats)]) == 0
        outs[on] = [json.loads(x)["output_ids"] for x in out.read_text().splitlines()]
        assert {json.loads(x)["overlapped"] for x in stats.read_text().splitlines()} == {on is True}
    assert outs[True] == outs[False] == outs["auto"] and len(outs[True]) == 3


# ---- the CUDA path's attention, interpreted ----------------------------------------------------------

def run_overlap_interpreted() -> None:
    """The overlapped loop on the attention the engine takes on CUDA (every row through the ragged
    Triton kernel), in a process with TRITON_INTERPRET=1: arrivals while carried rows decode, K flipping through 0, a
    budget that splits prompts; every output equals the serial loop's and transformers greedy."""
    import tempfile
    from pathlib import Path

    from transformers import LlamaForCausalLM

    from tests.helpers_models import make_tiny_draft, make_tiny_target

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = make_tiny_target(root / "target", vocab=96, hidden=64, layers=3, heads=4, kv_heads=2, seed=1)
        draft = make_tiny_draft(root / "draft", target, draft_vocab=64, seed=2)
        hf = LlamaForCausalLM.from_pretrained(str(target), dtype=DT).eval()
        rng = random.Random(5)
        ps = [tuple(rng.randrange(96) for _ in range(rng.randint(4, 20))) for _ in range(6)]
        lens = [rng.randint(3, 8) for _ in ps]
        eng = load_reference_engine(str(target), str(draft), dtype=DT, max_batch_size=4, max_seq_len=64,
                                    max_draft_len=3, max_num_tokens=16, attention="triton")
        assert eng.triton
        spy = Spy(eng)
        ex = Executor(eng, DraftSchedule.parse("1:3,2:2,3:0"), loop=Loop.OVERLAPPED)
        out = [h.result().output_ids for h in serve(ex, ps, lens, seed=5)]
        refs = greedy_many(hf, ps, 8)
        assert out == [r[:n] for r, n in zip(refs, lens)]
        mixed = [p for p in spy.plans if p.chunks and p.carried_rows]
        assert any(p.k for p in mixed) and any(not p.k for p in mixed), [(p.k, p.batch_size) for p in mixed]
        print("ok overlap interpreted", len(mixed), "mixed iterations with carried rows")


@pytest.mark.skipif(__import__("importlib").util.find_spec("triton") is None, reason="needs triton")
def test_the_triton_attention_path_takes_the_carried_rows():
    from tests.interpreted import interpreted

    assert "ok overlap interpreted" in interpreted("test_overlap", "run_overlap_interpreted")
