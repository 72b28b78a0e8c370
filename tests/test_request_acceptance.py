"""Per-request acceptance: each finished request's accepted drafts, drafted tokens and decode
iterations (RequestResult), as the benchmarks record them, the Triton model returns them and the
HTTP front writes them, and the Prometheus histograms of /metrics parsed strictly.

Oracle: the executor's own per-iteration stats. Run one request at a time, every iteration
decodes exactly one request, so a request's numbers must equal the sums over its iterations;
run concurrently, the numbers summed over requests must equal the sums over all iterations.
The served side (tritonserver) is checked in tests/test_triton_server.py with `histograms` below.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dynspec.benchmarks.loadgen import closed_loop
from dynspec.benchmarks.metrics import REQUEST_FIELDS, RequestTiming, request_row, request_table
from dynspec.benchmarks.workload import BenchRequest
from dynspec.runtime.policy.acceptance import Bernoulli, Greedy
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.serving.executor import Executor, RequestResult
from dynspec.runtime.policy import DraftSchedule
from dynspec.triton_repo.http_rules import Events, acceptance_fields, list_output_ids, merge
from dynspec.triton_repo.request_acceptance import (ACCEPTANCE_BUCKETS, ACCEPTANCE_OUTPUTS, RequestAcceptance,
                                                    mean_k_buckets)
from tests.helpers_models import make_tiny_pair

KMAX = 4


# ---- a strict reader of Prometheus histograms (text exposition format 0.0.4) ---------------------
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*,?)?\}})? (\S+)(?: -?\d+)?$")
COMMENT = re.compile(rf"^# (HELP|TYPE) ({NAME})(?: (.*))?$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]    # (le, cumulative count), le ascending, +Inf last
    sum: float
    count: float


def _value(text: str) -> float:
    return float(text)              # float() reads "+Inf", "-Inf", "NaN" as Prometheus writes them


def histograms(text: str) -> dict[tuple[str, frozenset], Histogram]:
    """Prometheus text -> {(family, labels less le): Histogram} for every family typed histogram.
    Raises AssertionError on any line that is not the format: a sample line outside
    `name{label="v",...} value [timestamp]`, a histogram without # HELP or # TYPE, a series without
    le="+Inf", _sum or _count, bucket counts that fall as le grows, +Inf differing from _count."""
    types, helps, series = {}, set(), {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            m = COMMENT.match(line)
            if m is None:
                continue                    # a plain comment
            kind, name, rest = m.groups()
            if kind == "TYPE":
                assert rest in TYPES and name not in types, line
                types[name] = rest
            else:
                helps.add(name)
            continue
        m = SAMPLE.match(line)
        assert m is not None, f"not a Prometheus sample line: {line!r}"
        name, labels, value = m.group(1), m.group(2) or "", _value(m.group(3))
        pairs = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels))
        for suffix in ("_bucket", "_sum", "_count"):
            family = name[: -len(suffix)]
            if name.endswith(suffix) and types.get(family) == "histogram":
                le = pairs.pop("le", None)
                assert (le is not None) == (suffix == "_bucket"), line
                entry = series.setdefault((family, frozenset(pairs.items())), {"buckets": []})
                if le is not None:
                    entry["buckets"].append((_value(le), value))
                else:
                    assert suffix[1:] not in entry, f"a second {suffix}: {line!r}"
                    entry[suffix[1:]] = value
    out = {}
    for (family, labels), e in series.items():
        assert family in helps, f"histogram {family} has no # HELP"
        assert "sum" in e and "count" in e, f"{family}{dict(labels)} lacks _sum or _count"
        buckets = tuple(sorted(e["buckets"]))
        assert buckets and buckets[-1][0] == math.inf, f"{family}{dict(labels)} has no le=\"+Inf\" bucket"
        assert len({le for le, _ in buckets}) == len(buckets), f"{family}: a bound twice"
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), f"{family}{dict(labels)} buckets are not cumulative: {buckets}"
        assert counts[-1] == e["count"], f"{family}{dict(labels)}: +Inf {counts[-1]} != _count {e['count']}"
        out[(family, labels)] = Histogram(buckets, e["sum"], e["count"])
    return out


def histogram(text: str, family: str) -> Histogram:
    """The one series of `family` (the served model has one label set), or an empty one."""
    found = [h for (f, _), h in histograms(text).items() if f == family]
    assert len(found) <= 1, found
    return found[0] if found else Histogram((), 0.0, 0.0)


def expected_buckets(values, bounds) -> list[tuple[float, int]]:
    """Cumulative counts of `values` at each bound and +Inf:
    [0.2, 0.5], (0.0, 0.5, 1.0) -> [(0.0, 0), (0.5, 2), (1.0, 2), (inf, 2)]."""
    return [(float(b), sum(v <= b for v in values)) for b in bounds] + [(math.inf, len(values))]


def delta(after: Histogram, before: Histogram) -> list[tuple[float, float]]:
    """after's bucket counts less before's (a family first seen in `after` counts from 0)."""
    was = dict(before.buckets)
    return [(le, c - was.get(le, 0.0)) for le, c in after.buckets]


TEXT = """\
# HELP dynspec_request_acceptance Per finished request: accepted / drafted
# TYPE dynspec_request_acceptance histogram
dynspec_request_acceptance_count{model="dynspec",version="1"} 3
dynspec_request_acceptance_sum{model="dynspec",version="1"} 1.25
dynspec_request_acceptance_bucket{model="dynspec",version="1",le="0"} 0
dynspec_request_acceptance_bucket{model="dynspec",version="1",le="0.5"} 2
dynspec_request_acceptance_bucket{model="dynspec",version="1",le="1"} 3
dynspec_request_acceptance_bucket{model="dynspec",version="1",le="+Inf"} 3
# HELP dynspec_batch_size Batch size
# TYPE dynspec_batch_size gauge
dynspec_batch_size{model="dynspec",version="1"} 0
"""


def test_the_histogram_reader_reads_the_format_and_refuses_what_is_not():
    h = histogram(TEXT, "dynspec_request_acceptance")
    assert h == Histogram(((0.0, 0), (0.5, 2), (1.0, 3), (math.inf, 3)), 1.25, 3)
    assert histogram(TEXT, "dynspec_request_mean_k") == Histogram((), 0.0, 0.0)
    broken = {
        "not cumulative": TEXT.replace('le="1"} 3', 'le="1"} 1'),
        "no +Inf": TEXT.replace('dynspec_request_acceptance_bucket{model="dynspec",version="1",le="+Inf"} 3\n', ""),
        "+Inf != _count": TEXT.replace('_count{model="dynspec",version="1"} 3',
                                       '_count{model="dynspec",version="1"} 4'),
        "no HELP": TEXT.replace("# HELP dynspec_request_acceptance Per finished request: accepted / drafted\n", ""),
        "bad sample": TEXT.replace('version="1"} 1.25', 'version=1} 1.25'),
        "no _sum": TEXT.replace('dynspec_request_acceptance_sum{model="dynspec",version="1"} 1.25\n', ""),
    }
    for what, text in broken.items():
        with pytest.raises(AssertionError):
            histograms(text)
            pytest.fail(what)


# ---- the executor's numbers against its stats ----------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """tests/test_executor.py's random tiny pair."""
    return make_tiny_pair(tmp_path_factory.mktemp("pair"), vocab=96, hidden=64, layers=5, heads=4, kv_heads=2, seed=1,
                          draft_vocab=64, draft_seed=2)


