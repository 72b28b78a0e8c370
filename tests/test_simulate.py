"""The serving simulator (benchmarks/simulate.py) against the recorded GPU runs of benchmarks/sim_data,
through the suite's sim_validate config (the one CI runs).

Asserted: on runs the step prices were not fitted on (held out: the H100 at 36ff40d, f0503fd, fec0955 and 0f964d7,
priced from the 6e9fc00 run), tok/s within 7% and each mode / baseline ratio within 6% of the
measured trials' spread at every point (simulate.trial_errors), and the medians within
TOK_TOLERANCE / RATIO_TOLERANCE (5% / 3%) at 85% of them (94 of 108 today); on every run, Poisson
points within the tolerances. The rest is reported in summary.json, not asserted (docs/design.md,
"The serving simulator": the per-row steps' single price, the adaptive estimate on two-wave runs)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynspec.benchmarks import simulate
from dynspec.benchmarks.sim_engine import SimClock, SimEngine, shape_of
from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import Bernoulli
from dynspec.runtime.policy.cost_model import CostModel
from dynspec.runtime.serving.plan import make_plan

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_data"


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    from dynspec.benchmarks import suite

    out = tmp_path_factory.mktemp("suite")
    assert suite.main(["sim_validate", "--out-root", str(out), "--no-progress"]) == 0
    return json.loads((out / "sim_validate" / "summary.json").read_text())


@pytest.fixture(scope="module")
def rows(summary):
    return summary["values"]["validation"]


def test_every_recorded_point_is_simulated(rows):
    want = {(m["config"], m["case"], meta_dir.name, x["load"], x["mode"])
            for meta_dir in DATA.iterdir() if (meta_dir / "runs.json").is_file()
            for m in json.loads((meta_dir / "runs.json").read_text())["runs"] for x in m["measured"]}
    assert len(rows) == len(want) and len(rows) >= 90


def test_held_out_runs_within_tolerance(rows, summary):
    held = [r for r in rows if r["held_out"]]
    assert len(held) >= 80
    bad = [r for r in held if abs(r["trial_tok_error"]) > 0.07 or abs(r["trial_ratio_error"] or 0.0) > 0.06]
    assert not bad, simulate.table(bad)
    assert sum(simulate.within([r]) for r in held) >= 0.85 * len(held), simulate.table(held)
    assert summary["values"]["held_out_within"] == sum(simulate.within([r]) for r in held)


def test_poisson_points_within_tolerance(rows):
    poisson = [r for r in rows if r["load"].startswith("poisson")]
    assert len(poisson) >= 20 and simulate.within(poisson), simulate.table(poisson)


def test_bernoulli_draws_are_the_engines_rule():
    """A row drafting K=4 at p=1 accepts 4, at p=0 none; a row's K_i caps it."""
    cost = CostModel.load(DATA / "h100-36ff40d" / "profile.json")
    clock = SimClock()
    eng = SimEngine(cost, shape_of(8, 64, 4), clock)
    a, b = eng.reserve(32, key=3), eng.reserve(32, key=4)
    plan = make_plan(4, positions=[10, 12], pending=[1, 1], stale=[False, False], keep_warm=False,
                     buckets=eng.buckets, slots=[a, b], row_k=(4, 2))
    assert eng.step(plan, Bernoulli(1.0)).accepted == (4, 2)
    assert eng.step(plan, Bernoulli(0.0)).accepted == (0, 0)
    assert clock() == pytest.approx(2 * eng.step_ms(plan) / 1e3)
    with pytest.raises(DynspecError, match="above max_seq_len"):
        eng.reserve(65)


def test_the_cli_refuses_sweep_flags_with_validate(tmp_path, capsys):
    assert simulate.main(["--validate", str(DATA), "--concurrency", "4", "--out", str(tmp_path / "v")]) == 2
    assert "takes no sweep flags" in capsys.readouterr().err


