"""dynspec tune: synthetic profiles whose best schedule is known in closed form."""
import json

import pytest

from dynspec.runtime.policy.tune import expected_tokens, interpolate, per_position_rates, tune
from dynspec.cli import main
from dynspec.errors import DynspecError
from dynspec.runtime.policy.cost_model import Profile
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.policy.schedule_vllm import _vllm_buckets, _vllm_steps

POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KS = (0, 1, 2, 3, 4)


def grid(cost, bs=POW2, ks=KS):
    return {b: {k: float(cost(b, k)) for k in ks} for b in bs}


def knee(b, k, floor=10.0, per_token=0.1):
    """Memory-bound floor until b*(K+1) tokens saturate compute, then linear in tokens."""
    return max(floor, per_token * b * (k + 1))


def brute_force(cost, a, b, ks=KS):
    """argmax_K b*E(K)/cost(b,K), E written out as a sum (independent of expected_tokens)."""
    def goodput(k):
        return b * sum(a ** i for i in range(k + 1)) / cost(b, k)
    best = max(goodput(k) for k in ks)
    return min(k for k in ks if goodput(k) >= best - 1e-12)      # ties -> smaller K


# ---- expected tokens --------------------------------------------------------------------
@pytest.mark.parametrize("k,a,want", [(0, 0.7, 1.0), (1, 0.7, 1.7), (3, 0.7, 1 + 0.7 + 0.49 + 0.343),
                                      (4, 1.0, 5.0), (4, 0.0, 1.0)])
def test_expected_tokens_single_rate(k, a, want):
    assert expected_tokens(k, a) == pytest.approx(want)


def test_expected_tokens_per_position_is_accepted_prefix_plus_one():
    # P(n>=1)=0.8, P(n>=2)=0.8*0.5, P(n>=3)=0.8*0.5*0.25
    assert expected_tokens(3, [0.8, 0.5, 0.25]) == pytest.approx(1 + 0.8 + 0.4 + 0.1)
    assert expected_tokens(0, [0.8]) == 1.0
    # equal per-position rates reduce to the single-rate formula
    assert expected_tokens(4, [0.7] * 4) == pytest.approx(expected_tokens(4, 0.7))
    with pytest.raises(DynspecError, match="needs 3 per-position"):
        expected_tokens(3, [0.8, 0.5])
    with pytest.raises(DynspecError, match="outside"):
        expected_tokens(1, 1.5)


def test_interpolate_linear_in_b():
    pts = {1: 10.0, 4: 13.0, 8: 21.0}
    assert interpolate(pts, 1) == 10.0
    assert interpolate(pts, 2) == pytest.approx(11.0)
    assert interpolate(pts, 6) == pytest.approx(17.0)
    assert interpolate(pts, 8) == 21.0
    assert interpolate(pts, 9) is None
    assert interpolate({2: 5.0}, 1) == 5.0            # below the smallest point: flat


# ---- the three known answers --------------------------------------------------------------
@pytest.mark.parametrize("a", [0.3, 0.7, 0.95])
def test_flat_cost_gives_max_k_everywhere(a):
    res = tune(grid(lambda b, k: 7.0), a)
    assert res.schedule == DraftSchedule(((256, 4),))
    assert all(r.k == 4 for r in res.rows)
    assert res.row(1).gain == pytest.approx(expected_tokens(4, a))


def test_flat_cost_respects_max_draft_len():
    res = tune(grid(lambda b, k: 7.0), 0.7, max_draft_len=2)
    assert res.schedule.to_spec() == "256:2"
    assert res.candidates == (0, 1, 2)


@pytest.mark.parametrize("a", [0.3, 0.7, 0.99])
def test_cost_proportional_to_tokens_gives_no_speculation(a):
    res = tune(grid(lambda b, k: 0.05 * b * (k + 1)), a)
    assert res.schedule == DraftSchedule()
    assert res.schedule.to_spec() == ""
    assert all(r.k == 0 and r.gain == pytest.approx(1.0) for r in res.rows)


