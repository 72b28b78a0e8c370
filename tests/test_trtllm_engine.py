"""TrtllmEngine against a recorded-API fake of `tensorrt_llm`.

TensorRT-LLM cannot run here (no GPU, and the wheel comes only from NVIDIA's package index), so
these tests put a fake `tensorrt_llm` module in sys.modules. Its `LLM` accepts exactly the
constructor arguments recorded from TRT-LLM 1.2.1's TorchLlmArgs (tests/fixtures/
trtllm_1_2_1_llm_args.json) and rejects anything else, down to the nested speculative,
KV-cache and CUDA-graph configs (the speculative config arrives as a `tensorrt_llm.llmapi`
Eagle3DecodingConfig, whose fake checks its fields the same way); `generate_async(...,
streaming=True)` yields RequestOutput-like objects with cumulative `outputs[0].token_ids`;
`get_stats()` returns C++ IterationStats JSON (camelCase names from
cpp/tensorrt_llm/executor/jsonSerialization.cpp), with K looked up in the rendered
draft_len_schedule the way 1.2.1's drafter does (bisect_right on active requests), K =
max_draft_len without a schedule and K = 0 without a speculative config. Like 1.2.1 it counts
numDraftTokens after the CUDA-graph padding: max_draft_len per drafting request whatever K was.

The same fake runs benchmarks/trtllm_driver.py end to end: the sweep's one TRT-LLM path is
TrtllmEngine, and both read iteration stats with the engine's one parser.
"""
import asyncio
import bisect
import json
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_checkpoints import make_eagle3, make_llama  # noqa: E402

from dynspec.cli import main  # noqa: E402
from dynspec.errors import DynspecError  # noqa: E402

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "trtllm_1_2_1_llm_args.json").read_text())
VOCAB = 96


@dataclass
class FakeSamplingParams:
    """The SamplingParams fields the engine may set (a dataclass: unknown kwargs raise TypeError)."""
    end_id: Optional[int] = None
    max_tokens: int = 32
    stop_token_ids: Optional[List[int]] = None
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    detokenize: bool = True
    ignore_eos: bool = False


class FakeDecodingConfig:
    """Eagle3DecodingConfig: keyword fields (or aliases) of the recorded model only (pydantic extra='forbid')."""
    model = "Eagle3DecodingConfig"

    def __init__(self, **kwargs):
        accepted = set(FIXTURE["models"][self.model]) | set(FIXTURE["aliases"].get(self.model, {}))
        unknown = sorted(k for k in kwargs if k not in accepted)
        for alias, name in FIXTURE["aliases"].get(self.model, {}).items():
            if alias in kwargs and name in kwargs:          # the field was filled by name: the alias is extra
                unknown.append(alias)
        if unknown:
            raise ValueError(f"Extra inputs are not permitted: {unknown}")
        self.fields = dict(kwargs)


class FakeEagleConfig(FakeDecodingConfig):
    model = "Eagle3DecodingConfig"      # (EAGLE-1/2 is not recorded; the engine must not pick it here)

    def __init__(self, **kwargs):
        raise AssertionError("EagleDecodingConfig chosen for an Eagle3 speculative_config")


@dataclass
class _Completion:
    token_ids: list = field(default_factory=list)


@dataclass
class _RequestOutput:
    outputs: list
    finished: bool = False


