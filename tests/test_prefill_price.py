"""The prompt side of an iteration as the policies price it: the profile's chunk axis (its reader,
its interpolation), the chunk and the prompts a step ends (runtime/policy/prefill_price.py), the
adaptive and per-request rules on them, and the prefill-aware rule lossless against transformers
greedy (float64) with chunks riding beside decode rows."""
from __future__ import annotations

import json
import random

import pytest
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.policy.adaptive import AdaptivePolicy, AdaptiveSettings, PolicyInputs
from dynspec.runtime.policy.cost_model import CostModel, Profile
from dynspec.runtime.policy.prefill_price import PromptSide, chunk_tokens, finishing, prompt_side
from dynspec.runtime.policy.split_cost import SplitCost

KS = (0, 1, 2)


def profile_doc(extra=(2.0, 6.8), chunks=(128, 512), step=(10.0, 11.0, 12.0), decode=9.8, bs=(16, 64)) -> dict:
    """Two contexts; every (b, K) at `step`, plain decode at `decode`; a chunk of c tokens adds
    extra[i] over the rows' step at every b and K (K=0: over plain decode)."""
    def table(ctx):
        it = {str(b): {str(k): step[k] for k in KS} for b in bs}
        dec = {str(b): decode for b in bs}
        ch = {str(c): {str(b): {str(k): (decode if k == 0 else step[k]) + e for k in KS} for b in bs}
              for c, e in zip(chunks, extra)}
        return {"context_len": ctx, "iteration_ms": it, "decode_ms": dec, "chunk_ms": ch}
    return {"format": "dynspec-profile/2", "device": "synthetic", "context_lens": [128, 512],
            "tables": [table(128), table(512)]}


def test_chunk_axis_is_read_written_back_and_interpolated_as_the_docstring_says():
    prof = Profile.from_json(profile_doc())
    assert Profile.from_json(json.loads(json.dumps(prof.to_json()))) == prof
    cost = CostModel.from_profile(prof)
    assert cost.chunk.chunk_lens == (128, 512)
    row = lambda t: cost.chunk.row(cost, 64, 128, t)     # noqa: E731
    assert row(320) == pytest.approx((4.4,) * 3)
    assert row(32) == pytest.approx((2.0,) * 3)          # below the shortest: its extra
    assert row(1024) == pytest.approx((13.2,) * 3)       # above: the last segment extended
    assert row(0) == (0.0,) * 3
    one = CostModel.from_profile(Profile.from_json(profile_doc(extra=(2.0,), chunks=(128,))))
    assert one.chunk.row(one, 16, 300, 512) == pytest.approx((8.0,) * 3)   # one length: in proportion above
    assert CostModel.from_profile(Profile.from_json({**profile_doc(), "tables": [
        {k: v for k, v in t.items() if k != "chunk_ms"} for t in profile_doc()["tables"]]})).chunk is None


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["tables"][1].pop("chunk_ms"), r"tables\[1\]: chunk_ms has chunks \[\], the first table \[128, 512\]"),
    (lambda d: d["tables"][0]["chunk_ms"]["128"].pop("16"), r"chunk_ms\['128'\] must time every batch size"),
    (lambda d: [t.pop("decode_ms") for t in d["tables"]], r"chunk_ms needs decode_ms"),
    (lambda d: d["tables"][0]["chunk_ms"].update({"x": {}}), r"chunk_ms key 'x' is not an integer"),
    (lambda d: d["tables"][0]["chunk_ms"]["128"]["16"].update({"1": -3}), r"chunk_ms\['128'\]\['16'\]\['1'\] = -3"),
])
def test_a_bad_chunk_axis_is_refused_by_field(edit, match):
    d = profile_doc()
    edit(d)
    with pytest.raises(DynspecError, match=match):
        CostModel.from_profile(Profile.from_json(d, where="p.json"), where="p.json")


def test_chunk_and_finishing_prompts_follow_the_planners_rule():
    assert chunk_tokens((100, 40), 8192, 64, 4) == 140 and chunk_tokens((100, 40), 400, 64, 4) == 80
    assert finishing((30, 50, 20), 90) == 2 and finishing((30,), 29) == 0
    cost = CostModel.from_profile(Profile.from_json(profile_doc()))
    side = prompt_side(cost, (250, 300), 400, 64, 64, 128, 2)
    assert side.finishing == (1, 1, 0)               # K=0, 1, 2 leave 336, 272, 208 tokens: the 250 fit twice
    # the chunk is priced at chunk(0) = 336 tokens for every K: a larger K makes nothing cheaper
    assert side.extra_ms == pytest.approx((2.0 + 4.8 * (336 - 128) / 384,) * 3)
    assert prompt_side(cost, (), 400, 64, 64, 128, 2) is None