def test_knee_dense_profile_crosses_over_at_the_right_batch_size():
    # K=1 vs K=0 at b: 1.7b/max(10, .2b) vs b/max(10, .1b): equal at b = 85, so K=0 from 85 on
    dense = tuple(range(1, 129))
    res = tune(grid(knee, bs=dense), 0.7)
    for b in dense:
        assert res.row(b).k == brute_force(knee, 0.7, b), b
    assert res.schedule.draft_len(84) == 1
    assert res.schedule.draft_len(85) == 0
    assert res.schedule.draft_len(1) == 4
    # the answer is non-increasing already, so nothing was smoothed
    assert all(r.k == r.best_k for r in res.rows)


def test_knee_sparse_profile_crosses_over_between_the_bracketing_points():
    res = tune(grid(knee), 0.7)
    first_zero = next(b for b in range(1, 257) if res.schedule.draft_len(b) == 0)
    assert 64 < first_zero <= 128            # the true crossover, 85, lies in (64, 128]
    for b in POW2:                           # at the profiled points the answer is exact
        assert res.schedule.draft_len(b) == brute_force(knee, 0.7, b), b
    interp = [r for r in res.table_rows() if not r.profiled]
    assert interp, "the K changes between profiled points are printed as interpolated rows"


def test_knee_moves_with_acceptance():
    lo = tune(grid(knee, bs=tuple(range(1, 129))), 0.5).schedule
    hi = tune(grid(knee, bs=tuple(range(1, 129))), 0.9).schedule
    off = lambda s: next(b for b in range(1, 200) if s.draft_len(b) == 0)     # noqa: E731
    assert off(lo) < off(hi)


def test_noisy_argmax_is_smoothed_to_a_valid_schedule():
    # one noisy point: K=4 at b=2 measured slow, so b=2 alone prefers K=3 while b=1 and b>=4
    # prefer K=4. K must not increase with b: raising b=2 (and the interpolated b=3) to K=4
    # costs far less than capping every b >= 2 at K=3, so the smoothing picks K=4 there.
    table = grid(lambda b, k: 12.0 if (b, k) == (2, 4) else 10.0)
    res = tune(table, 0.7)
    assert res.row(2).best_k == 3 and res.row(4).best_k == 4
    assert res.row(2).k == 4 and res.row(3).k == 4
    assert res.schedule.to_spec() == "256:4"
    # ... and when the dip is wide, the schedule steps down instead
    wide = grid(lambda b, k: 10.0 + (5.0 * (k == 4) if b >= 2 else 0.0) - (4.9 * (k == 4) if b >= 64 else 0.0))
    res = tune(wide, 0.7)
    ks = [res.schedule.draft_len(b) for b in range(1, 257)]
    assert all(x >= y for x, y in zip(ks, ks[1:]))
    assert res.row(64).best_k == 4 and res.row(64).k < 4
    DraftSchedule.parse(res.schedule.to_spec())               # a valid CLI form


def test_per_position_profile_acceptance():
    # decaying per-position rates: deep drafts are not worth their cost on a mildly sloped profile
    table = grid(lambda b, k: 10.0 + 1.0 * k)
    shallow = tune(table, [0.9, 0.1, 0.1, 0.1]).schedule
    deep = tune(table, [0.9, 0.9, 0.9, 0.9]).schedule
    assert shallow.max_draft_len == 1
    assert deep.max_draft_len == 4
    # K beyond the measured positions is not considered
    assert tune(table, [0.9, 0.9]).candidates == (0, 1, 2)


def test_min_gain_margin():
    # K=1 costs 60% more than plain decode: gain 1.7/1.6 = 1.0625 everywhere
    table = grid(lambda b, k: 10.0 * (1 + 0.6 * k), ks=(0, 1))
    assert tune(table, 0.7).schedule.to_spec() == "256:1"
    res = tune(table, 0.7, min_gain=1.1)
    assert res.schedule.to_spec() == "" and res.row(1).gain == pytest.approx(1.0)
    assert "K > 0 only where gain >= 1.1x" in res.table()
    with pytest.raises(DynspecError, match="min_gain"):
        tune(table, 0.7, min_gain=0.9)