def executor(pair, policy, acceptance=Greedy()) -> Executor:
    eng = load_reference_engine(*pair, dtype=torch.float64, max_batch_size=8, max_seq_len=96, max_draft_len=KMAX)
    return Executor(eng, policy, acceptance=acceptance, allow_lossy=not acceptance.lossless, stats_limit=None)


def prompts(n: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(int(t) for t in rng.integers(0, 96, size=int(rng.integers(3, 16)))) for _ in range(n)]


ACCEPTANCE = [Greedy(), Bernoulli(0.7, seed=3)]


@pytest.mark.parametrize("acceptance", ACCEPTANCE, ids=str)
def test_one_request_at_a_time_its_numbers_are_the_sums_over_its_iterations(pair, acceptance):
    ex = executor(pair, DraftSchedule.static(3, 8), acceptance)
    for prompt in prompts(4, seed=1):
        seen = len(ex.stats)
        h = ex.submit(prompt, 12)
        ex.run_until_idle()
        r, steps = h.result(), ex.stats[seen:]
        assert r.accepted_drafts == sum(st.accepted for st in steps)
        assert r.drafted == sum(st.drafted for st in steps)
        assert r.decode_steps == sum(st.batch_size for st in steps)
        assert r.decode_steps >= 1 and 0 <= r.accepted_drafts <= r.drafted
        assert 0.0 <= r.mean_k <= 3 and r.acceptance == r.accepted_drafts / r.drafted
        # each decode iteration emits its accepted drafts + 1; the first token comes with the prompt
        assert len(r.output_ids) <= 1 + r.decode_steps + r.accepted_drafts
    if not acceptance.lossless:
        assert sum(st.accepted for st in ex.stats) > 0          # the check above was not all zeros