def test_the_prompt_weight_worked_example():
    side = PromptSide((0.0, 0.0, 0.0), (1, 1, 1))
    gain = 1.75 * 10 / 12
    assert gain * side.weight(2, 16, 1.75, 0.0) == pytest.approx(1.458, abs=1e-3)
    assert gain * side.weight(2, 16, 1.75, 16.0) == pytest.approx(1.146, abs=1e-3)
    assert gain * side.weight(2, 16, 1.75, 64.0) == pytest.approx(0.958, abs=1e-3)


def inputs(b=16, waiting=(), acc=(0.5, 0.5), budget=8192):
    return PolicyInputs(b, 128.0, acc, max_k=2, bucket=b, waiting=waiting, token_budget=budget)


def test_adaptive_prices_the_chunk_and_weighs_the_prompt_it_ends():
    # a = 0.5: E = 1, 1.5, 1.75; rows alone 9.8 / 11 / 12 ms -> K=1 gains 1.336, K=2 1.429: K=2.
    # A 128-token chunk adding 2 ms at every K shrinks the relative cost of drafting: the same K, larger gain.
    cost = CostModel.from_profile(Profile.from_json(profile_doc()))
    plain = AdaptivePolicy(cost, AdaptiveSettings(calibrate=False, explore_steps=0, ttft_weight=0))
    alone, with_chunk = plain.choose(inputs()), plain.choose(inputs(waiting=(128,)))
    assert (alone.k, with_chunk.k) == (2, 2)
    assert alone.gain == pytest.approx(1.75 * 9.8 / 12) and with_chunk.gain == pytest.approx(1.75 * 11.8 / 14)
    # at a = 0.15, K=1 alone scores 1.15 x 9.8 / 11 / 1.01 = 1.014, inside the 2% hold band over plain decode;
    # beside the chunk 1.15 x 11.8 / 13 / 1.01 = 1.034: the chunk's fixed cost pays for the draft
    assert plain.choose(inputs(acc=(0.15, 0.15))).k == 0
    assert plain.choose(inputs(acc=(0.15, 0.15), waiting=(128,))).k == 1
    # the prompt's weight: one prompt ending in the step at 64 rows' weight -> plain decode for that step only
    weighed = AdaptivePolicy(cost, AdaptiveSettings(calibrate=False, explore_steps=0, ttft_weight=64))
    assert weighed.reads_prompts and weighed.choose(inputs(waiting=(128,))).k == 0
    assert weighed.choose(inputs()).k == 2
    assert weighed.choose(inputs(waiting=(9000,))).k == 2        # the prompt does not end in this step
    with pytest.raises(DynspecError, match="ttft_weight -1"):
        AdaptiveSettings(ttft_weight=-1)


def test_split_cost_plus_adds_the_chunk_by_depth():
    cost = CostModel.from_profile(Profile.from_json(profile_doc()))
    s = SplitCost.at(cost, 16, 128)
    p = s.plus((2.0, 2.5, 3.0))
    assert p.step_ms(16, 0) == pytest.approx(s.step_ms(16, 0) + 2.0)
    assert p.step_ms(40, 2) == pytest.approx(s.step_ms(40, 2) + 3.0)
    assert p.decode_ms == pytest.approx(s.decode_ms + 2.0) and s.plus((0.0,) * 3) is s


@pytest.fixture(scope="module")
def staggered():
    """The tiny pair in float64 under a 40-token budget, transformers' greedy (float64) and ten
    prompts of 6..29 tokens: at concurrency 3 their chunks ride beside decode rows, some split."""
    from transformers import LlamaForCausalLM

    from dynspec.runtime.engines.reference.load import load_reference_engine
    from dynspec.runtime.generate.session import tiny_pair_dirs

    target, draft = tiny_pair_dirs()
    hf = LlamaForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    eng = load_reference_engine(target, draft, dtype=torch.float64, max_batch_size=4, max_seq_len=128,
                                max_draft_len=2, max_num_tokens=40)
    rng = random.Random(3)
    ps = [tuple(rng.randrange(3, eng.vocab_size) for _ in range(rng.randrange(6, 30))) for _ in range(10)]
    return eng, hf, ps