def test_draft_margin_takes_the_smaller_k_of_a_near_tie():
    # an H200 regime-A profile at b=1 (ms): K=3 gains 2.533 * 4.989 / 6.314 = 2.0015x,
    # K=4 2.773 * 4.989 / 6.884 = 2.0096x; 0.4% apart, and a sweep served K=4 slower than K=3
    table = {1: {0: 4.989, 1: 5.336, 2: 5.905, 3: 6.314, 4: 6.884}}
    assert tune(table, 0.7).schedule.to_spec() == "1:4"
    res = tune(table, 0.7, draft_margin=1.01)
    assert res.schedule.to_spec() == "1:3" and res.row(1).best_k == 3
    assert res.row(1).gain == pytest.approx(2.533 * 4.989 / 6.314, rel=1e-4)      # the gain, not the score
    assert "each draft position must add 1.01x" in res.table() and res.to_json()["draft_margin"] == 1.01
    # a clear win survives the margin: K=4 at 10% over K=3
    clear = {1: {0: 4.989, 3: 6.314, 4: 6.884 * 2.0096 / 2.0015 / 1.1}}
    assert tune(clear, 0.7, draft_margin=1.01).schedule.to_spec() == "1:4"
    with pytest.raises(DynspecError, match="draft_margin 0.99 must be at least 1"):
        tune(table, 0.7, draft_margin=0.99)


def test_bad_profiles_are_named():
    with pytest.raises(DynspecError, match="no K=0"):
        tune({1: {1: 2.0, 2: 3.0}}, 0.7)
    with pytest.raises(DynspecError, match="batch size 2 has draft lengths"):
        tune({1: {0: 1.0, 1: 2.0}, 2: {0: 1.0}}, 0.7)
    with pytest.raises(DynspecError, match=r"iteration_ms\['2'\]\['1'\]"):
        Profile.from_json({"iteration_ms": {"1": {"0": 1.0, "1": 2}, "2": {"0": 1.0, "1": -3}}})
    with pytest.raises(DynspecError, match="per_position"):
        Profile.from_json({"iteration_ms": {"1": {"0": 1.0}}, "acceptance": {"per_position": [1.2]}})


def test_per_position_rates_from_accepted_counts():
    steps = [(3, (3, 1)), (3, (0, 3)), (0, (0, 0, 0))]           # K=0 steps are ignored
    assert per_position_rates(steps, 3) == pytest.approx((0.75, 2 / 3, 1.0))


# ---- the CLI ------------------------------------------------------------------------------
def test_tune_cli_writes_schedule_and_report(tmp_path, capsys):
    prof = {"device": "synthetic", "context_len": 1024,
            "iteration_ms": {str(b): {str(k): knee(b, k) for k in KS} for b in POW2},
            "acceptance": {"per_position": [0.7] * 4}}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof))
    out, rep = tmp_path / "schedule.txt", tmp_path / "tune.json"
    assert main(["tune", "--profile", str(path), "--acceptance", "0.7", "--out", str(out), "--report", str(rep)]) == 0
    printed = capsys.readouterr().out
    assert "gain vs K=0" in printed and "interpolated" in printed and "linear in batch size" in printed
    spec = out.read_text().strip()
    sched = DraftSchedule.parse(spec)
    assert sched.draft_len(1) == 4 and sched.draft_len(256) == 0
    doc = json.loads(rep.read_text())
    assert doc["schedule"] == spec and doc["command"].startswith("dynspec tune")
    # measured per-position rates equal to 0.7 give the same schedule
    capsys.readouterr()
    out2 = tmp_path / "s2.txt"
    assert main(["tune", "--profile", str(path), "--acceptance-from", "profile", "--out", str(out2)]) == 0
    assert out2.read_text() == out.read_text()
    capsys.readouterr()
    # --max-draft-len caps K
    assert main(["tune", "--profile", str(path), "--acceptance", "0.7", "--max-draft-len", "2", "--json"]) == 0
    assert DraftSchedule.parse(json.loads(capsys.readouterr().out)["schedule"]).max_draft_len == 2