class FakeLLM:
    instances: list = []

    def __init__(self, model, **kwargs):
        args = {"model": model, **kwargs}
        unknown = [k for k in args if k not in FIXTURE["models"]["TorchLlmArgs"]]
        for key, model_name in FIXTURE["nested"].items():
            if key == "TorchLlmArgs.speculative_config":
                continue                                   # checked by FakeDecodingConfig
            accepted = set(FIXTURE["models"][model_name]) | set(FIXTURE["aliases"].get(model_name, {}))
            unknown += [f"{key}.{k}" for k in (args.get(key.split(".", 1)[1]) or {}) if k not in accepted]
        if unknown:
            raise ValueError(f"Extra inputs are not permitted: {unknown}")   # pydantic extra='forbid'
        sc = args.get("speculative_config")
        assert sc is None or isinstance(sc, FakeDecodingConfig), type(sc)
        self.args = args
        self.spec = sc.fields if sc is not None else None
        if self.spec is None:
            self.schedule = {1: 0}
        elif self.spec.get("draft_len_schedule") is None:
            self.schedule = {1: self.spec["max_draft_len"]}
        else:
            self.schedule = {int(k): v for k, v in self.spec["draft_len_schedule"].items()}
        self.max_draft_len = self.spec["max_draft_len"] if self.spec is not None else 0
        self.active = 0
        self._stats: list = []
        FakeLLM.instances.append(self)

    def _k(self) -> int:
        keys = sorted(self.schedule)
        i = bisect.bisect_right(keys, self.active)
        return self.schedule[keys[i - 1]] if i else 0

    def generate_async(self, inputs, sampling_params=None, lora_request=None, prompt_adapter_request=None,
                       streaming=False, kv_cache_retention_config=None, disaggregated_params=None,
                       _postproc_params=None, scheduling_params=None, cache_salt=None):
        assert isinstance(inputs, list) and all(isinstance(t, int) for t in inputs)
        assert streaming is True and sampling_params.detokenize is False
        llm = self

        async def run():
            llm.active += 1
            out = _RequestOutput([_Completion()])
            last = inputs[-1]
            try:
                while len(out.outputs[0].token_ids) < sampling_params.max_tokens:
                    await asyncio.sleep(0)                     # let the other requests join the batch
                    k = llm._k()
                    accepted = min(k, 1)                       # drafted k, one accepted
                    new = [(last + i + 1) % VOCAB for i in range(accepted + 1)]
                    room = sampling_params.max_tokens - len(out.outputs[0].token_ids)
                    new = new[:room]
                    stop = set(sampling_params.stop_token_ids or ())
                    if stop & set(new):
                        new = new[:next(i for i, t in enumerate(new) if t in stop) + 1]
                        out.finished = True
                    out.outputs[0].token_ids = out.outputs[0].token_ids + new
                    last = new[-1]
                    first = len(out.outputs[0].token_ids) == len(new)   # this request's context step
                    llm._stats.append(json.dumps({
                        "iter": len(llm._stats), "iterLatencyMS": 12.5, "numActiveRequests": llm.active,
                        "inflightBatchingStats": {"numScheduledRequests": llm.active,
                                                  "numContextRequests": int(first), "numGenRequests": 1 - first,
                                                  "numPausedRequests": 0,
                                                  "numCtxTokens": len(inputs) if first else 0},
                        "specDecodingStats": {"numDraftTokens": llm.max_draft_len if k else 0,   # padded
                                              "numAcceptedTokens": accepted if k else 0,
                                              "numRequestsWithDraftTokens": 1 if k else 0,
                                              "acceptanceLength": 1.0 + accepted, "iterLatencyMS": 0.0,
                                              "draftOverhead": 0.0},
                    }))
                    yield out
                    if out.finished:
                        break
            finally:
                llm.active -= 1

        return run()

    def get_stats(self, timeout=2):
        out, self._stats = self._stats, []
        return out

    def shutdown(self):
        self.closed = True


@pytest.fixture
def fake_trtllm(monkeypatch):
    mod = types.ModuleType("tensorrt_llm")
    mod.LLM, mod.SamplingParams = FakeLLM, FakeSamplingParams
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.Eagle3DecodingConfig, llmapi.EagleDecodingConfig = FakeDecodingConfig, FakeEagleConfig
    mod.llmapi = llmapi
    monkeypatch.setitem(sys.modules, "tensorrt_llm", mod)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    FakeLLM.instances = []
    return mod


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("trtllm")
    make_llama(root / "hf", vocab=VOCAB)
    make_eagle3(root / "eagle", vocab=VOCAB)
    assert main(["convert", "target", "--hf", str(root / "hf"), "--out", str(root / "target")]) == 0
    assert main(["convert", "eagle3", "--draft", str(root / "eagle"), "--target", str(root / "target"),
                 "--out", str(root / "draft")]) == 0
    assert main(["build", "--target", str(root / "target"), "--draft", str(root / "draft"),
                 "--out", str(root / "engine"), "--schedule", "1:4,2:2", "--max-batch-size", "8"]) == 0
    return root / "engine"