def serve_greedy(staggered, policy) -> list:
    """Serve the prompts with `policy` at concurrency 3, assert every output is transformers' greedy
    one, and return the stats of the iterations with decode rows."""
    from dynspec.runtime.serving.driver import run_closed_loop
    from dynspec.runtime.serving.executor import Executor
    from tests.test_executor import greedy_many

    eng, hf, ps = staggered
    ex = Executor(eng, policy, stats_limit=None)
    res = run_closed_loop(ex, ps, 16, concurrency=3)
    assert [r.output_ids for r in res] == greedy_many(hf, ps, 16)
    return [s for s in ex.stats if s.batch_size]


def test_prefill_aware_rule_is_lossless_and_drops_k_where_a_prompt_ends(staggered):
    """Arrivals staggered so prompts' chunks ride beside decode rows (a small token budget splits
    some of them): every output is transformers' greedy one, and the steps that end a prompt's
    prefill run at K=0 while the others speculate."""
    cost = CostModel.from_profile(Profile.from_json(profile_doc(bs=(1, 4))))
    mixed_k0 = {}
    for w in (0.0, 64.0):
        stats = serve_greedy(staggered, AdaptivePolicy(cost, AdaptiveSettings(calibrate=False, explore_steps=0,
                                                                              ttft_weight=w, prior=0.9)))
        mixed = [s for s in stats if s.prefill_tokens]
        assert mixed and any(s.k > 0 for s in stats if not s.prefill_tokens)
        mixed_k0[w] = sum(s.k == 0 for s in mixed) / len(mixed)
    assert mixed_k0[0.0] < 0.5 <= mixed_k0[64.0], mixed_k0


def test_a_capped_schedule_is_lossless_and_drops_k_where_a_prompt_ends(staggered):
    """runtime/policy/prefill_cap.py on the same arrivals: every output is transformers' greedy one;
    every step that ends a prompt's prefill (at the schedule's K=2) runs at K=0, and others at K=2."""
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.policy.prefill_cap import PrefillCap

    stats = serve_greedy(staggered, PrefillCap(DraftSchedule.parse("4:2"), 0))
    ending = [s for s in stats if s.waiting and finishing(s.waiting, 40 - s.batch_size * 3)]   # at K=2
    assert ending and all(s.k == 0 for s in ending)
    assert any(s.k == 2 for s in stats if not s.prefill_tokens)


def test_profile_times_the_chunk_axis_and_the_cost_model_reads_it(tmp_path, capsys):
    """`dynspec profile --chunk-lens` on the tiny pair (CPU): every (b, K) with each chunk riding,
    one table per context, read back by the cost model; a chunk past what the target holds is refused."""
    from dynspec.cli import main

    out = tmp_path / "p.json"
    args = ["profile", "--batch-sizes", "1,2", "--draft-lens", "0,1", "--context-lens", "16,32", "--repeats", "1",
            "--warmup", "0", "--no-progress", "--out", str(out)]
    assert main(args + ["--chunk-lens", "8,24"]) == 0
    prof = Profile.load(out)
    assert [sorted(t.chunk_ms) for t in prof.tables] == [[8, 24], [8, 24]]
    assert all(sorted(t.chunk_ms[8]) == [1, 2] and sorted(t.chunk_ms[8][2]) == [0, 1] for t in prof.tables)
    cost = CostModel.load(out)
    assert cost.chunk.chunk_lens == (8, 24) and all(x >= 0 for x in cost.chunk.row(cost, 2, 20, 16))
    assert "with a 24-token chunk" in capsys.readouterr().out
    assert main(args + ["--chunk-lens", "9000"]) == 2
    assert "max_seq_len 9032" in capsys.readouterr().err          # context 32 + the 9000-token chunk


