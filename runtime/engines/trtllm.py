"""The TensorRT-LLM engine: an ENGINE_DIR opened with `tensorrt_llm.LLM(**options)`.

TRT-LLM runs its own continuous batching and applies `draft_len_schedule` itself, so this
engine sits at the client side of the executor: submit prompts, stream tokens, read back the
per-iteration record {b, K, drafted, accepted} that the reference engine's executor keeps.

`import tensorrt_llm` happens in `TrtllmEngine.start` only; nothing else here needs it.

One `LLM.get_stats()` entry (C++ IterationStats as JSON; 1.2-era builds may hand back the JSON
string instead of the dict) -> one IterationStats, by `iteration_record`, the one parser of
these entries in dynspec (the engine and benchmarks/trtllm_driver.py both use it):
    {"iter": 7, "iterLatencyMS": 21.5, "numActiveRequests": 3,
     "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 3, ...},
     "specDecodingStats": {"numDraftTokens": 11, "numAcceptedTokens": 7,
                           "numRequestsWithDraftTokens": 3, "acceptanceLength": 3.33, ...}}
    -> IterationStats(iteration=7, batch_size=3, k=4, drafted=11, accepted=7, emitted=10,
                      seconds=0.0215, host_seconds=0.0, decode_rows=3, prefill_tokens=None)
Rules (field names from cpp/tensorrt_llm/executor/jsonSerialization.cpp; meanings from
PyExecutor's iteration-stats code in tensorrt_llm/_torch/pyexecutor/py_executor.py):
- batch_size = numActiveRequests, the count PyExecutor looks draft_len_schedule up with
  (len(active_requests)). TRT-LLM always writes it; an entry without it is refused, not guessed.
  numActiveRequests == 0 is an idle iteration: no record.
- K = ceil(numDraftTokens / numRequestsWithDraftTokens), 0 when no request drafted. PyExecutor
  sums each generation request's draft length over the requests that drafted; within one
  iteration the schedule gives them all the same K, and a request can draft fewer (it is near
  its max_tokens, or its zero token ids are not counted), never more. So the mean is <= K and
  its ceiling is K while the shortfall stays under one token per request: 11 over 3 -> 4.
- decode_rows = inflightBatchingStats.numGenRequests (the generation requests PyExecutor
  scheduled); prefill_tokens = inflightBatchingStats.numCtxTokens (the model engine's context
  tokens of the iteration, prompt chunks included). A field the entry lacks is None, not 0:
  the example above has no numCtxTokens, so its prefill is unknown, not zero.
"""
from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

from dynspec.build.llm_api import DRAFT_KEY, DRAFT_KEYS, read_options
from dynspec.config import EngineConfig
from dynspec.errors import DynspecError
from dynspec.runtime.executor import IterationStats


def load_options(engine_dir: str | Path) -> tuple[EngineConfig, dict]:
    """engine.json + the LLM-API options, with model paths re-pointed at the checkpoints that
    engine.json names (relative to ENGINE_DIR), so a moved engine dir + checkpoints still open."""
    engine_dir = Path(engine_dir)
    cfg = EngineConfig.load(engine_dir)
    path = engine_dir / cfg.llm_api_options
    if not path.is_file():
        raise DynspecError(f"{path} does not exist; rebuild the engine dir with `dynspec build`")
    options = read_options(path)
    if not isinstance(options.get("speculative_config"), dict):
        raise DynspecError(f"{path}: expected a mapping with a 'speculative_config' mapping")
    options["model"] = cfg.target_dir
    options["speculative_config"] = with_draft_path(options["speculative_config"], cfg.draft_dir)
    return cfg, options


def with_draft_path(spec: Mapping, draft_dir: str) -> dict:
    """spec with the draft path under the one draft key it already uses (speculative_model_dir
    when it names none), the other key dropped: TRT-LLM refuses a config that holds both. Pure.
        {"speculative_model": "../d"} -> {"speculative_model": draft_dir}
        {"max_draft_len": 4}          -> {"max_draft_len": 4, "speculative_model_dir": draft_dir}"""
    key = next((k for k in DRAFT_KEYS if k in spec), DRAFT_KEY)
    out = {k: v for k, v in spec.items() if k not in DRAFT_KEYS}
    out[key] = draft_dir
    return out