def test_lazy_sync_is_priced_as_served():
    """A stored chunk pays no draft pass (sim_engine: draft_chunk_ms_per_token x T only where the
    draft runs over it); a catch-up pays the line through the profile's catch_up record: b=1 at
    100 entries and b=64 at 6400 lie near it (fec0955's H100 profile)."""
    from dynspec.runtime.policy.catch_up_price import catch_up_price
    from dynspec.runtime.policy.cost_model import Profile
    from dynspec.runtime.policy.step_prices import StepPrices
    from dynspec.runtime.serving.plan import CatchUp, PromptChunk

    path = DATA / "h100-fec0955" / "profile_serving_256.json"
    prof = Profile.load(path)
    line = catch_up_price(prof)
    fixed, per = line.fixed_ms, line.ms_per_entry
    rec, table = prof.meta["catch_up"], next(t for t in prof.tables if t.context_len == 128)
    for b in (1, 64):
        measured = rec["ms"][str(b)] - table.iteration_ms[b][1]
        assert fixed + per * b * 100 == pytest.approx(measured, rel=0.25)
    eng = SimEngine(CostModel.load(path), shape_of(8, 256, 4, draft_sync_cap=256), SimClock(),
                    StepPrices(draft_chunk_ms_per_token=0.004), line)
    common = dict(positions=[100, 120], pending=[1, 1], stale=[False, False], keep_warm=False, buckets=eng.buckets,
                  slots=[1, 2], lazy=True, chunks=[PromptChunk(3, 0, (5,) * 100, None)])
    drafted, stored = make_plan(0, **common), make_plan(0, store_chunks=True, **common)
    assert eng.step_ms(drafted) - eng.step_ms(stored) == pytest.approx(0.004 * 100)
    caught = make_plan(0, store_chunks=True, catch_up=[CatchUp(1, 50, (5,) * 49)], **common)
    assert eng.step_ms(caught) - eng.step_ms(stored) == pytest.approx(fixed + per * 49)


def test_the_replay_serves_the_draft_sync_the_sweep_flags_ask_for():
    """simulate's sweep-flag runs serve what the sweep would (sweep_plan's rule): engine.json's
    default (lazy) unless --draft-sync or the former --keep-warm says otherwise."""
    from dynspec.benchmarks.sim_run import served_sync

    assert served_sync(["--concurrency", "4"]) == "lazy"
    assert served_sync(["--draft-sync", "warm"]) == "warm"
    assert served_sync(["--keep-warm", "off", "--draft-sync", "warm"]) == "off"