def test_module_import_does_not_import_tensorrt_llm():
    code = ("import sys, dynspec.runtime.engines.trtllm, dynspec.build.engine_dir, dynspec.cli; "
            "dynspec.cli.make_parser(); assert 'tensorrt_llm' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_open_without_tensorrt_llm_is_a_clear_error(engine_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)         # import fails like a missing wheel
    from dynspec.runtime.engines.trtllm import TrtllmEngine

    with pytest.raises(DynspecError, match="needs TensorRT-LLM"):
        TrtllmEngine.open(engine_dir)


def test_open_passes_the_engine_dir_options(fake_trtllm, engine_dir):
    from dynspec.config import EngineConfig
    from dynspec.runtime.engines.trtllm import TrtllmEngine

    eng = TrtllmEngine.open(engine_dir)
    args = FakeLLM.instances[-1].args
    cfg = EngineConfig.load(engine_dir)
    spec = FakeLLM.instances[-1].spec
    assert args["model"] == cfg.target_dir and spec["speculative_model_dir"] == cfg.draft_dir
    assert "speculative_model" not in spec
    assert args["backend"] == "pytorch" and args["tensor_parallel_size"] == 8
    assert spec["eagle3_one_model"] is False and args["enable_iter_perf_stats"] is True
    assert "decoding_type" not in spec and spec["draft_len_schedule"] == {1: 4, 2: 2, 3: 0}
    eng.close()
    assert FakeLLM.instances[-1].closed


def test_open_refuses_per_request_k_before_starting_an_llm(fake_trtllm, engine_dir):
    """TRT-LLM decides one K per iteration (docs/design.md, "Per-request draft length on TensorRT-LLM")."""
    from dynspec.runtime.engines.trtllm import TrtllmEngine

    before = len(FakeLLM.instances)
    with pytest.raises(DynspecError, match="per-request draft length is a reference-engine feature: TRT-LLM 1.2.1"):
        TrtllmEngine.open(engine_dir, granularity="request")
    assert len(FakeLLM.instances) == before
    TrtllmEngine.open(engine_dir, granularity="batch").close()
    assert len(FakeLLM.instances) == before + 1
    from dataclasses import replace

    from dynspec.config import EngineConfig
    from dynspec.runtime.engines.trtllm import load_options

    cfg, options = load_options(engine_dir)
    with pytest.raises(DynspecError, match="per-request draft length is a reference-engine feature"):
        TrtllmEngine.start(options, replace(cfg, policy="per-request"))     # engine.json's policy says so
    assert len(FakeLLM.instances) == before + 1 and isinstance(cfg, EngineConfig)


def test_load_options_keeps_the_draft_key_the_yaml_uses(engine_dir, tmp_path):
    """An options file edited to the post-PR-10099 name keeps that one key; both keys never appear."""
    import shutil

    import yaml

    from dynspec.config import EngineConfig
    from dynspec.runtime.engines.trtllm import load_options, with_draft_path

    moved = tmp_path / "engine"
    shutil.copytree(engine_dir, moved)
    cfg = EngineConfig.load(moved)
    path = moved / cfg.llm_api_options
    doc = yaml.safe_load(path.read_text())
    sc = doc["speculative_config"]
    sc["speculative_model"] = sc.pop("speculative_model_dir")
    path.write_text(yaml.safe_dump(doc))
    spec = load_options(moved)[1]["speculative_config"]
    assert spec["speculative_model"] == cfg.draft_dir and "speculative_model_dir" not in spec
    assert with_draft_path({"max_draft_len": 4}, "/d") == {"max_draft_len": 4, "speculative_model_dir": "/d"}
    assert with_draft_path({"speculative_model": "a", "speculative_model_dir": "b"}, "/d") == {
        "speculative_model_dir": "/d"}


def test_the_fake_rejects_both_draft_keys(fake_trtllm):
    with pytest.raises(ValueError, match="speculative_model_dir"):
        FakeDecodingConfig(max_draft_len=4, speculative_model="/d", speculative_model_dir="/d")
    assert FakeDecodingConfig(max_draft_len=4, speculative_model_dir="/d").fields["speculative_model_dir"] == "/d"


def test_the_fake_rejects_unknown_arguments(fake_trtllm, engine_dir):
    from dynspec.runtime.engines.trtllm import TrtllmEngine

    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        TrtllmEngine.open(engine_dir, gpu_memory_utilization=0.9)


def test_generate_streams_and_records_iterations(fake_trtllm, engine_dir):
    from dynspec.runtime.engines.trtllm import TrtllmEngine
    from dynspec.runtime.serving.executor import IterationStats

    with TrtllmEngine.open(engine_dir) as eng:
        outs = eng.generate([[5, 6, 7], [40]], max_new_tokens=6)
        assert outs == [[8, 9, 10, 11, 12, 13], [41, 42, 43, 44, 45, 46]]
        stops = eng.generate([[5]], max_new_tokens=10, stop_ids=[8])
        assert stops == [[6, 7, 8]]

        async def chunks():
            return [c async for c in eng.stream([1], max_new_tokens=3)]

        assert sum(asyncio.run(chunks()), []) == [2, 3, 4]
        records = eng.iteration_stats()
    assert records and all(isinstance(r, IterationStats) for r in records)
    sched = {1: 4, 2: 2, 3: 0}                       # "1:4,2:2" rendered for 1.2.1
    for r in records:
        keys = sorted(sched)
        assert r.k == sched[keys[bisect.bisect_right(keys, r.batch_size) - 1]]
        assert r.drafted == r.k and r.accepted == min(r.k, 1) and r.seconds == pytest.approx(0.0125)
    assert {r.batch_size for r in records} == {1, 2}      # two prompts in flight, then one
    assert sum(r.prefill_tokens for r in records) == 3 + 1 + 1 + 1      # every prompt, once
    assert sum(r.decode_rows for r in records) == len(records) - 4      # the other steps decode


SCHED_121 = {1: 4, 3: 2, 9: 0}          # "2:4,8:2" rendered for 1.2.1, max_draft_len 4


def lengths_121(sched=SCHED_121, kmax=4):
    from dynspec.runtime.engines.trtllm import draft_lengths

    return draft_lengths({"speculative_config": {"max_draft_len": kmax, "draft_len_schedule": sched}}, "1.2.1")


def spec_stats_121(draft_lens, accepted, kmax=4):
    """specDecodingStats as 1.2's PyExecutor._update_iter_stats counts them, written out here: per
    generation request, the length of its draft list after pad_draft_tokens_for_cuda_graph has
    extended it with zeros to the static max_draft_len; requests with no drafts are skipped."""
    padded = [kmax if d > 0 else 0 for d in draft_lens]
    n = sum(1 for d in padded if d > 0)
    return {"numDraftTokens": sum(padded), "numAcceptedTokens": sum(accepted), "numRequestsWithDraftTokens": n,
            "acceptanceLength": (sum(accepted) + n) / n if n else 0.0}


def test_iteration_record_conversion():
    from dynspec.runtime.engines.trtllm import DraftLengths, iteration_record

    r = iteration_record({"iter": 7, "iterLatencyMS": 21.5, "numActiveRequests": 3,
                          "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 3},
                          "specDecodingStats": {"numDraftTokens": 12, "numAcceptedTokens": 4,
                                                "numRequestsWithDraftTokens": 3, "acceptanceLength": 2.33}},
                         lengths_121())
    assert (r.iteration, r.batch_size, r.k, r.drafted, r.accepted, r.emitted) == (7, 3, 2, 6, 4, 7)
    assert r.seconds == pytest.approx(0.0215)
    assert (r.decode_rows, r.prefill_tokens) == (3, None)       # numCtxTokens absent: unknown, not 0
    plain = iteration_record(json.dumps({"iter": 8, "iterLatencyMS": 9.0, "numActiveRequests": 40,
                                         "inflightBatchingStats": {"numGenRequests": 40}}), DraftLengths())
    assert (plain.batch_size, plain.k, plain.drafted, plain.accepted, plain.emitted) == (40, 0, 0, 0, 40)
    assert (plain.decode_rows, plain.prefill_tokens) == (40, None)
    mixed = iteration_record({"iter": 9, "numActiveRequests": 5,
                              "inflightBatchingStats": {"numContextRequests": 2, "numGenRequests": 3,
                                                        "numCtxTokens": 700}}, lengths_121())
    assert (mixed.batch_size, mixed.decode_rows, mixed.prefill_tokens) == (5, 3, 700)
    bare = iteration_record({"iter": 10, "numActiveRequests": 2}, DraftLengths())
    assert (bare.decode_rows, bare.prefill_tokens) == (None, None)
    with pytest.raises(DynspecError, match="numCtxTokens=-3"):
        iteration_record({"numActiveRequests": 2, "inflightBatchingStats": {"numCtxTokens": -3}}, DraftLengths())
    for name in ("numGenRequests", "numCtxTokens"):
        assert name in FIXTURE["iteration_stats_json"]["InflightBatchingStats"]
    for name in ("numDraftTokens", "numAcceptedTokens", "numRequestsWithDraftTokens"):
        assert name in FIXTURE["iteration_stats_json"]["SpecDecodingStats"]
    for name in ("iter", "iterLatencyMS", "numActiveRequests", "inflightBatchingStats", "specDecodingStats"):
        assert name in FIXTURE["iteration_stats_json"]["IterationStats"]


def _entry(batch, spec, it=3):
    return {"iter": it, "iterLatencyMS": 20.0, "numActiveRequests": batch,
            "inflightBatchingStats": {"numScheduledRequests": batch, "numGenRequests": batch},
            "specDecodingStats": spec}


NO_ACTIVE_COUNT = {"iter": 4, "iterLatencyMS": 20.0,
                   "inflightBatchingStats": {"numScheduledRequests": 2, "numGenRequests": 2},
                   "specDecodingStats": {"numDraftTokens": 8, "numAcceptedTokens": 3, "numRequestsWithDraftTokens": 2}}


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8])
def test_k_is_the_scheduled_k_not_the_padded_ratio(batch):
    """1.2 pads every drafting request to max_draft_len=4, so the ratio reads 4 at any K>0; the
    parser returns the schedule's K at numActiveRequests and drafted = K per drafting request."""
    from dynspec.runtime.engines.trtllm import iteration_record

    k = trtllm_121_k(batch)
    assert k > 0
    accepted = [min(k, 1)] * batch
    r = iteration_record(_entry(batch, spec_stats_121([k] * batch, accepted)), lengths_121())
    assert (r.k, r.drafted, r.accepted) == (k, k * batch, batch)
    assert iteration_record(json.dumps(_entry(batch, spec_stats_121([k] * batch, accepted))), lengths_121()).k == k


