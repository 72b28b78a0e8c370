"""Lazy draft sync (docs/design.md, "Draft sync"; runtime/serving/draft_sync.py,
runtime/engines/reference/lazy_sync.py): lossless against transformers greedy (float64, the tiny
trained pair) with K flipping 4 -> 0 -> 4, prompt chunks in flight, catch-ups split over
iterations by a small max_num_tokens and the feature store's cap reached; after a K=0 stretch the
draft accepts what the warm draft accepts; `off` accepts less; the generate CLI's flags."""
from __future__ import annotations

import json

import pytest
import torch

from dynspec.cli import main
from dynspec.errors import DynspecError
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.generate.session import tiny_pair_dirs
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.serving.driver import run_closed_loop
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.loop import Loop
from tests.test_executor import greedy_many

DT = torch.float64
K = 4


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoTokenizer, LlamaForCausalLM

    from dynspec.corpus import default_prompts

    target, draft = tiny_pair_dirs()
    hf = LlamaForCausalLM.from_pretrained(target, dtype=DT).eval()
    return target, draft, default_prompts(AutoTokenizer.from_pretrained(target), n=6, length=24), hf


class Cycle:
    """Test-only policy driven by the iteration count: K for `on` iterations, then 0 for `off`,
    repeating (every row at one K)."""

    max_draft_len, drafts, chooses_keep_warm = K, True, False      # runtime/policy/__init__.py Policy

    def __init__(self, on: int, off: int):
        self.i, self.on, self.off = 0, on, off

    def choices(self, batch_size: int) -> tuple[int, ...]:
        return (0, K)

    def decide(self, x):
        from dynspec.runtime.policy.step_decision import one_k

        self.i += 1
        return one_k(K if (self.i - 1) % (self.on + self.off) < self.on else 0, x)


def engine(tiny, *, budget=8192, cap=256, batch=3, whole=False):
    eng = load_reference_engine(tiny[0], tiny[1], dtype=DT, max_batch_size=batch, max_seq_len=160,
                                max_draft_len=K, max_num_tokens=budget, draft_sync_cap=cap)
    if whole:
        eng.capture_whole_graphs()            # CPU: the whole-forward functions, uncaptured
    return eng


@pytest.mark.parametrize("loop,whole", [(Loop.SERIAL, False), (Loop.OVERLAPPED, False), (Loop.SERIAL, True)])
def test_lossless_through_flips_split_catch_ups_and_the_cap(tiny, loop, whole):
    """3 rows over 6 prompts (chunks of later prompts ride beside the decode rows), K=4 for 3
    iterations then 0 for 9; budget 20 leaves 5 catch-up tokens beside 3 rows at K=4, so catch-ups
    take several iterations (the row at K=0 meanwhile); a store of 6 tokens drops the oldest."""
    eng = engine(tiny, budget=20, cap=6, whole=whole)
    ex = Executor(eng, Cycle(3, 9), draft_sync="lazy", stats_limit=None, loop=loop)
    results = run_closed_loop(ex, tiny[2], 40, concurrency=3)
    assert [r.output_ids for r in results] == greedy_many(tiny[3], tiny[2], 40)
    st = ex.stats
    ups = [i for i, s in enumerate(st) if s.catch_up_tokens]
    assert ups and any(b == a + 1 for a, b in zip(ups, ups[1:]))       # catch-ups over successive iterations
    assert all(s.catch_up_tokens + s.decode_rows * (s.k + 1) + s.prefill_tokens <= 20 for s in st)
    assert sum(s.stale_draft_tokens for s in st) > 0                   # the cap was reached
    assert any(s.drafted < s.batch_size * s.k for s in st if s.catch_up_tokens)   # a row waited at K=0
    assert any(s.prefill_tokens and s.batch_size for s in st)          # chunks beside decode rows


def accepted_by_position(tiny, sync, cap=256):
    """Per prompt, one row at a time: (position, accepted) of every speculative step, K=4 for 6
    iterations, 0 for 30, then 4 again."""
    eng = engine(tiny, batch=1, cap=cap)
    out = []
    for p in tiny[2][:4]:
        ex = Executor(eng, Cycle(6, 30), draft_sync=sync, stats_limit=None)
        (res,) = run_closed_loop(ex, [p], 80, concurrency=1)
        pos, rows = len(p), []
        for s in ex.stats:
            if s.k:
                rows.append((pos, s.accepted))
            pos += s.emitted
        out.append((res.output_ids, rows))
    return out


