"""Measured acceptance from a sweep result, TensorRT-LLM iteration stats and a profile
(benchmarks/acceptance_sources.py), and `dynspec tune --acceptance-from FILE`."""
import json
import math

import pytest

from dynspec.benchmarks import sweep
from dynspec.benchmarks.acceptance_sources import (expected_accepted, fit_rate, from_sweep, per_position_from_means,
                                                   read_measured_acceptance)
from dynspec.cli import main
from dynspec.errors import DynspecError
from tests.helpers_models import make_tiny_draft, make_tiny_target


def _profile(tmp_path, per_position=None):
    """A synthetic profile: iteration ms rising with b x (K + 1) above a 10-ms floor."""
    prof = {"device": "synthetic", "context_len": 128,
            "iteration_ms": {str(b): {str(k): 10.0 + 0.1 * b * (k + 1) for k in range(5)}
                             for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)}}
    if per_position is not None:
        prof["acceptance"] = {"per_position": per_position}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof))
    return path


def test_worked_examples():
    assert expected_accepted(0.5, 2) == 0.75 and expected_accepted(0.3, 0) == 0
    assert fit_rate({2: 25}, 24) == pytest.approx(0.6, abs=1e-12)
    assert fit_rate({1: 4, 3: 2}, 0) == 0.0 and fit_rate({1: 4, 3: 2}, 10) == 1.0
    a = 0.7
    assert fit_rate({1: 50, 4: 30}, 50 * a + 30 * expected_accepted(a, 4)) == pytest.approx(a, abs=1e-12)
    assert per_position_from_means({1: 0.8, 2: 1.28}) == pytest.approx((0.8, 0.6))
    means = {1: 0.9, 2: 0.9 + 0.9 * 0.7, 3: 0.9 + 0.63 + 0.63 * 0.5}
    assert per_position_from_means(means) == pytest.approx((0.9, 0.7, 0.5))
    assert per_position_from_means({2: 1.0, 3: 1.5}) is None          # K=1 missing
    assert per_position_from_means({1: 0.5}) is None


# ---- TensorRT-LLM iteration stats ---------------------------------------------------------
def _trtllm_entry(it, requests, k, accepted):
    """One IterationStats entry in TRT-LLM's JSON field names (jsonSerialization.cpp)."""
    spec = {"numDraftTokens": requests * k, "numAcceptedTokens": accepted, "numRequestsWithDraftTokens": requests,
            "acceptanceLength": (accepted + requests) / requests if requests else 0.0,
            "iterLatencyMS": 1.5, "draftOverhead": 0.12}
    return {"timestamp": "01-02-2026 10:00:00", "iter": it, "iterLatencyMS": 21.5, "numActiveRequests": requests,
            "numQueuedRequests": 0, "numCompletedRequests": 0, "maxNumActiveRequests": 256,
            "inflightBatchingStats": {"numScheduledRequests": requests, "numContextRequests": 0,
                                      "numGenRequests": requests, "numPausedRequests": 0, "numCtxTokens": 0,
                                      "microBatchId": 0, "avgNumDecodedTokensPerIter": 0.0},
            "specDecodingStats": spec}


def test_trtllm_jsonl_fits_one_rate(tmp_path):
    """40 drafting requests at K=3 accepting 40 x (0.5 + 0.25 + 0.125) = 35 drafts -> a = 0.5;
    a context-only iteration (no specDecodingStats) and an idle one count nothing; one line is
    the JSON string that 1.2-era get_stats() hands out."""
    entries = [_trtllm_entry(1, 10, 3, 9), _trtllm_entry(2, 10, 3, 8), _trtllm_entry(3, 20, 3, 18),
               _trtllm_entry(4, 0, 3, 0)]
    lines = [json.dumps(e) for e in entries]
    lines[1] = json.dumps(lines[1])                               # a JSON string of the entry
    ctx = dict(entries[0])
    del ctx["specDecodingStats"]
    lines.insert(0, json.dumps(ctx))
    path = tmp_path / "iteration_stats.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    m = read_measured_acceptance(path)
    assert m.fitted and m.rate == pytest.approx(0.5, abs=1e-12) and m.per_position == (m.rate,) * 3
    assert (m.steps, m.drafted, m.accepted) == (40, 120, 35)
    assert "TensorRT-LLM" in m.source and "one rate fitted" in m.source