def trtllm_121_k(batch, sched=SCHED_121):
    keys = sorted(sched)
    return sched[keys[bisect.bisect_right(keys, batch) - 1]]


def test_unpadded_counts_and_k0_edges():
    from dynspec.runtime.engines.trtllm import iteration_record

    unpadded = {"numDraftTokens": 6, "numAcceptedTokens": 2, "numRequestsWithDraftTokens": 3}
    assert iteration_record(_entry(3, unpadded), lengths_121()).drafted == 6       # a build that stops padding
    # overlap edge, K>0 -> K=0: the requests that drafted dropped out of the record
    dropped = iteration_record(_entry(3, spec_stats_121([0, 0, 0], [0, 0, 0])), lengths_121())
    assert (dropped.k, dropped.drafted, dropped.accepted) == (2, 0, 0)
    # the same edge the other way round: K=0 at b=9, drafting requests reported, nothing accepted
    rising = iteration_record(_entry(9, spec_stats_121([2] * 9, [0] * 9)), lengths_121())
    assert (rising.k, rising.drafted, rising.accepted) == (0, 0, 0)
    with pytest.raises(DynspecError, match="numAcceptedTokens=3 at numActiveRequests=9"):
        iteration_record(_entry(9, spec_stats_121([2] * 9, [1, 1, 1] + [0] * 6)), lengths_121())