def test_tune_cli_errors(tmp_path, capsys):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"iteration_ms": {"1": {"0": 1.0, "2": 1.5}}}))
    assert main(["tune", "--profile", str(path)]) == 2
    assert "exactly one of --acceptance" in capsys.readouterr().err
    assert main(["tune", "--profile", str(path), "--acceptance-from", "profile"]) == 2
    assert "per_position" in capsys.readouterr().err
    assert main(["tune", "--profile", str(tmp_path / "missing.json"), "--acceptance", "0.7"]) == 2
    assert "does not exist" in capsys.readouterr().err


# ---- profile -> tune on a real (tiny, random) engine ------------------------------------------
def test_profile_then_tune_end_to_end(tmp_path, capsys):
    from tests.helpers_models import make_tiny_draft, make_tiny_target

    target = make_tiny_target(tmp_path / "target", vocab=96, hidden=32, layers=4, heads=4, kv_heads=2)
    draft = make_tiny_draft(tmp_path / "draft", target)
    prof_path = tmp_path / "profile.json"
    assert main(["profile", "--target", str(target), "--draft", str(draft), "--batch-sizes", "1,2,4",
                 "--draft-lens", "1,3", "--context-lens", "24,8", "--warmup", "1", "--repeats", "3",
                 "--measure-acceptance", "--prompts", "random", "--input-len", "6", "--output-len", "8",
                 "--num-requests", "4", "--no-progress", "--out", str(prof_path)]) == 0
    printed = capsys.readouterr().out
    assert "K=0 ms" in printed and "acceptance per position" in printed
    assert printed.count("context 8\n") == 1 and printed.count("context 24\n") == 1
    doc = json.loads(prof_path.read_text())
    assert doc["format"] == "dynspec-profile/2" and doc["device"].startswith("cpu")
    assert doc["context_lens"] == [8, 24] and [t["context_len"] for t in doc["tables"]] == [8, 24]
    for t in doc["tables"]:
        assert set(t["iteration_ms"]) == {"1", "2", "4"}
        assert all(set(row) == {"0", "1", "3"} and min(row.values()) > 0 for row in t["iteration_ms"].values())
        assert set(t["decode_ms"]) == {"1", "2", "4"}
    assert doc["max_seq_len"] == 24 + 3 + 1            # one engine, sized for the largest context
    assert len(doc["acceptance"]["per_position"]) == 3
    assert doc["statistic"] == "median" and doc["repeats"] == 3 and doc["target_weight_bytes"] > 0
    assert doc["command"].startswith("dynspec profile")
    prof = Profile.load(prof_path)
    assert prof.table(24).iteration_ms[4][3] == doc["tables"][1]["iteration_ms"]["4"]["3"]
    out = tmp_path / "schedule.txt"
    assert main(["tune", "--profile", str(prof_path), "--acceptance-from", "profile", "--out", str(out)]) == 2
    assert "contexts [8, 24]; choose one (--context N)" in capsys.readouterr().err and not out.exists()
    assert main(["tune", "--profile", str(prof_path), "--acceptance-from", "profile", "--context", "24",
                 "--out", str(out)]) == 0
    DraftSchedule.parse(out.read_text().strip())


def test_profile_flag_errors(tmp_path, capsys):
    bad = tmp_path / "p.json"
    assert main(["profile", "--target", str(tmp_path / "none"), "--draft", str(tmp_path / "none"),
                 "--out", str(bad)]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert main(["profile", "--draft-lens", "0,-1", "--out", str(bad)]) == 2
    assert "--draft-lens" in capsys.readouterr().err


# ---- the token budget and bad inputs ----------------------------------------------------------
@pytest.mark.parametrize("budget", [5, 16, 100, 513])
def test_flat_cost_under_a_token_budget_takes_the_largest_k_that_fits(budget):
    """Flat cost: the best K is the largest allowed, so K(b) = min(4, budget // b - 1), floored at 0."""
    res = tune(grid(lambda b, k: 7.0), 0.7, max_num_tokens=budget)
    for b in range(1, 257):
        assert res.schedule.draft_len(b) == max(0, min(4, budget // b - 1)), b
    assert f"max_num_tokens {budget}" in res.table() and res.to_json()["max_num_tokens"] == budget


def test_budget_never_exceeded_on_a_knee_profile():
    res = tune(grid(knee), 0.9, max_num_tokens=24)
    free = tune(grid(knee), 0.9)
    assert all(r.k == 0 or r.batch_size * (r.k + 1) <= 24 for r in res.rows)
    assert any(r.batch_size * (r.k + 1) > 24 for r in free.rows if r.k)      # the budget did bind


def test_huge_batch_key_is_refused_fast():
    import time

    t = time.perf_counter()
    with pytest.raises(DynspecError, match="batch size 10000000 exceeds the tuner's maximum 16384"):
        tune({1: {0: 1.0, 1: 1.1}, 10_000_000: {0: 9.0, 1: 20.0}}, 0.7)
    assert time.perf_counter() - t < 0.5
    t = time.perf_counter()
    res = tune({1: {0: 1.0, 4: 1.2}, 16384: {0: 90.0, 4: 400.0}}, 0.7)          # at the maximum: still quick
    assert time.perf_counter() - t < 5 and len(res.rows) == 16384


def _profile(tmp_path, **extra):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"iteration_ms": {str(b): {str(k): 7.0 for k in KS} for b in POW2}, **extra}))
    return path