@pytest.mark.parametrize("policy", [DraftSchedule.static(3, 8), DraftSchedule.threshold(KMAX, 2)],
                         ids=["static3", "threshold"])
@pytest.mark.parametrize("acceptance", ACCEPTANCE, ids=str)
def test_concurrent_requests_sum_to_the_iteration_stats(pair, policy, acceptance):
    ex = executor(pair, policy, acceptance)
    handles = [ex.submit(p, 10 + i % 5) for i, p in enumerate(prompts(10, seed=2))]
    ex.run_until_idle()
    results, stats = [h.result() for h in handles], ex.stats
    assert sum(r.accepted_drafts for r in results) == sum(st.accepted for st in stats)
    assert sum(r.drafted for r in results) == sum(st.drafted for st in stats)
    assert sum(r.decode_steps for r in results) == sum(st.batch_size for st in stats)
    assert all(0 <= r.accepted_drafts <= r.drafted and 0.0 <= r.mean_k <= KMAX for r in results)


@pytest.mark.parametrize("acceptance", ACCEPTANCE, ids=str)
def test_the_benchmark_records_carry_the_same_numbers(pair, acceptance):
    ex = executor(pair, DraftSchedule.threshold(KMAX, 2), acceptance)
    reqs = [BenchRequest(i, p, 8 + i % 4) for i, p in enumerate(prompts(8, seed=4))]
    rec = closed_loop(ex, reqs, 3)
    assert len(rec.requests) == len(reqs)
    assert sum(r.accepted_drafts for r in rec.requests) == sum(s.accepted for s in rec.steps)
    assert sum(r.drafted for r in rec.requests) == sum(s.drafted for s in rec.steps)
    assert sum(r.decode_steps for r in rec.requests) == sum(s.batch_size for s in rec.steps)
    table = request_table([rec, rec])
    assert table["fields"] == list(REQUEST_FIELDS) and len(table["replicas"]) == 2
    assert [row[:4] for row in table["replicas"][0]] == \
        [[r.output_len, r.accepted_drafts, r.drafted, r.decode_steps] for r in rec.requests]
    json.dumps(table)                                       # it goes into the sweep's NAME.json as it is


def test_request_rows_and_engines_that_do_not_report_them():
    r = RequestTiming(4, 32, 0.0, 0.1, 1.0, accepted_drafts=5, drafted=12, decode_steps=3, key=7)
    assert (r.mean_k, r.acceptance) == (4.0, 5 / 12)
    assert request_row(r) == [32, 5, 12, 3, 4.0, 0.4167, 7]
    never = RequestTiming(4, 1, 0.0, 0.1, 0.1, accepted_drafts=0, drafted=0, decode_steps=0)
    assert (never.mean_k, never.acceptance) == (0.0, None)
    trtllm = RequestTiming(4, 32, 0.0, 0.1, 1.0)             # TRT-LLM: no per-request counts
    assert request_row(trtllm) == [32, None, None, None, None, None, None]


# ---- what the served model returns and the front writes ------------------------------------------
def result(accepted, drafted, steps) -> RequestResult:
    return RequestResult(7, 4, (1, 2, 3), "length", 0.0, 0.1, 0.2, accepted, drafted, steps)