def test_missing_active_count_is_refused_not_guessed():
    from dynspec.runtime.engines.trtllm import iteration_record, iteration_records

    ok = _entry(3, spec_stats_121([2] * 3, [1] * 3))
    with pytest.raises(DynspecError, match="entry 0 has no numActiveRequests"):
        iteration_record(NO_ACTIVE_COUNT, lengths_121())
    with pytest.raises(DynspecError, match="entry 1 has no numActiveRequests"):
        iteration_records([ok, NO_ACTIVE_COUNT], lengths_121())


@pytest.mark.parametrize("entry,needle", [
    ("{not json", "not JSON"),
    ([1, 2], "not an object"),
    ({"numActiveRequests": -1}, "numActiveRequests=-1"),
    ({"numActiveRequests": "3"}, "numActiveRequests='3'"),
    ({"numActiveRequests": 2, "specDecodingStats": {"numDraftTokens": 4}}, "inconsistent"),
    ({"numActiveRequests": 2, "specDecodingStats": {"numDraftTokens": 4, "numRequestsWithDraftTokens": 3}},
     "inconsistent"),
    ({"numActiveRequests": 2, "specDecodingStats": {"numDraftTokens": 2.5, "numRequestsWithDraftTokens": 1}},
     "numDraftTokens=2.5"),
    ({"numActiveRequests": 2, "specDecodingStats": {"numDraftTokens": 7, "numRequestsWithDraftTokens": 2}},
     "numDraftTokens=7.*K=4 \\(max_draft_len 4\\)"),
    ({"numActiveRequests": 3, "specDecodingStats": {"numDraftTokens": 12, "numAcceptedTokens": 13,
                                                    "numRequestsWithDraftTokens": 3}}, "numAcceptedTokens=13"),
])
def test_malformed_entries_name_the_value(entry, needle):
    from dynspec.runtime.engines.trtllm import iteration_record

    with pytest.raises(DynspecError, match=needle):
        iteration_record(entry, lengths_121())