def _count(entry: Mapping, section: Mapping, name: str, where: str) -> int:
    value = section.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DynspecError(f"TRT-LLM iteration stats {where}: {name}={value!r} is not a count >= 0 in {dict(entry)!r}")
    return value


def _reported_count(entry: Mapping, section: Mapping, name: str, where: str) -> int | None:
    """A count TRT-LLM may leave out: None when absent (or null), else as _count."""
    return None if section.get(name) is None else _count(entry, section, name, where)


def iteration_record(stat: Mapping[str, Any] | str, position: int = 0) -> IterationStats | None:
    """One TRT-LLM iteration-stats entry -> the executor's IterationStats, or None for an idle
    iteration. Pure. `position` numbers an entry that has no "iter"."""
    if isinstance(stat, str):
        try:
            stat = json.loads(stat)
        except ValueError as e:
            raise DynspecError(f"TRT-LLM iteration stats entry {position} is not JSON: {e}") from None
    if not isinstance(stat, Mapping):
        raise DynspecError(f"TRT-LLM iteration stats entry {position} is {type(stat).__name__}, not an object")
    where = f"entry {position}"
    if "numActiveRequests" not in stat:
        raise DynspecError(
            f"TRT-LLM iteration stats {where} has no numActiveRequests (the batch size the schedule is looked up "
            f"with): {dict(stat)!r}"
        )
    batch = _count(stat, stat, "numActiveRequests", where)
    if batch == 0:
        return None
    spec = stat.get("specDecodingStats") or {}
    ifb = stat.get("inflightBatchingStats") or {}
    drafted = _count(stat, spec, "numDraftTokens", where)
    accepted = _count(stat, spec, "numAcceptedTokens", where)
    drafting = _count(stat, spec, "numRequestsWithDraftTokens", where)
    if (drafted > 0) != (drafting > 0) or drafting > batch:
        raise DynspecError(
            f"TRT-LLM iteration stats {where}: numDraftTokens={drafted} over numRequestsWithDraftTokens={drafting} "
            f"with numActiveRequests={batch} is inconsistent"
        )
    return IterationStats(
        iteration=int(stat.get("iter", position)),
        batch_size=batch,
        k=math.ceil(drafted / drafting) if drafting else 0,
        drafted=drafted,
        accepted=accepted,
        emitted=_count(stat, ifb, "numGenRequests", where) + accepted,   # generation tokens: 1 + accepted per request
        seconds=float(stat.get("iterLatencyMS", 0.0)) / 1000.0,
        host_seconds=0.0,
        decode_rows=_reported_count(stat, ifb, "numGenRequests", where),
        prefill_tokens=_reported_count(stat, ifb, "numCtxTokens", where),
    )


def iteration_records(stats: Iterable[Mapping[str, Any] | str]) -> tuple[IterationStats, ...]:
    """Every non-idle entry, in order."""
    records = (iteration_record(s, i) for i, s in enumerate(stats))
    return tuple(r for r in records if r is not None)


def decoding_config(llmapi, spec: Mapping) -> Any:
    """speculative_config mapping (as in llm_api_options.yaml) -> TRT-LLM's config object, the
    way TRT-LLM's own YAML path does (DecodingBaseConfig.from_dict dispatches on decoding_type)."""
    spec = dict(spec)
    kind = spec.pop("decoding_type", "Eagle3")
    if kind not in ("Eagle3", "Eagle"):
        raise DynspecError(f"speculative_config.decoding_type {kind!r} is not 'Eagle3' or 'Eagle'")
    return (llmapi.Eagle3DecodingConfig if kind == "Eagle3" else llmapi.EagleDecodingConfig)(**spec)