def test_after_a_k0_stretch_lazy_accepts_what_warm_accepts_and_off_less(tiny):
    """The catch-up writes the draft K/V warm's K=0 steps wrote (one layer: entry j's K/V is a
    function of (x_j, h_{j-1}) alone), so every speculative step accepts the same; the draft left
    stale (off) accepts less; a store of 8 tokens (the stretch is 30) lands in between."""
    lazy, warm, off = (accepted_by_position(tiny, m) for m in ("lazy", "warm", "off"))
    assert [o for o, _ in lazy] == [o for o, _ in warm] == [o for o, _ in off]
    assert [r for _, r in lazy] == [r for _, r in warm]
    total = {m: sum(a for _, rows in runs for _, a in rows) for m, runs in (("warm", warm), ("off", off))}
    assert total["off"] < total["warm"], total


def run_cli(tmp_path, name, *flags, budget="160", new_tokens="24"):
    stats, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
    assert main(["generate", "--schedule", "4:4", "--concurrency", "5", "--num-prompts", "5", "--max-num-tokens",
                 budget, "--max-new-tokens", new_tokens, "--modes", "dynamic", "--trials", "1", "--no-progress",
                 "--stats", str(stats), "--out", str(out), *flags]) == 0
    rows = [json.loads(ln) for ln in stats.read_text().splitlines()]
    return rows, out.read_text()


def test_generate_lazy_equals_warm_per_step_and_off_accepts_less(tmp_path, capsys):
    """`dynspec generate --schedule 4:4 --concurrency 5 --num-prompts 5 --modes dynamic --stats S`:
    prompt chunks stagger the rows, so K=4 runs at b <= 4 while the last prompts prefill, K=0 at 5
    rows (and at 4 rows with the fifth prompt ending its prefill beside them), K=4 again once a row
    ends. Budget 160, 24 new tokens: the catch-up fits beside the rows, so the same accepted drafts at
    every step under lazy and warm, the same text; off accepts less. At budget 48 and 64 new tokens
    the catch-up is split, the rows draft later, and only the text is the same (the second half)."""
    lazy, warm, off = (run_cli(tmp_path, m, "--draft-sync", m) for m in ("lazy", "warm", "off"))
    steps = {m: [(s["batch_size"], s["k"], s["accepted"]) for s in r[0]] for m, r in
             (("lazy", lazy), ("warm", warm), ("off", off))}
    assert lazy[1] == warm[1] == off[1]
    assert steps["lazy"] == steps["warm"]
    assert sum(s["catch_up_tokens"] for s in lazy[0]) > 0 and not any(s["catch_up_tokens"] for s in warm[0])
    stretch = max(i for i, s in enumerate(warm[0]) if s["batch_size"] == 5)
    assert any(s["k"] for s in warm[0][stretch + 1:])                  # K resumed after the stretch
    assert steps["off"] != steps["warm"]
    assert sum(a for *_, a in steps["off"]) < sum(a for *_, a in steps["warm"])
    assert any(s["k"] for s in warm[0][:stretch])                      # and ran before it
    split, _ = run_cli(tmp_path, "split", "--draft-sync", "lazy", budget="48", new_tokens="64")
    ups = [s["catch_up_tokens"] for s in split]
    assert sum(1 for u in ups if u) > 1 and max(ups) <= 48 - 4
    assert _ == run_cli(tmp_path, "split_warm", "--draft-sync", "warm", budget="48", new_tokens="64")[1]


def test_no_keep_warm_is_off_with_one_deprecation_line(tmp_path, capsys):
    off, text = run_cli(tmp_path, "off", "--draft-sync", "off")
    capsys.readouterr()
    old, old_text = run_cli(tmp_path, "old", "--no-keep-warm")
    err = capsys.readouterr().err
    assert err.count("--no-keep-warm is deprecated; use --draft-sync off") == 1
    assert text == old_text and [s["accepted"] for s in off] == [s["accepted"] for s in old]
    with pytest.raises(SystemExit):
        main(["generate", "--draft-s", "off"])                           # no abbreviations
    assert main(["generate", "--no-keep-warm", "--draft-sync", "warm", "--no-progress"]) == 2