def test_tune_cli_budget_from_profile_or_flag(tmp_path, capsys):
    path = _profile(tmp_path, max_num_tokens=16)
    assert main(["tune", "--profile", str(path), "--acceptance", "0.7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == "3:4,4:3,5:2,8:1"   # 3*5, 4*4, 5*3, 8*2 <= 16
    assert main(["tune", "--profile", str(path), "--acceptance", "0.7", "--json", "--max-num-tokens", "8192"]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == "256:4"


@pytest.mark.parametrize("extra,flags,msg", [
    ({"decode_ms": {"1": "abc"}}, [], "decode_ms['1'] = 'abc' is not a positive number"),
    ({}, ["--max-draft-len=-1"], "max_draft_len -1 must be at least 0"),
    ({}, ["--min-gain", "nan"], "min_gain nan must be at least 1"),
    ({}, ["--draft-margin", "0.5"], "draft_margin 0.5 must be at least 1"),
    ({}, ["--max-num-tokens", "0"], "--max-num-tokens 0 must be an integer of at least 1"),
    ({"max_num_tokens": "8k"}, [], "field 'max_num_tokens' '8k' must be an integer"),
    ({}, ["--out", "DIR"], "--out DIR is a directory"),
    ({}, ["--out", "/proc/self/schedule.txt"], "--out /proc/self/schedule.txt cannot be written"),
    ({}, ["--out", "FILE/schedule.txt"], "cannot be written"),
    ({}, ["--report", "PROFILE"], "--report PROFILE is --profile PROFILE"),
    ({"iteration_ms": {"1": {"0": 1.0}, "10000000": {"0": 2.0}}}, [], "batch size 10000000 exceeds"),
])
def test_tune_cli_bad_inputs_are_one_line(tmp_path, capsys, extra, flags, msg):
    path = _profile(tmp_path, **extra)
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "d").mkdir()
    subs = {"DIR": str(tmp_path / "d"), "FILE": str(tmp_path / "FILE"), "PROFILE": str(path)}
    flags = [subs.get(f, f).replace("FILE/", subs["FILE"] + "/") for f in flags]
    for k, v in subs.items():
        msg = msg.replace(k, v) if k != "FILE" else msg
    assert main(["tune", "--profile", str(path), "--acceptance", "0.7", *flags]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
    assert json.loads(path.read_text())                                        # the profile is intact


# Two H200 profiles of regime B (ms per step, b -> K -> ms; 8B-shaped random pair, bf16): one on the
# grid 1, 4, 16, 64, 256, one with 128 and 192 profiled too.
COARSE_B = {1: {0: 5.1701, 1: 5.6341, 3: 6.3577, 5: 7.1895, 7: 8.0651}, 4: {0: 5.1674, 1: 5.6772, 3: 6.5441, 5: 7.5477, 7: 8.5616},
            16: {0: 5.4483, 1: 6.0101, 3: 7.1459, 5: 8.4177, 7: 9.4920},
            64: {0: 6.4337, 1: 7.3090, 3: 10.3388, 5: 15.0609, 7: 19.0020},
            256: {0: 12.0934, 1: 18.3127, 3: 33.2527, 5: 49.5799, 7: 65.5544}}
FINE_B = {1: {0: 5.1379, 1: 5.6141, 3: 6.3751}, 4: {0: 5.0940, 1: 5.6318, 3: 6.5321}, 16: {0: 5.3952, 1: 5.9574, 3: 6.9526},
          64: {0: 6.3512, 1: 7.1084, 3: 10.3531}, 128: {0: 7.8912, 1: 10.4146, 3: 17.5841},
          192: {0: 11.9288, 1: 18.0349, 3: 33.3678}, 256: {0: 12.2735, 1: 18.2615, 3: 33.2257}}


def test_thresholds_interpolated_across_a_wide_gap_are_named():
    """On the coarse grid straight lines between 64 and 256 put K 1 -> 0 at b=243; with 128 and 192
    profiled tune moves it to 187. The first is named as loose, the second is not (192 / 128 is
    within 2x); both name K 3 -> 1 between 16 and 64."""
    got = {}
    for name, table in (("coarse", COARSE_B), ("fine", FINE_B)):
        r = tune(table, 0.5)
        got[name] = (r.schedule.to_spec(), r.loose_thresholds(), r.table())
        assert r.to_json()["loose_thresholds"] == [dict(batch_size=b, k_before=k0, k=k1, profiled_below=lo,
                                                        profiled_above=hi) for b, k0, k1, lo, hi in got[name][1]]
    assert got["coarse"][:2] == ("27:3,242:1", ((28, 3, 1, 16, 64), (243, 1, 0, 64, 256)))
    assert got["fine"][:2] == ("28:3,186:1", ((29, 3, 1, 16, 64),))
    assert "K 1 -> 0 at b=243 is interpolated between profiled b=64 and b=256" in got["coarse"][2]
    assert "K 1 -> 0" not in got["fine"][2]


# ---- several contexts: --context and vLLM's 5-item grid ------------------------------------------------
def two_context_profile(tmp_path, contexts=(512, 2048)):
    """A profile whose attention cost grows with context: at 2048 each K costs more per row, so the
    tuned schedule stops speculating at a smaller batch size than at 512."""
    def cost(ctx):
        return lambda b, k: 10.0 + b * (k + 1) * (0.05 + 0.1 * ctx / 2048)
    doc = {"format": "dynspec-profile/2", "device": "synthetic", "context_lens": list(contexts),
           "tables": [{"context_len": c, "iteration_ms": {str(b): {str(k): v for k, v in row.items()}
                                                          for b, row in grid(cost(c)).items()}}
                      for c in contexts]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    return path, {c: grid(cost(c)) for c in contexts}


def test_tune_context_picks_that_table(tmp_path, capsys):
    path, tables = two_context_profile(tmp_path)
    for c in (512, 2048):
        out = tmp_path / f"s{c}.txt"
        assert main(["tune", "--profile", str(path), "--acceptance", "0.7", "--context", str(c), "--out", str(out)]) == 0
        assert out.read_text().strip() == tune(tables[c], 0.7, draft_margin=1.01).schedule.to_spec()
    assert (tmp_path / "s512.txt").read_text() != (tmp_path / "s2048.txt").read_text()
    capsys.readouterr()
    assert main(["tune", "--profile", str(path), "--acceptance", "0.7", "--context", "1024"]) == 2
    assert "no table at context 1024; it has [512, 2048]" in capsys.readouterr().err


def vllm_lookup(grid_entries, cap):
    """vLLM's own rules (DraftSchedule.from_vllm's encoding): {context range: ((first b, K), ...)}."""
    return {ctx: _vllm_steps(entries, cap, None) for ctx, entries in _vllm_buckets(grid_entries).items()}


def test_vllm_grid_buckets_look_up_the_schedule_tuned_for_their_context(tmp_path, capsys):
    path, tables = two_context_profile(tmp_path, contexts=(512, 2048, 4096))
    out = tmp_path / "vllm.json"
    assert main(["tune", "--profile", str(path), "--acceptance", "0.7", "--vllm-grid", str(out)]) == 0
    printed = capsys.readouterr().out
    assert all(f"context {c})" in printed for c in (512, 2048, 4096)) and "vLLM speculative_config" in printed
    doc = json.loads(out.read_text())
    entries, cap = doc["speculative_token_schedule"], doc["num_speculative_tokens"]
    assert all(len(e) == 5 for e in entries)
    looked_up = vllm_lookup(entries, cap)               # raises unless vLLM would accept the grid
    assert list(looked_up) == [(1, 1280), (1281, 3072), (3073, 2**31 - 1)]     # split at the midpoints
    want = {c: tune(tables[c], 0.7, draft_margin=1.01).schedule for c in tables}
    assert cap == max(s.max_draft_len for s in want.values())
    for (lo, hi), c in zip(looked_up, (512, 2048, 4096)):
        assert lo <= c <= hi
        # the same lookup as the 3-item list of the schedule tuned at c, under the same rules
        assert looked_up[(lo, hi)] == _vllm_steps(_vllm_buckets(want[c].to_vllm())[(1, 2**31 - 1)], cap, None)
    assert len({v for v in looked_up.values()}) > 1                       # K really depends on the context
    with pytest.raises(DynspecError, match="K depends on the context length"):
        DraftSchedule.from_vllm(entries, cap)


def test_vllm_grid_renderer_is_a_full_grid_vllm_accepts():
    from dynspec.runtime.policy.schedule_vllm import to_vllm_grid, vllm_context_buckets

    a, b = DraftSchedule.parse("4:3"), DraftSchedule.parse("2:3,8:1")
    g = to_vllm_grid([(512, a), (2048, b)])
    assert vllm_lookup(g, 3) == {(1, 1280): ((1, 3), (5, 0)), (1281, 2**31 - 1): ((1, 3), (3, 1), (9, 0))}
    assert len(g) == 2 * 4                               # batch starts 1, 3, 5, 9 in every context bucket
    # one context: a 5-item grid with one open bucket, the same lookup as to_vllm's 3-item list
    assert DraftSchedule.from_vllm(to_vllm_grid([(1024, b)]), 3) == b
    assert vllm_context_buckets((100, 101)) == ((1, 100), (101, 2**31 - 1))
    with pytest.raises(DynspecError, match="strictly ascending"):
        to_vllm_grid([(2048, a), (512, b)])
    with pytest.raises(DynspecError, match="never speculates"):
        to_vllm_grid([(512, DraftSchedule()), (2048, DraftSchedule())])


def test_vllm_grid_needs_context_lengths(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"iteration_ms": {"1": {"0": 10.0, "2": 11.0}}}))        # format 1, no context_len
    assert main(["tune", "--profile", str(path), "--acceptance", "0.7", "--vllm-grid", str(tmp_path / "v.json")]) == 2
    assert "needs each table's context_len" in capsys.readouterr().err and not (tmp_path / "v.json").exists()


# ---- prompts prefilled beside the rows (--prefill-ratio) -----------------------------------
def _prices(**kw):
    from dynspec.runtime.policy.step_prices import StepPrices

    return StepPrices(**({"chunk_ms_per_token": 0.030, "draft_chunk_ms_per_token": 0.0037} | kw))


def test_with_prefill_worked_example_turns_k_off_where_the_prompts_dilute_the_gain():
    """docs example: H100, context 256, a = 0.5, one prompt token per generated token. Decode steps
    alone give K=1 1.036x at b=256; as served, the target's prefill is the same per token at every K
    and the K=1 step also runs the draft over its chunk: 0.974x, K=0."""
    from dynspec.runtime.policy.tune import with_prefill

    table = {128: {0: 8.99, 1: 11.0}, 256: {0: 12.03, 1: 17.42}}
    served = with_prefill(table, 0.5, 1.0, _prices())
    assert served[256][0] == pytest.approx(12.03 + 256 * 0.030)
    assert served[256][1] == pytest.approx(17.42 + 384 * 0.0337)
    assert 1.5 * served[256][0] / served[256][1] == pytest.approx(0.974, abs=5e-4)
    assert tune(table, 0.5).row(256).k == 1 and tune(served, 0.5).row(256).k == 0
    assert tune(served, 0.5).row(128).k == 1                                       # 1.102x there
    warm = with_prefill(table, 0.5, 1.0, _prices(), draft_at_k0=True)             # warm sync: K=0 pays the draft too
    assert warm[256][0] == pytest.approx(12.03 + 256 * 0.0337) and warm[256][1] == served[256][1]
    assert with_prefill(table, 0.5, 0.0, _prices()) == table
    assert with_prefill({1: {0: 5.0, 3: 6.0}}, (0.5,), 1.0, _prices())[1][3] == 6.0  # K past the rates: never picked
    with pytest.raises(DynspecError, match="--prefill-ratio -1 must be"):
        with_prefill(table, 0.5, -1, _prices())
    with pytest.raises(DynspecError, match="chunk_ms_per_token"):
        with_prefill(table, 0.5, 1.0, _prices(chunk_ms_per_token=None))


def test_tune_cli_prefill_ratio_reads_the_profile_devices_prices(tmp_path, capsys):
    """--step-prices DIR picks the *_prices.json of the profile's GPU ('cuda (NAME)'); a folder without
    it prices decode steps alone and says so; a file of another GPU and half-given flags are refused."""
    from dynspec.runtime.policy import step_prices

    h100 = "NVIDIA H100 80GB HBM3"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"device": f"cuda ({h100})", "iteration_ms": {
        "128": {"0": 8.99, "1": 11.0}, "256": {"0": 12.03, "1": 17.42}}}))
    prices = tmp_path / "prices"
    prices.mkdir()
    step_prices.write(prices / "h100_prices.json", _prices(), h100, ["x"], ["chunk_tokens"])
    base = ["tune", "--profile", str(path), "--acceptance", "0.5", "--draft-margin", "1", "--json"]
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == "256:1"
    assert main(base + ["--prefill-ratio", "1", "--step-prices", str(prices)]) == 0
    served = json.loads(capsys.readouterr().out)["schedule"]
    assert served.startswith("2") and int(served.split(":")[0]) < 256, served    # K=1 stops below b=256
    other = tmp_path / "other"
    other.mkdir()
    assert main(base + ["--prefill-ratio", "1", "--step-prices", str(other)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["schedule"] == "256:1" and "no prices of 'cuda (NVIDIA H100" in out.err
    step_prices.write(other / "h200_prices.json", _prices(), "NVIDIA H200", ["y"], ["chunk_tokens"])
    for flags, msg in ((["--prefill-ratio", "1", "--step-prices", str(other / "h200_prices.json")],
                        "step prices of 'NVIDIA H200', and this engine runs on 'NVIDIA H100"),
                       (["--prefill-ratio", "1"], "--prefill-ratio needs --step-prices"),
                       (["--step-prices", str(prices)], "give --prefill-ratio too"),
                       (["--prefill-ratio", "1", "--step-prices", str(prices), "--chunk-share", "0.5"],
                        "give one of --chunk-share")):
        assert main(base + flags) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err


def test_a_profile_whose_steps_fall_with_more_rows_is_flagged(tmp_path, capsys):
    """ContextTable.falling: a step slower than a larger batch's at the same K by over 1.25x was
    timed beside other work (the committed serving run at 4f6efdb: context 128, b <= 16); `tune`
    and `profile` say so on stderr. A clean profile, noise within 25%, says nothing."""
    from dynspec.runtime.policy.cost_model import ContextTable

    clean = {1: {0: 6.4, 1: 7.0}, 16: {0: 6.3, 1: 7.1}, 32: {0: 6.8, 1: 7.5}}
    busy = {**clean, 16: {0: 14.6, 1: 7.1}}
    assert ContextTable(128, clean).falling() == ()
    assert ContextTable(128, busy).falling() == ((16, 0, 14.6, 32, 6.8),)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"device": "synthetic", "context_len": 128,
                                "iteration_ms": {str(b): {str(k): v for k, v in r.items()} for b, r in busy.items()}}))
    assert main(["tune", "--profile", str(path), "--acceptance", "0.5", "--json"]) == 0
    err = capsys.readouterr().err
    assert "warning: profile context 128: 1 (b, K) points take over 1.25x the step of a larger batch" in err
    assert "worst b=16 K=0 14.60 ms against b=32 6.80 ms" in err