def test_draft_lengths_from_options():
    from dynspec.runtime.engines.trtllm import DraftLengths, draft_lengths

    assert draft_lengths({}, "1.2.1") == DraftLengths()
    static = draft_lengths({"speculative_config": {"max_draft_len": 3}}, "1.2.1")
    assert (static.k(1), static.k(500), static.max_draft_len) == (3, 3, 3)
    dyn = lengths_121()
    assert [dyn.k(b) for b in (1, 2, 3, 8, 9, 64)] == [trtllm_121_k(b) for b in (1, 2, 3, 8, 9, 64)]
    upper = draft_lengths({"speculative_config": {"max_draft_len": 4, "draft_len_schedule": {2: 4, 8: 2}}},
                          "1.3.0rc5")
    assert [upper.k(b) for b in (2, 3, 8, 9)] == [4, 2, 2, 0]
    with pytest.raises(DynspecError, match="max_draft_len is None"):
        draft_lengths({"speculative_config": {}}, "1.2.1")


def test_engine_and_driver_read_stats_the_same_way():
    from dynspec.benchmarks.metrics import StepRecord
    from dynspec.benchmarks.trtllm_driver import steps_from_stats
    from dynspec.runtime.engines.trtllm import iteration_records

    idle = {"iter": 5, "iterLatencyMS": 1.0, "numActiveRequests": 0}
    ok = _entry(3, spec_stats_121([2] * 3, [1] * 3))
    stats = [ok, json.dumps(ok), idle, {"numActiveRequests": 9}]
    records = iteration_records(stats, lengths_121())
    assert [(r.iteration, r.batch_size, r.k, r.drafted) for r in records] == [(3, 3, 2, 6), (3, 3, 2, 6),
                                                                               (3, 9, 0, 0)]   # idle: none
    assert steps_from_stats(stats, lengths_121()) == tuple(StepRecord.of(r) for r in records)
    with pytest.raises(DynspecError, match="numActiveRequests"):
        steps_from_stats([NO_ACTIVE_COUNT], lengths_121())


