"""Recorded acceptance traces (runtime/policy/acceptance_trace.py), their replay (TraceReplay in
runtime/policy/acceptance.py) and the recorder (benchmarks/record_trace.py), checked against the tiny
pair's own speculative decoding."""
import json
from pathlib import Path

import numpy as np
import pytest

from dynspec.benchmarks.record_trace import TRACE, chain_runs, main, one_thread, replay_steps
from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance import (TraceReplay, accept_bits, accept_lengths, parse_acceptance, rate_of,
                                        resolve, trace_table)
from dynspec.runtime.policy.acceptance_trace import (FORMAT, Trace, from_vllm_stats, read_trace, steps_to_offsets,
                                              summary, trace_text, write_trace)

GOOD = {"format": FORMAT, "source": {"pair": "test"}, "kmax": 4, "requests": [[4, 3, 0, 1], [0, 0, 2]]}


def write(tmp_path, obj, name="t.json") -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def with_(**kw):
    return {**GOOD, **kw}


@pytest.mark.parametrize("obj, says", [
    ("{not json", "not JSON"),
    ([1, 2], "a trace is a JSON object, not list"),
    (with_(format="dynspec-acceptance-trace/2"), "field 'format' is 'dynspec-acceptance-trace/2'"),
    ({k: v for k, v in GOOD.items() if k != "source"}, "field 'source' must be an object"),
    (with_(kmax=0), "field 'kmax' is 0"),
    (with_(kmax=True), "field 'kmax' is True"),
    (with_(kmax="4"), "field 'kmax' is '4'"),
    (with_(requests=[]), "field 'requests' must be a non-empty list"),
    (with_(requests=[[1], []]), "requests[1] must be a non-empty list"),
    (with_(requests=[[1], 3]), "requests[1] must be a non-empty list"),
    (with_(requests=[[1, 2, 5]]), "requests[0][2] is 5; expected an integer in 0..kmax=4"),
    (with_(requests=[[1, -1]]), "requests[0][1] is -1"),
    (with_(requests=[[1.0]]), "requests[0][0] is 1.0"),
    (with_(requests=[[0, False]]), "requests[0][1] is False"),
])
def test_reader_refuses_bad_files_naming_file_and_field(tmp_path, obj, says):
    p = write(tmp_path, obj)
    with pytest.raises(DynspecError) as e:
        read_trace(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and says in msg and "\n" not in msg, msg


def test_reader_names_a_missing_file(tmp_path):
    with pytest.raises(DynspecError, match=r"nope\.json: cannot read the acceptance trace"):
        read_trace(tmp_path / "nope.json")


def test_round_trip_one_request_per_line_and_no_temp_left(tmp_path):
    t = Trace(4, ((4, 3, 0, 1), (0, 0, 2)), {"pair": "test", "new_tokens": 4})
    p = tmp_path / "sub" / "t.json"
    write_trace(p, t)
    back = read_trace(p)
    assert back == t and back.source == t.source and back.path == str(p)
    assert json.loads(p.read_text()) == {"format": FORMAT, "source": dict(t.source), "kmax": 4,
                                         "requests": [[4, 3, 0, 1], [0, 0, 2]]}
    assert "    [4,3,0,1],\n    [0,0,2]\n" in p.read_text() and p.read_text() == trace_text(t)
    assert [q.name for q in p.parent.iterdir()] == ["t.json"]
    with pytest.raises(DynspecError, match="requests\\[0\\]\\[0\\] is 9"):
        Trace(4, ((9,),))


def model_of(tmp_path, requests, seed=0, kmax=8) -> TraceReplay:
    p = tmp_path / "trace.json"
    write_trace(p, Trace(kmax, tuple(tuple(r) for r in requests), {"pair": "test"}))
    return TraceReplay(str(p), seed)


def test_key_draws_a_fixed_sequence_spread_over_all(tmp_path):
    """8 recorded requests, 8,000 keys: the same index on every call and for a new model of the
    same seed; each request drawn 1/8 of the time within 0.03 (sd of a share: 0.0037)."""
    reqs = [[i % 9] * (3 + i) for i in range(8)]
    m = model_of(tmp_path, reqs, seed=5)
    keys = range(8000)
    idx = [m.index(k) for k in keys]
    assert idx == [TraceReplay(m.path_or_trace, 5).index(k) for k in keys]
    assert all(abs(idx.count(i) / len(idx) - 1 / 8) < 0.03 for i in range(8))
    other = [TraceReplay(m.path_or_trace, 6).index(k) for k in keys]
    assert sum(a != b for a, b in zip(idx, other)) > 0.8 * len(idx)
    assert resolve(m, 100) is m and not m.lossless


def test_lengths_wrap_table_and_rate(tmp_path):
    m = model_of(tmp_path, [[3, 0, 2], [1, 1, 0, 0, 5]])
    key = next(k for k in range(100) if m.index(k) == 0)
    assert [accept_lengths(m, key, t, 2) for t in range(7)] == [2, 0, 2, 2, 0, 2, 2]   # wraps at 3
    assert accept_lengths(m, key, np.array([0, 4]), 8).tolist() == [3, 0]
    assert accept_bits(m, key, 2, 4).tolist() == [True, True, False, False]
    assert rate_of(m, key) == pytest.approx(2 / 3)
    key1 = next(k for k in range(100) if m.index(k) == 1)
    assert rate_of(m, key1) == pytest.approx(3 / 5)
    table, lengths = trace_table(m, [key, key1, key])
    assert table.dtype == np.int8 and table.shape == (3, 5) and lengths.tolist() == [3, 5, 3]
    assert table.tolist() == [[3, 0, 2, 0, 0], [1, 1, 0, 0, 5], [3, 0, 2, 0, 0]]
    t = m.trace
    assert TraceReplay(t, 0).index(key) == 0 and str(TraceReplay(t)) == f"trace:{t.path}"


def test_str_parse_round_trip_keeps_the_path(tmp_path):
    m = model_of(tmp_path, [[1, 2]])
    path = tmp_path / "Mixed Case" / "Trace.JSON"
    path.parent.mkdir()
    path.write_text(Path(m.path_or_trace).read_text())
    text = f"trace:{path}"
    got = parse_acceptance(f"  {text} ", seed=3)
    assert got == TraceReplay(str(path), 3) and str(got) == text and parse_acceptance(str(got), seed=3) == got
    for bad, says in ((f"trace:{tmp_path}/missing.json", "missing.json: cannot read"), ("trace:", "needs a trace file")):
        with pytest.raises(DynspecError) as e:
            parse_acceptance(bad)
        assert repr(bad) in str(e.value) and says in str(e.value)
    with pytest.raises(DynspecError, match="'trace:PATH'"):
        parse_acceptance("tracer:x")


@pytest.fixture(scope="module")
def pair():
    from dynspec.corpus import ASSET_DIR
    from dynspec.pairs.decode import check_prompts
    from dynspec.runtime.engines.reference.load import load_draft, load_target

    target = load_target(Path(ASSET_DIR) / "target")
    return target, load_draft(Path(ASSET_DIR) / "draft", target), check_prompts(Path(ASSET_DIR), 2)


def test_replay_equals_spec_decode_for_k_1_to_4(pair):
    """The oracle: greedy K-chain speculative decoding's accepted count at every step equals
    min(r_t, K) at the step's offset, for K = 1..4, on 2 held-out prompts."""
    from dynspec.pairs.decode import spec_decode

    target, draft, prompts = pair
    new, seen = 32, set()
    with one_thread():
        for p in prompts:
            r = chain_runs(target, draft, p, new, 8)
            assert len(r) == new and all(0 <= x <= 8 for x in r)
            seen |= set(r)
            for k in range(1, 5):
                assert replay_steps(r, new, k) == spec_decode(target, draft, p, new, k)[1], (k, r)
    assert len(seen) > 2                                # more than all-or-nothing acceptance


def test_committed_trace_is_small_valid_and_described():
    t = read_trace(TRACE)
    assert TRACE.stat().st_size <= 100_000 and t.kmax == 8
    assert len(t.requests) == 32 and set(t.lengths.tolist()) == {96}
    assert "record_trace" in t.source["command"] and t.source["new_tokens"] == 96
    s = summary(t)
    assert 0 < s["mean_r"] < 8 and s["request_mean_r"]["min"] < s["request_mean_r"]["max"]


def test_vllm_detailed_stats_replay_at_their_draft_lengths():
    """vLLM's `detailed` per-request stats -> a trace whose replay at the recorded draft
    lengths gives back per_step_accepted."""
    stats = [{"per_step_accepted": [2, 0, 3, 1], "per_step_drafted": [3, 3, 3, 3], "num_spec_tokens": 3},
             {"per_step_accepted": [0], "per_step_drafted": [2], "num_spec_tokens": 3}]
    t = from_vllm_stats(stats, {"from": "test"})
    assert t.kmax == 3 and t.requests[0] == (2, 1, 0, 0, 3, 2, 1, 0, 1, 0) == tuple(steps_to_offsets([2, 0, 3, 1]))
    new = len(t.requests[0]) + 1
    assert replay_steps(list(t.requests[0]), new, 3) == [2, 0, 3, 1]
    with pytest.raises(DynspecError, match="request 0: every step needs 0 <= accepted <= drafted"):
        from_vllm_stats([{"per_step_accepted": [4], "per_step_drafted": [3]}], {})
    with pytest.raises(DynspecError, match="'detailed' level"):
        from_vllm_stats([{"num_spec_steps": 4}], {})


def test_cli_refuses_abbreviations_and_bad_values(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "t.json"), "--prom", "2"])
    assert e.value.code == 2
    assert main(["--out", str(tmp_path / "t.json"), "--kmax", "0", "--no-progress"]) == 2
    assert "--kmax 0: need at least 1" in capsys.readouterr().err


def test_cli_records_a_small_trace(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["--out", str(out), "--prompts", "1", "--new", "6", "--kmax", "3", "--no-progress"]) == 0
    t = read_trace(out)
    assert t.kmax == 3 and [len(r) for r in t.requests] == [6]
    assert json.loads(capsys.readouterr().out)["requests"] == 1
    assert t.source["command"].endswith("--out " + str(out) + " --prompts 1 --new 6 --kmax 3 --no-progress")