def test_tune_prices_the_served_steps_chunks(tmp_path, capsys):
    """`dynspec tune --chunk-share F --chunk-tokens T`: at a = 0.1, K=1 gains 1.1 x 10 / 11 = 1.0 over the
    rows alone (K=0 after the draft margin); with every step carrying a 128-token chunk (+2 ms)
    1.1 x 12 / 13 = 1.015: K=1. A profile without the chunk axis is refused."""
    from dynspec.cli import main

    f = tmp_path / "p.json"
    f.write_text(json.dumps(profile_doc()))
    base = ["tune", "--profile", str(f), "--context", "128", "--acceptance", "0.1", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(base + ["--chunk-share", "1", "--chunk-tokens", "128"]) == 0
    chunked = json.loads(capsys.readouterr().out)
    assert plain["schedule"] == "" and chunked["schedule"].endswith(":1"), (plain["schedule"], chunked["schedule"])
    bare = profile_doc()
    for t in bare["tables"]:
        del t["chunk_ms"]
    f.write_text(json.dumps(bare))
    assert main(base + ["--chunk-share", "0.5"]) == 2
    assert "--chunk-share needs a profile with a chunk axis" in capsys.readouterr().err


def test_the_simulator_prices_a_chunk_by_the_profiles_chunk_axis():
    """A step of 16 rows at K=2 with a 320-token chunk: the rows' profiled 12 ms plus the chunk axis'
    extra at 320 tokens (4.4 ms), in place of the fitted linear chunk price."""
    from dynspec.benchmarks.sim_engine import SimClock, SimEngine, shape_of
    from dynspec.runtime.policy.step_prices import StepPrices
    from dynspec.runtime.serving.plan import PromptChunk, make_plan

    cost = CostModel.from_profile(Profile.from_json(profile_doc()))
    eng = SimEngine(cost, shape_of(64, 1024, 2), SimClock(), StepPrices(chunk_fixed_ms=5.0, chunk_ms_per_token=1.0))
    slots = [eng.reserve(400, key=i) for i in range(17)]
    chunk = PromptChunk(slots[16], 0, (1,) * 320, None)
    plan = make_plan(2, positions=[128] * 16, pending=[1] * 16, stale=[False] * 16, keep_warm=False,
                     buckets=eng.buckets, slots=slots[:16], chunks=[chunk])
    assert eng.step_ms(plan) == pytest.approx(12.0 + 4.4)
    bare = make_plan(2, positions=[128] * 16, pending=[1] * 16, stale=[False] * 16, keep_warm=False,
                     buckets=eng.buckets, slots=slots[:16])
    assert eng.step_ms(bare) == pytest.approx(12.0)


def test_per_request_weighs_a_finishing_prompt_as_its_floor_does():
    """Rows at 0.95, 0.95, 0.05, 0.05 (pool 0.5): alone, a vector drafting the easy rows beats nothing it
    must; beside a prompt that the step ends at weight 64 the floor's plain decode (gain 1.0) stands,
    because the vector's gain is weighed like the floor's, not left unweighed above it."""
    import numpy as np

    from dynspec.runtime.policy.per_request import PerRequestPolicy, RowInputs
    from dynspec.runtime.policy.step_decision import StepInputs

    cost = CostModel.from_profile(Profile.from_json(profile_doc(bs=(1, 4, 16))))
    rates = np.array([[0.95, 0.95]] * 2 + [[0.05, 0.05]] * 2)

    def decide(w, waiting):
        pol = PerRequestPolicy(cost, AdaptiveSettings(calibrate=False, explore_steps=0, ttft_weight=w))
        return pol.decide(StepInputs(4, 128.0, (0.5, 0.5), max_k=2, bucket=4, rates=rates, idle=[0] * 4,
                                     row_probes=[0] * 4, waiting=waiting, token_budget=8192 if waiting else 0))

    assert decide(0.0, (100,)).k == 2 and decide(64.0, ()).k == 2
    weighed = decide(64.0, (100,))
    assert weighed.ks == (0, 0, 0, 0) and weighed.gain == pytest.approx(1.0)
    # the per-row vector itself (before the floor): the same K's, its gain weighed below plain decode's
    x = StepInputs(4, 128.0, (0.5, 0.5), max_k=2, bucket=4, rates=rates, waiting=(100,), token_budget=8192)
    row = {w: PerRequestPolicy(cost, AdaptiveSettings(calibrate=False, explore_steps=0, ttft_weight=w))._per_row(
        RowInputs(4, 128.0, x.acceptance, rates, np.zeros(4), 2, batch=x))[0] for w in (0.0, 64.0)}
    assert row[64.0].ks == row[0.0].ks and any(row[0.0].ks) and row[64.0].gain < 1.0 < row[0.0].gain


def test_the_weight_is_an_engine_json_field_read_by_the_served_policy(tmp_path):
    """engine.json ttft_weight reaches the served policy (session.policy_of); null keeps the
    policy's default; a negative, boolean or text weight is refused naming the field."""
    from dataclasses import replace

    from dynspec.config import EngineConfig
    from dynspec.runtime.generate.session import engine_config_for, policy_of, tiny_pair_dirs
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.policy.adaptive import TTFT_WEIGHT

    (tmp_path / "cost_model.json").write_text(json.dumps(profile_doc(bs=(1, 4))))
    cfg = replace(engine_config_for(*tiny_pair_dirs(), DraftSchedule.parse("2:2")), policy="adaptive")
    cfg.write(tmp_path)
    assert policy_of(EngineConfig.load(tmp_path)).settings.ttft_weight == TTFT_WEIGHT
    replace(cfg, ttft_weight=8.0).write(tmp_path)
    loaded = EngineConfig.load(tmp_path)
    assert loaded.ttft_weight == 8.0 and policy_of(loaded).settings.ttft_weight == 8.0
    doc = json.loads((tmp_path / "engine.json").read_text())
    for bad in (-1, True, "8"):
        (tmp_path / "engine.json").write_text(json.dumps(dict(doc, ttft_weight=bad)))
        with pytest.raises(DynspecError, match=r"engine.json: field 'ttft_weight' is .*; it must be a number >= 0"):
            EngineConfig.load(tmp_path)


def test_fitted_prices_price_a_chunk_where_the_profile_has_no_chunk_axis():
    """chunk_cost.FittedChunk: the worked example (the H100's fitted prices, a 256-token chunk: 5.68 ms
    at K=0, 6.62 ms at K > 0), a short chunk's negative fit clamped at 0, and with_fitted_chunks
    leaving a profile's own chunk axis, and prices without a chunk price, alone."""
    import dataclasses

    from dynspec.runtime.policy import POLICIES
    from dynspec.runtime.policy.chunk_cost import FittedChunk, with_fitted_chunks
    from dynspec.runtime.policy.step_prices import StepPrices

    h100 = StepPrices(host_ms=0.32, chunk_fixed_ms=-2.015, chunk_ms_per_token=0.0301, draft_chunk_ms_per_token=0.00367)
    bare = CostModel.from_profile(Profile.from_json({**profile_doc(), "tables": [
        {k: v for k, v in t.items() if k != "chunk_ms"} for t in profile_doc()["tables"]]}))
    priced = with_fitted_chunks(bare, h100)
    assert isinstance(priced.chunk, FittedChunk) and bare.chunk is None
    assert priced.chunk.row(priced, 64, 128, 256) == pytest.approx((5.6906, 6.6301, 6.6301), abs=1e-4)
    assert priced.chunk.row(priced, 64, 128, 32) == pytest.approx((0.0, 0.1174, 0.1174), abs=1e-4)   # target: clamped
    assert priced.chunk.row(priced, 64, 128, 0) == (0.0, 0.0, 0.0)
    assert with_fitted_chunks(bare, dataclasses.replace(h100, chunk_fixed_ms=-20.0)).chunk.row(bare, 16, 128, 64)[0] == 0.0
    axis = CostModel.from_profile(Profile.from_json(profile_doc()))
    assert with_fitted_chunks(axis, h100) is axis
    assert with_fitted_chunks(bare, None) is bare
    assert with_fitted_chunks(bare, StepPrices(ragged_factor=1.2)) is bare
    pol = POLICIES["adaptive"].make(bare, prices=h100, ttft_weight=0)        # throughput alone: reads the
    assert pol.reads_prompts and isinstance(pol.cost.chunk, FittedChunk)      # prompts to price their chunk
    assert not POLICIES["adaptive"].make(bare, ttft_weight=0).reads_prompts
    x = PolicyInputs(64, 128, (0.6, 0.6), bucket=64, waiting=(256,), token_budget=8192)
    side = pol.prompt_side(x, 128)
    assert side.extra_ms == pytest.approx((5.6906, 6.6301, 6.6301), abs=1e-4) and side.finishing == (1, 1, 1)