def test_engine_json_keep_warm_reads_as_warm_or_off_and_bad_values_are_named():
    from dynspec.config import ReferenceSettings

    assert ReferenceSettings.from_json({"keep_warm": True}, "E/engine.json").draft_sync == "warm"
    assert ReferenceSettings.from_json({"keep_warm": False}, "E/engine.json").draft_sync == "off"
    assert ReferenceSettings.from_json({}, "E/engine.json").draft_sync == "lazy"
    with pytest.raises(DynspecError, match=r"E/engine.json: reference.draft_sync='cold' must be one of"):
        ReferenceSettings.from_json({"draft_sync": "cold"}, "E/engine.json")
    with pytest.raises(DynspecError, match=r"E/engine.json: field 'reference.keep_warm'='yes' must be true or false"):
        ReferenceSettings.from_json({"keep_warm": "yes"}, "E/engine.json")
    with pytest.raises(DynspecError, match="draft_sync='on' is not one of lazy, warm, off"):
        Executor(None, DraftSchedule.parse("4:4"), draft_sync="on")


def draft_kv(eng, slot: int, upto: int) -> torch.Tensor:
    """The draft's K and V of draft positions 0..upto-1 of `slot` [2, kvh, upto, hd] (its one layer's
    pools are [kvh, blocks x block_size, hd])."""
    table, bs = eng.slots.table(slot), eng.block_size
    idx = torch.tensor([table[p // bs] * bs + p % bs for p in range(upto)])
    return torch.stack([eng.draft.k_cache[:, idx], eng.draft.v_cache[:, idx]])


def test_the_caught_up_draft_cache_is_the_warm_one(tiny):
    """Two engines serve the same two requests step by step, one lazy, one warm (budget 8192: every
    catch-up fits, so both run the same plans). After every step, each lazy row that is not behind
    holds in its draft cache, at every position below its pending one, warm's K/V."""
    engines = [engine(tiny, batch=2) for _ in range(2)]
    exs = [Executor(e, Cycle(4, 10), draft_sync=m, stats_limit=None) for e, m in zip(engines, ("lazy", "warm"))]
    hs = [[ex.submit(p, 60) for p in tiny[2][:2]] for ex in exs]
    checked = 0
    while any(not h.done for h in hs[0]):
        for ex in exs:
            ex.step()
        for req in exs[0]._pool.rows:
            if req.draft_behind == 0 and req.draft_warm:
                L = req.length
                torch.testing.assert_close(draft_kv(engines[0], req.slot, L), draft_kv(engines[1], req.slot, L),
                                           rtol=1e-12, atol=1e-12)
                checked += 1
    assert [h.result().output_ids for h in hs[0]] == [h.result().output_ids for h in hs[1]]
    assert [s.k for s in exs[0].stats] == [s.k for s in exs[1].stats]
    assert sum(s.catch_up_tokens for s in exs[0].stats) > 0 and checked > 20


def test_prompt_chunks_catch_up_within_the_budget():
    """draft_sync's "Prompts" example: a 300-token prompt whose chunk 0..99 was stored; its next
    chunk, in a step that drafts, first catches up positions 0..99 (x1..x100), and both fit the
    budget; a second request behind waits where its catch-up leaves no token for its chunk; past
    the cap the oldest positions are dropped."""
    from dynspec.runtime.serving.draft_sync import chunk_catch_up
    from dynspec.runtime.serving.planning import prompt_chunks
    from dynspec.runtime.serving.requests import Request

    a = Request(0, tuple(range(1000, 1300)), 8, frozenset(), 0.0, slot=3, prefilled=100, draft_behind=100)
    b = Request(1, tuple(range(40)), 8, frozenset(), 0.0, slot=5, prefilled=10, draft_behind=10)
    chunks, chunked = prompt_chunks([a, b], 305, cap=256)
    assert [(c.start, len(c.tokens)) for c in chunks] == [(100, 200)] and chunked == [a]   # 100 + 200; b: 5 - 10 < 1
    spans, dropped = chunk_catch_up(chunked, [100], 256)
    assert spans[0].slot == 3 and spans[0].start == 0 and spans[0].tokens == tuple(range(1001, 1101)) and not dropped
    assert prompt_chunks([a, b], 305)[1] == [a, b]                    # no cap: the chunks' draft pass is deferred
    spans, dropped = chunk_catch_up([a], [100], 64)
    assert (spans[0].start, len(spans[0].tokens), dropped) == (36, 64, 36)


@pytest.mark.parametrize("whole", [False, True])
def test_stored_prompts_accept_what_drafted_prompts_accept(tiny, whole):
    """3 rows, K=4 for 2 iterations then 0 for 5: prompts of later requests ride in K=0 steps and
    are stored (no draft pass), their draft caught up when their rows draft. The catch-up writes
    the K/V the draft pass wrote and the refresh rebuilds the head, so every step accepts what it
    accepts with the draft run over every chunk, and the text is transformers' greedy."""
    runs = {}
    for store in (True, False):
        eng = engine(tiny, budget=8192, cap=256, whole=whole)
        ex = Executor(eng, Cycle(2, 5), draft_sync="lazy", stats_limit=None, store_prompts=store)
        out = [r.output_ids for r in run_closed_loop(ex, tiny[2], 40, concurrency=3)]
        runs[store] = out, [(s.k, s.accepted) for s in ex.stats], ex.stats
    assert runs[True][0] == runs[False][0] == greedy_many(tiny[3], tiny[2], 40)
    assert runs[True][1] == runs[False][1]
    stored = sum(s.stored_prompt_tokens for s in runs[True][2])
    assert stored > 0 and not any(s.stored_prompt_tokens for s in runs[False][2])
    # each stored prompt is caught up but its last position, which the refresh rebuilds
    assert sum(s.catch_up_tokens for s in runs[True][2]) >= sum(s.catch_up_tokens for s in runs[False][2]) + stored - 6


def test_a_stored_chunk_keeps_its_newest_cap_tokens():
    """mixed_layout.store_slots, the one rule of both mixed paths: a chunk's newest cap tokens go to
    its slot's ring, older ones to the pad slot (a chunk longer than the ring would overwrite itself)."""
    from dynspec.runtime.engines.reference.mixed_layout import store_slots
    from dynspec.runtime.serving.plan import PromptChunk

    chunks = [PromptChunk(5, 0, (1, 2, 3), None), PromptChunk(6, 40, (4, 5), None)]
    assert store_slots(chunks, 2, 9).tolist() == [9, 5, 5, 6, 6]
    assert store_slots(chunks, 256, 9).tolist() == [5, 5, 5, 6, 6] and store_slots((), 2, 9).tolist() == []


class Counted:
    """The schedule "1:4" (K=4 at one row, 0 above) that counts the decisions it makes."""

    max_draft_len, drafts, chooses_keep_warm = K, True, False

    def __init__(self):
        self.calls, self.schedule = 0, DraftSchedule(((1, K),))

    def choices(self, batch_size: int) -> tuple[int, ...]:
        return (self.schedule(batch_size),)

    def decide(self, x):
        from dynspec.runtime.policy.step_decision import one_k

        self.calls += 1
        return one_k(self.schedule(x.batch_size), x)


@pytest.mark.parametrize("whole", [False, True])
def test_a_step_without_rows_stores_where_its_rows_would_not_draft(tiny, whole):
    """Three prompts arrive at an idle engine under "1:4": the first step has no rows and ends all
    three, whose rows would run at K=0, so lazy sync stores the prompts (warm drafts over them). The
    rows end one by one (8, 16, 40 new tokens); the last drafts at K=4 after catching up its
    prompt, and accepts what warm accepts, step for step; the text is transformers' greedy. One
    prompt alone would draft at once: that step runs the draft. The policy is asked about the
    rows to come on a copy: its own count is one decision a step with rows."""
    from dynspec.runtime.serving.driver import closed_loop

    prompts, news = tiny[2][:3], (8, 16, 40)
    runs = {}
    for sync in ("lazy", "warm"):
        eng, pol = engine(tiny, whole=whole), Counted()
        ex = Executor(eng, pol, draft_sync=sync, stats_limit=None)
        out = [h.result().output_ids for h in closed_loop(ex, list(zip(prompts, news)), 3)]
        st = ex.stats
        assert pol.calls == sum(1 for s in st if s.batch_size)
        runs[sync] = out, [(s.batch_size, s.k, s.accepted) for s in st], st
    assert runs["lazy"][0] == runs["warm"][0] == [greedy_many(tiny[3], [p], n)[0] for p, n in zip(prompts, news)]
    assert runs["lazy"][1] == runs["warm"][1]
    first, st = runs["lazy"][2][0], runs["lazy"][2]
    assert first.batch_size == 0 and first.stored_prompt_tokens == first.prefill_tokens == sum(map(len, prompts))
    assert not any(s.stored_prompt_tokens for s in runs["warm"][2])
    assert any(s.k for s in st) and sum(s.catch_up_tokens for s in st) >= len(prompts[2]) - 1
    ex = Executor(engine(tiny, whole=whole), Counted(), draft_sync="lazy", stats_limit=None)
    (res,) = run_closed_loop(ex, prompts[:1], 8, concurrency=1)
    assert res.output_ids == greedy_many(tiny[3], prompts[:1], 8)[0]
    assert ex.stats[0].batch_size == 0 and not ex.stats[0].stored_prompt_tokens and ex.stats[1].k == K


def test_the_backlog_after_a_step_drops_what_it_prefills():
    """RequestPool.backlog's worked example: admitted (100, 40 of 80 prefilled), queue (30, 50),
    three free rows; a step taking the first prompt whole leaves (40, 30, 50)."""
    from dynspec.runtime.serving.request_pool import RequestPool
    from dynspec.runtime.serving.requests import Request

    pool = RequestPool(lambda: 0.0)
    a, b = Request(0, (1,) * 100, 8, frozenset(), 0.0), Request(1, (1,) * 80, 8, frozenset(), 0.0, prefilled=40)
    pool.prefilling += [a, b]
    pool.waiting.extend(Request(i, (1,) * n, 8, frozenset(), 0.0) for i, n in ((2, 30), (3, 50)))
    assert pool.backlog(3) == (100, 40, 30)
    assert pool.backlog(3, {0: 100}) == (40, 30, 50) and pool.backlog(3, {1: 10}) == (100, 30, 30)


class Asked(Counted):
    """Counted that reads the waiting prompts and keeps (b, waiting) of every question it answers,
    in a list its copies share."""

    reads_prompts = True

    def __init__(self):
        super().__init__()
        self.asked = []

    def decide(self, x):
        self.asked.append((x.batch_size, x.waiting))
        return super().decide(x)


def test_the_rows_a_step_without_rows_leaves_are_priced_with_what_waits_after_it(tiny):
    """Budget 60, three prompts of 24: the first step can end two and run 12 tokens of the third,
    so the policy is asked about 2 rows with the third's other 12 tokens waiting; at 2 rows "1:4"
    gives K=0, so the step stores its 60 tokens."""
    prompts = [p[:24] for p in tiny[2][:3]]
    ex = Executor(engine(tiny, budget=60), pol := Asked(), draft_sync="lazy", stats_limit=None)
    out = [r.output_ids for r in run_closed_loop(ex, prompts, 8, concurrency=3)]
    assert out == greedy_many(tiny[3], prompts, 8)
    assert pol.asked[0] == (2, (12,)) and pol.calls == sum(1 for s in ex.stats if s.batch_size)
    assert ex.stats[0].batch_size == 0 and ex.stats[0].stored_prompt_tokens == 60


def test_a_prompt_behind_by_the_whole_budget_is_stored_not_left_waiting(tiny):
    """Budget 64 under a store of 256 (the budget below the cap), "1:4": prompts of 5, 5 and 150
    tokens. The first step ends both short ones (2 rows: K=0) and stores 54 tokens of the long one,
    the next K=0 step 62 more; at one row K=4, and the long prompt, 116 behind, finds no room for
    its catch-up beside a drafting row. Once the rows have ended, a step without rows would leave
    one row that drafts, but no chunk fits beside its catch-up: that step stores instead of
    waiting for good, and the text is transformers' greedy."""
    prompts, news = [tuple(range(5, 10)), tuple(range(20, 25)), tuple((i * 7) % 200 + 3 for i in range(150))], (2, 12, 4)
    ex = Executor(engine(tiny, budget=64, cap=256), Counted(), draft_sync="lazy", stats_limit=None)
    handles = [ex.submit(p, n) for p, n in zip(prompts, news)]
    for _ in range(40):
        if ex.step() is None and all(h.done for h in handles):
            break
    assert all(h.done for h in handles)
    assert [h.result().output_ids for h in handles] == [greedy_many(tiny[3], [p], n)[0] for p, n in zip(prompts, news)]
    late = [s for s in ex.stats[1:] if not s.batch_size]
    assert late and all(s.stored_prompt_tokens == s.prefill_tokens for s in late)