def test_draft_sync_labels_are_honest():
    from dynspec.benchmarks.trtllm_driver import draft_sync_label

    for version in ("1.2.1", "1.3.0rc2", "1.4.0"):
        assert draft_sync_label("baseline", version) == "off"
        assert draft_sync_label("dynamic", version) == "off"        # stale-draft trap: build/trap.py
        assert draft_sync_label("static", version) == "off"


def test_sweep_driver_runs_on_trtllm_engine(fake_trtllm, engine_dir, tmp_path, monkeypatch):
    """`sweep --engine trtllm` end to end against the fake: one TrtllmEngine per mode, honest
    keep_warm, and K per batch size as the rendered schedule gives it."""
    from dynspec.benchmarks import sweep
    from dynspec.runtime.engines import trtllm

    started = []
    real_start = trtllm.TrtllmEngine.start.__func__
    monkeypatch.setattr(trtllm.TrtllmEngine, "start",
                        classmethod(lambda cls, o, c: started.append(o) or real_start(cls, o, c)))
    out = tmp_path / "run"
    rc = sweep.main(["--engine", "trtllm", "--engine-dir", str(engine_dir), "--concurrency", "1,2",
                     "--num-requests", "2", "--input-len", "4", "--output-len", "6", "--trials", "1",
                     "--warmup-requests", "0", "--static-k", "3", "--out", str(out), "--no-progress"])
    assert rc == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    assert [FakeLLM.instances[i].spec is None for i in range(3)] == [True, False, False]
    assert len(started) == 3 and all(o["enable_iter_perf_stats"] for o in started)
    assert doc["env"]["draft_sync"] == {"baseline": "off", "static": "off", "dynamic": "off"}   # the K=0 trap
    rows = {(r["mode"], r["concurrency"]): r for r in doc["rows"]}
    assert all(r["draft_sync"] == doc["env"]["draft_sync"][r["mode"]] for r in rows.values())
    assert all(r["output_tokens"] == 2 * 6 for r in rows.values())
    assert rows[("baseline", 1)]["mean_k"] == 0 and rows[("static", 2)]["mean_k"] == 3
    sched = {1: 4, 2: 2, 3: 0}                                    # "1:4,2:2" rendered for 1.2.1
    for c in (1, 2):
        ks = {(b, k) for b, k, _ in rows[("dynamic", c)]["k_by_batch"]}
        assert ks and all(k == sched[min(b, 3)] for b, k in ks), ks


def test_trtllm_sweep_runs_every_trial_in_rotated_order(fake_trtllm, engine_dir, tmp_path):
    """--trials 2: each mode starts twice, trial 2 begins with the second mode; a row is the
    median trial with both trials' tok/s around it, as the reference sweep writes rows."""
    from dynspec.benchmarks import sweep

    out = tmp_path / "run"
    rc = sweep.main(["--engine", "trtllm", "--engine-dir", str(engine_dir), "--concurrency", "2",
                     "--num-requests", "2", "--input-len", "4", "--output-len", "6", "--trials", "2",
                     "--warmup-requests", "0", "--static-k", "3", "--out", str(out), "--no-progress"])
    assert rc == 0
    order = ["baseline" if i.spec is None else "static" if i.spec.get("draft_len_schedule") is None else "dynamic"
             for i in FakeLLM.instances]
    assert order == ["baseline", "static", "dynamic", "static", "dynamic", "baseline"]
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["mode"] for r in rows] == ["baseline", "static", "dynamic"]
    for r in rows:
        assert r["trials"] == 2 and len(r["trial_tok_per_s"]) == 2 and len(r["trial_p99_ttft_s"]) == 2
        assert r["tok_per_s_min"] == min(r["trial_tok_per_s"]) and r["tok_per_s_max"] == max(r["trial_tok_per_s"])
        assert r["output_tok_per_s"] == min(r["trial_tok_per_s"])          # lower middle of two
        assert r["prefill_tokens"] == 2 * 4 and r["output_tokens"] == 2 * 6
