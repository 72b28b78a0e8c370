"""TrtllmEngine against a recorded-API fake of `tensorrt_llm`.

TensorRT-LLM cannot run here (no GPU, and the wheel comes only from NVIDIA's package index), so
these tests put a fake `tensorrt_llm` module in sys.modules. Its `LLM` accepts exactly the
constructor arguments recorded from TRT-LLM 1.2.1's TorchLlmArgs (tests/fixtures/
trtllm_1_2_1_llm_args.json) and rejects anything else, down to the nested speculative,
KV-cache and CUDA-graph configs; `generate_async(..., streaming=True)` yields RequestOutput-like
objects with cumulative `outputs[0].token_ids`; `get_stats()` returns C++ IterationStats JSON
(camelCase names from cpp/tensorrt_llm/executor/jsonSerialization.cpp), with K looked up in
the rendered draft_len_schedule the way 1.2.1's drafter does (bisect_right on active requests).
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
            accepted = set(FIXTURE["models"][model_name]) | set(FIXTURE["aliases"].get(model_name, {}))
            unknown += [f"{key}.{k}" for k in (args.get(key.split(".", 1)[1]) or {}) if k not in accepted]
        if unknown:
            raise ValueError(f"Extra inputs are not permitted: {unknown}")   # pydantic extra='forbid'
        self.args = args
        sc = args["speculative_config"]
        self.schedule = {int(k): v for k, v in sc["draft_len_schedule"].items()}
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
                    llm._stats.append(json.dumps({
                        "iter": len(llm._stats), "iterLatencyMS": 12.5, "numActiveRequests": llm.active,
                        "inflightBatchingStats": {"numScheduledRequests": llm.active, "numContextRequests": 0,
                                                  "numGenRequests": 1},
                        "specDecodingStats": {"numDraftTokens": k, "numAcceptedTokens": accepted if k else 0,
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
    monkeypatch.setitem(sys.modules, "tensorrt_llm", mod)
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
    assert args["model"] == cfg.target_dir and args["speculative_config"]["speculative_model"] == cfg.draft_dir
    assert args["backend"] == "pytorch" and args["tensor_parallel_size"] == 8
    assert args["speculative_config"]["eagle3_one_model"] is False and args["enable_iter_perf_stats"] is True
    eng.close()
    assert FakeLLM.instances[-1].closed


def test_the_fake_rejects_unknown_arguments(fake_trtllm, engine_dir):
    from dynspec.runtime.engines.trtllm import TrtllmEngine

    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        TrtllmEngine.open(engine_dir, gpu_memory_utilization=0.9)


def test_generate_streams_and_records_iterations(fake_trtllm, engine_dir):
    from dynspec.runtime.engines.trtllm import TrtllmEngine
    from dynspec.runtime.executor import IterationStats

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


def test_iteration_record_conversion():
    from dynspec.runtime.engines.trtllm import iteration_record

    r = iteration_record({"iter": 7, "iterLatencyMS": 21.5, "numActiveRequests": 3,
                          "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 3},
                          "specDecodingStats": {"numDraftTokens": 12, "numAcceptedTokens": 7,
                                                "numRequestsWithDraftTokens": 3, "acceptanceLength": 3.33}})
    assert (r.iteration, r.batch_size, r.k, r.drafted, r.accepted, r.emitted) == (7, 3, 4, 12, 7, 10)
    assert r.seconds == pytest.approx(0.0215)
    plain = iteration_record(json.dumps({"iter": 8, "iterLatencyMS": 9.0, "numActiveRequests": 40,
                                         "inflightBatchingStats": {"numGenRequests": 40}}))
    assert (plain.batch_size, plain.k, plain.drafted, plain.accepted, plain.emitted) == (40, 0, 0, 0, 40)
    for name in ("numDraftTokens", "numAcceptedTokens", "numRequestsWithDraftTokens"):
        assert name in FIXTURE["iteration_stats_json"]["SpecDecodingStats"]