@pytest.mark.parametrize("line, says", [
    ("{not json", "line 2 is not JSON"),
    ("[1, 2]", "line 2 is list"),
    (json.dumps({"specDecodingStats": {"numDraftTokens": 7, "numAcceptedTokens": 1,
                                       "numRequestsWithDraftTokens": 2}}), "line 2: specDecodingStats numDraftTokens=7"),
    (json.dumps({"specDecodingStats": {"numDraftTokens": 6, "numAcceptedTokens": 7,
                                       "numRequestsWithDraftTokens": 2}}), "numAcceptedTokens=7"),
    (json.dumps({"specDecodingStats": {"numDraftTokens": 6, "numRequestsWithDraftTokens": 2}}),
     "line 2: specDecodingStats.numAcceptedTokens = None"),
])
def test_trtllm_bad_line_is_named(tmp_path, line, says):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(_trtllm_entry(1, 2, 3, 1)) + "\n" + line + "\n")
    with pytest.raises(DynspecError) as e:
        read_measured_acceptance(path)
    assert says in str(e.value) and str(path) in str(e.value)


def test_nothing_drafted_is_refused(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(_trtllm_entry(1, 0, 3, 0)) + "\n")
    with pytest.raises(DynspecError, match="nothing was drafted"):
        read_measured_acceptance(path)


# ---- a sweep's result JSON ----------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep_doc(tmp_path_factory):
    """A real CPU sweep at bernoulli:0.6: static K=2 and a dynamic schedule at K=1 (b <= 4)."""
    tmp = tmp_path_factory.mktemp("sweep")
    target = make_tiny_target(tmp / "target", vocab=96, hidden=32, layers=4, heads=4, kv_heads=2)
    draft = make_tiny_draft(tmp / "draft", target)
    out = tmp / "run"
    assert sweep.main(["--target", str(target), "--draft", str(draft), "--dynamic-schedule", "4:1", "--static-k", "2",
                       "--concurrency", "1,4", "--modes", "baseline,static,dynamic", "--acceptance", "bernoulli:0.6",
                       "--input-len", "4:8", "--output-len", "48", "--num-requests", "48", "--no-progress",
                       "--warmup-requests", "0", "--trials", "1", "--out", str(out)]) == 0
    return tmp / "run.json"


def test_sweep_gives_per_position_rates(sweep_doc):
    """Rows at K=1 (dynamic) and K=2 (static) -> a_1, a_2 of bernoulli:0.6. Counts: about 1,400
    K=1 and 1,200 K=2 row-steps at each C (48 requests x 48 tokens; C=1 and C=4 run the same
    requests, so the same draws): sd of a_1 ~ sqrt(0.24 / 1400) = 0.013, of a_2 (a ratio of
    differences of means) ~ 0.05; tolerances 0.065 and 0.2 are 5 and 4 sd."""
    m = read_measured_acceptance(sweep_doc)
    assert not m.fitted and len(m.per_position) == 2
    assert "per position from single-K rows" in m.source and "bernoulli:0.6" in m.source
    assert abs(m.per_position[0] - 0.6) < 0.065 and abs(m.per_position[1] - 0.6) < 0.2
    doc = json.loads(sweep_doc.read_text())
    drafting = [r for r in doc["rows"] if r["mode"] != "baseline"]
    drafted = sum(b * k * n for r in drafting for b, k, n in r["k_by_batch"])
    assert m.drafted == drafted and m.accepted == sum(round(r["acceptance_rate"] * sum(
        b * k * n for b, k, n in r["k_by_batch"])) for r in drafting)