def test_the_model_outputs_of_a_finished_request():
    a = RequestAcceptance.of(result(5, 12, 3))
    out = a.outputs()
    assert tuple(out) == ACCEPTANCE_OUTPUTS
    assert {k: (v.dtype.name, v.shape, v.item()) for k, v in out.items()} == {
        "accepted_drafts": ("int32", (1,), 5), "drafted": ("int32", (1,), 12), "decode_steps": ("int32", (1,), 3),
        "mean_k": ("float32", (1,), 4.0)}
    assert a.acceptance == 5 / 12
    never = RequestAcceptance.of(result(0, 0, 2))
    assert (never.acceptance, never.mean_k) == (None, 0.0)
    assert ACCEPTANCE_BUCKETS == (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    assert mean_k_buckets(4) == (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0) and mean_k_buckets(0) == (0.0,)


def test_a_request_holds_its_whole_counts_when_it_ends(pair, monkeypatch):
    """The executor counts a step's drafts before it appends the step's tokens, so a reader woken
    by the end of a stream reads whole counts: at finish() they already equal the final ones."""
    from dynspec.runtime.serving import requests

    at_end, real = {}, requests.finish

    def finish(req, reason, now):
        at_end.setdefault(req.id, (req.accepted, req.drafted, req.decode_steps))
        real(req, reason, now)

    monkeypatch.setattr(requests, "finish", finish)
    eng = load_reference_engine(*pair, dtype=torch.float64, max_batch_size=4, max_seq_len=96, max_draft_len=3)
    ex = Executor(eng, DraftSchedule.static(3, 4), acceptance=Bernoulli(0.7), allow_lossy=True)
    handles = [ex.submit(p, 9) for p in prompts(4, seed=3)]
    ex.run_until_idle()
    for h in handles:
        r = h.result()
        assert at_end[h.id] == (r.accepted_drafts, r.drafted, r.decode_steps) and r.decode_steps > 0


def test_the_front_writes_the_counts_with_the_acceptance_rate_or_null():
    final = {"model_name": "dynspec", "output_ids": [9], "text_output": "!", "accepted_drafts": 5, "drafted": 12,
             "decode_steps": 3, "mean_k": 4.0}
    assert acceptance_fields(final) == {**final, "mean_k": 4.0, "acceptance": 5 / 12}
    # tritonserver may write a [1] output as a list; the model's FP32 mean_k is replaced by the exact ratio
    listed = {**final, "accepted_drafts": [1], "drafted": [3], "decode_steps": [3], "mean_k": [0.99999]}
    assert acceptance_fields(listed) | {} == {**final, "accepted_drafts": 1, "drafted": 3, "decode_steps": 3,
                                              "mean_k": 1.0, "acceptance": 1 / 3}
    never = acceptance_fields({**final, "accepted_drafts": 0, "drafted": 0, "decode_steps": 2, "mean_k": 0.0})
    assert never["acceptance"] is None and json.loads(json.dumps(never))["acceptance"] is None
    plain = {"output_ids": [9], "text_output": "!"}          # a stream's earlier events: as they are
    assert acceptance_fields(plain) is plain
    # a non-streaming reply: the events joined, the final event's counts
    events = [{"model_name": "dynspec", "output_ids": [5, 83], "text_output": "a"},
              {"model_name": "dynspec", "output_ids": 14, "text_output": "b"},
              {"model_name": "dynspec", "output_ids": [], "text_output": "", "accepted_drafts": 2, "drafted": 8,
               "decode_steps": 2, "mean_k": 4.0}]
    assert merge(events) == {"model_name": "dynspec", "output_ids": [5, 83, 14], "text_output": "ab",
                             "accepted_drafts": 2, "drafted": 8, "decode_steps": 2, "mean_k": 4.0, "acceptance": 0.25}
    # a streamed reply: only the final event gains fields
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    ev = Events(True)
    out = ev.push(raw) + ev.flush()
    docs = [json.loads(e[len(b"data: "):]) for e in out.split(b"\n\n") if e]
    assert [("acceptance" in d) for d in docs] == [False, False, True] and docs[2]["acceptance"] == 0.25
    assert docs[1]["output_ids"] == [14]
    assert list_output_ids(b"data: not json") == b"data: not json"