def test_a_schedule_tuned_on_served_steps_stops_drafting_where_serving_256_lost(tmp_path, capsys):
    """The H100 run at 0f964d7 (serving_256: C=256, a = 0.5, prompts 64..192, outputs 32..224): the
    schedule tuned on its decode steps drafts K=1 up to b=256 and served 0.963x baseline (measured;
    the replay agrees within 1%). Tuned with --prefill-ratio 1 (one prompt token per generated
    token, at the H100's fitted prices) K=1 stops below b=256, and the replay serves >= baseline."""
    from dynspec.cli import main

    run = json.loads((DATA / "h100-0f964d7" / "runs.json").read_text())["runs"][0]
    profile = str(DATA / "h100-0f964d7" / run["cost_model"])
    tune = ["tune", "--profile", profile, "--context", "256", "--acceptance", "0.5", "--json"]
    assert main(tune) == 0
    decode_only = json.loads(capsys.readouterr().out)["schedule"]
    assert main(tune + ["--prefill-ratio", "1", "--step-prices", str(DATA)]) == 0
    served = json.loads(capsys.readouterr().out)["schedule"]
    assert decode_only.endswith("256:1") and int(served.rsplit(",", 1)[-1].split(":")[0]) < 256, (decode_only, served)

    def ratio(schedule: str) -> float:
        out = tmp_path / schedule.replace(",", "_").replace(":", "-")
        assert simulate.main(["--cost-model", profile, "--step-prices", str(DATA / "h100_prices.json"),
                              "--max-seq-len", str(run["max_seq_len"]), "--out", str(out), "--no-progress",
                              "--modes", "baseline,dynamic", "--dynamic-schedule", schedule, "--acceptance",
                              "bernoulli:0.5", "--input-len", "64:192", "--output-len", "32:224", "--concurrency",
                              "256", "--waves", "6", "--warmup-requests", "2", "--trials", "1"]) == 0
        tok = {r["mode"]: r["output_tok_per_s"] for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
        return tok["dynamic"] / tok["baseline"]

    assert ratio(decode_only) < 0.975 and ratio(served) >= 0.995


def test_a_per_row_vector_runs_packed_only_beside_a_prompt_chunk():
    """The CUDA reference engine (plan.Engine packs_rows_alone False): a per-row vector without a
    chunk runs the decode graph at its deepest K, priced as that uniform step; beside a chunk it is
    packed, priced by the split at its own tokens (1334768's H100 profile)."""
    from dynspec.runtime.serving.plan import PromptChunk

    eng = SimEngine(CostModel.load(DATA / "h100-1334768" / "profile_per_request_bimodal.json"),
                    shape_of(64, 432, 4), SimClock())
    assert eng.packs_rows and not eng.packs_rows_alone
    common = dict(positions=[200] * 64, pending=[1] * 64, stale=[False] * 64, keep_warm=False, buckets=eng.buckets,
                  slots=list(range(1, 65)))
    ragged = (3,) * 16 + (0,) * 48
    for chunks in ((), (PromptChunk(70, 0, (5,) * 128, None),)):
        vector = eng.step_ms(make_plan(3, row_k=ragged, chunks=chunks, **common))
        uniform = eng.step_ms(make_plan(3, chunks=chunks, **common))
        assert vector == pytest.approx(uniform) if not chunks else vector < 0.8 * uniform


def test_the_oracle_is_not_priced_packed_where_the_engine_pads(tmp_path):
    """mix30 (0.95 for 30% of requests, 0.05 for 70%) on 1334768's profile: the GPU run there, whose
    per-row policies were told every step packs, served the oracle at 0.958x / 0.936x baseline
    against adaptive's 0.997x / 0.990x at C = 64 / 256 (per-row vectors without a chunk ran as
    uniform K=3..4 steps). Told where the engine packs, the oracle stays within 1% of adaptive."""
    out = tmp_path / "m30"
    assert simulate.main(["--cost-model", str(DATA / "h100-1334768" / "profile_per_request_bimodal.json"),
                          "--step-prices", str(DATA / "h100_prices.json"), "--no-progress", "--max-seq-len", "432",
                          "--input-len", "64:192", "--output-len", "32:224", "--modes", "adaptive,per-request-oracle",
                          "--acceptance", "bernoulli-mix:0.95@0.3,0.05@0.7", "--concurrency", "64,256", "--waves", "2",
                          "--warmup-requests", "2", "--out", str(out)]) == 0
    tps = {(r["mode"], r["concurrency"]): r["output_tok_per_s"] for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    for c in (64, 256):
        assert tps[("per-request-oracle", c)] >= 0.99 * tps[("adaptive", c)], tps


OLD_BUCKETS = tuple(range(16, 129, 16)) + tuple(range(160, 513, 32)) + tuple(range(576, 1025, 64))


@pytest.mark.parametrize("C,profile,schedule", [(16, "profile_serving.json", "1:3,70:2,202:1"),
                                                (64, "profile_serving.json", "1:3,70:2,202:1"),
                                                (256, "profile_serving_256.json", "1:3,68:2,208:1")])
def test_the_token_buckets_pad_at_most_5_percent_on_the_serving_loads(tmp_path, monkeypatch, C, profile, schedule):
    """The serving configs' dynamic mode (1334768's H100 profiles and tuned schedules, six waves,
    then Poisson at the baseline's rate): the mixed steps' padding (the engine's forward_tokens at
    mixed_layout.BUCKETS) stays within 5% of their tokens. With 32 apart from 128, as the H100
    measured it there (6.0% and 7.2% at C = 16), the simulated plans pad more than 5% at C = 16."""
    from dynspec.runtime.engines.reference import mixed_layout

    def share(out) -> dict:
        assert simulate.main(["--cost-model", str(DATA / "h100-1334768" / profile), "--no-progress",
                              "--step-prices", str(DATA / "h100_prices.json"), "--max-seq-len", "432",
                              "--input-len", "64:192", "--output-len", "32:224", "--modes", "dynamic",
                              "--dynamic-schedule", schedule, "--acceptance", "bernoulli:0.5", "--concurrency", str(C),
                              "--waves", "6", "--poisson-at", str(C), "--warmup-requests", "2", "--out", str(out)]) == 0
        rows = json.loads(out.with_suffix(".json").read_text())["rows"]
        return {r["concurrency"] or "poisson": r["padding_share"] for r in rows}

    now = share(tmp_path / "now")
    assert len(now) == 2 and all(0 < x <= 0.05 for x in now.values()), now
    if C == 16:
        monkeypatch.setattr(mixed_layout, "BUCKETS", OLD_BUCKETS)
        assert all(x > 0.05 for x in share(tmp_path / "old").values())