def test_sweep_of_one_k_fits_one_rate(sweep_doc):
    """Static rows only (K=2): one rate a with a + a^2 = mean accepted; ~1,200 row-steps of
    variance ~0.76 -> sd of the mean 0.025, of a ~ 0.025 / (1 + 2a) = 0.011; tolerance 0.06 (5 sd)."""
    doc = json.loads(sweep_doc.read_text())
    doc["rows"] = [r for r in doc["rows"] if r["mode"] == "static"]
    m = from_sweep(doc, "static-only.json")
    assert m.fitted and len(m.per_position) == 2 and abs(m.rate - 0.6) < 0.06
    assert m.rate + m.rate ** 2 == pytest.approx(m.accepted / m.steps)


def test_sweep_bad_rows_are_named(sweep_doc, tmp_path):
    doc = json.loads(sweep_doc.read_text())
    i = next(i for i, r in enumerate(doc["rows"]) if r["mode"] == "static")
    doc["rows"][i]["acceptance_rate"] = None
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DynspecError, match=rf"bad.json: rows\[{i}\].acceptance_rate = None"):
        read_measured_acceptance(path)
    doc["rows"][i]["k_by_batch"] = [[1, 2]]
    path.write_text(json.dumps(doc))
    with pytest.raises(DynspecError, match=rf"rows\[{i}\].k_by_batch\[0\] = \[1, 2\] is not"):
        read_measured_acceptance(path)


# ---- profile and the CLI ------------------------------------------------------------------
def test_profile_source_and_errors(tmp_path):
    m = read_measured_acceptance(_profile(tmp_path, [0.8, 0.6, 0.5]))
    assert m.per_position == (0.8, 0.6, 0.5) and not m.fitted and m.steps == 0
    with pytest.raises(DynspecError, match=r"per_position\[1\] = 1.5"):
        read_measured_acceptance(_profile(tmp_path, [0.8, 1.5]))
    with pytest.raises(DynspecError, match="acceptance.per_position' is missing"):
        read_measured_acceptance(_profile(tmp_path))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(DynspecError, match="neither a sweep result"):
        read_measured_acceptance(other)
    with pytest.raises(DynspecError, match="does not exist"):
        read_measured_acceptance(tmp_path / "missing.jsonl")


def test_tune_from_measured_files(tmp_path, capsys):
    """A fitted rate tunes as that rate given by hand; per-position rates as the profile's own;
    the report and --json name the source."""
    prof = _profile(tmp_path, [0.8, 0.6, 0.5])
    stats = tmp_path / "iteration_stats.jsonl"
    stats.write_text(json.dumps(_trtllm_entry(1, 40, 3, 35)) + "\n")             # a = 0.5
    assert main(["tune", "--profile", str(prof), "--acceptance", "0.5", "--json"]) == 0
    by_hand = json.loads(capsys.readouterr().out)
    rep = tmp_path / "tune.json"
    assert main(["tune", "--profile", str(prof), "--acceptance-from", str(stats), "--report", str(rep)]) == 0
    assert "acceptance from TensorRT-LLM iteration stats" in capsys.readouterr().out
    doc = json.loads(rep.read_text())
    assert doc["schedule"] == by_hand["schedule"] and "TensorRT-LLM" in doc["acceptance_source"]
    assert by_hand["acceptance_source"] == "--acceptance 0.5"
    copy = tmp_path / "measured.json"
    copy.write_text(prof.read_text())
    assert main(["tune", "--profile", str(prof), "--acceptance-from", "profile", "--json"]) == 0
    own = json.loads(capsys.readouterr().out)
    assert main(["tune", "--profile", str(prof), "--acceptance-from", str(copy), "--json"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert own["schedule"] == other["schedule"] and "measured.json" in other["acceptance_source"]
    assert main(["tune", "--profile", str(prof), "--acceptance", "0.5", "--acceptance-from", str(stats)]) == 2
    assert "exactly one of --acceptance RATE and --acceptance-from FILE" in capsys.readouterr().err
    assert main(["tune", "--profile", str(prof), "--acceptance-from", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl does not exist" in capsys.readouterr().err