class TrtllmEngine:
    """A running `tensorrt_llm.LLM` for one ENGINE_DIR."""

    def __init__(self, llm, sampling_params_cls, config: EngineConfig):
        self.llm, self._sp, self.config = llm, sampling_params_cls, config
        self._stats: list[IterationStats] = []

    @classmethod
    def open(cls, engine_dir: str | Path, **overrides) -> "TrtllmEngine":
        """LLM(**options) for engine_dir; overrides replace top-level option keys."""
        cfg, options = load_options(engine_dir)
        options.update(overrides)
        return cls.start(options, cfg)

    @classmethod
    def start(cls, options: Mapping, config: EngineConfig) -> "TrtllmEngine":
        """LLM(**options) for LLM-API options as written in llm_api_options.yaml (with "model");
        no speculative_config runs the target alone."""
        try:
            import tensorrt_llm
            from tensorrt_llm import LLM, SamplingParams
        except ImportError as e:
            raise DynspecError(
                f"the trtllm engine needs TensorRT-LLM (tensorrt_llm==1.2.1 from NVIDIA's package index): {e}"
            ) from e
        options = dict(options)
        if options.get("speculative_config") is not None:
            import tensorrt_llm.llmapi  # noqa: F401  (the decoding config classes)

            options["speculative_config"] = decoding_config(tensorrt_llm.llmapi, options["speculative_config"])
        return cls(LLM(**options), SamplingParams, config)

    # ---- requests -----------------------------------------------------------------------
    def _sampling(self, max_new_tokens: int, stop_ids: Sequence[int], ignore_eos: bool):
        if max_new_tokens < 1:
            raise DynspecError(f"max_new_tokens={max_new_tokens} must be at least 1")
        return self._sp(max_tokens=max_new_tokens, stop_token_ids=[int(s) for s in stop_ids] or None,
                        detokenize=False, ignore_eos=ignore_eos)

    async def stream(self, prompt_ids: Sequence[int], max_new_tokens: int,
                     stop_ids: Sequence[int] = (), ignore_eos: bool = False) -> AsyncIterator[list[int]]:
        """Yield lists of new token ids as TRT-LLM produces them (greedy: no sampling knobs set).
        ignore_eos=True runs to max_new_tokens (benchmarks: fixed output lengths)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise DynspecError("prompt is empty")
        out = self.llm.generate_async(prompt, sampling_params=self._sampling(max_new_tokens, stop_ids, ignore_eos),
                                      streaming=True)
        seen = 0
        async for partial in out:
            ids = partial.outputs[0].token_ids      # cumulative output ids of the request
            if len(ids) > seen:
                yield list(ids[seen:])
                seen = len(ids)

    async def agenerate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                        stop_ids: Sequence[int] = ()) -> list[int]:
        tokens: list[int] = []
        async for chunk in self.stream(prompt_ids, max_new_tokens, stop_ids):
            tokens.extend(chunk)
        return tokens

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 stop_ids: Sequence[int] = ()) -> list[list[int]]:
        """All prompts in flight at once (TRT-LLM batches them); outputs in prompt order."""
        async def run():
            return await asyncio.gather(*(self.agenerate(p, max_new_tokens, stop_ids) for p in prompts))

        return list(asyncio.run(run()))

    # ---- stats --------------------------------------------------------------------------
    def new_iteration_stats(self, timeout: float = 2.0) -> tuple[IterationStats, ...]:
        """The iterations TRT-LLM reported since the last call (they are also kept for iteration_stats)."""
        new = iteration_records(self.llm.get_stats(timeout=timeout))
        self._stats.extend(new)
        return new

    def iteration_stats(self, timeout: float = 2.0) -> tuple[IterationStats, ...]:
        """Every iteration seen so far (get_stats drains TRT-LLM's queue, so they are kept here)."""
        self.new_iteration_stats(timeout)
        return tuple(self._stats)

    def close(self) -> None:
        self.llm.shutdown()

    def __enter__(self) -> "TrtllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
