"""The TensorRT-LLM engine: an ENGINE_DIR opened with `tensorrt_llm.LLM(**options)`.

TRT-LLM runs its own continuous batching and applies `draft_len_schedule` itself, so this
engine sits at the client side of the executor: submit prompts, stream tokens, read back the
per-iteration record {b, K, drafted, accepted} that the reference engine's executor keeps.

`import tensorrt_llm` happens in `open` only; nothing else here needs it.

One `LLM.get_stats()` entry (C++ IterationStats as JSON; 1.2-era builds may hand back the JSON
string instead of the dict) -> one IterationStats:
    {"iter": 7, "iterLatencyMS": 21.5, "numActiveRequests": 3,
     "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 3, ...},
     "specDecodingStats": {"numDraftTokens": 12, "numAcceptedTokens": 7,
                           "numRequestsWithDraftTokens": 3, "acceptanceLength": 3.33, ...}}
    -> IterationStats(iteration=7, batch_size=3, k=4, drafted=12, accepted=7, emitted=10,
                      seconds=0.0215, host_seconds=0.0)
batch_size is numActiveRequests: TRT-LLM 1.2's PyExecutor looks the schedule up with
len(active_requests). K = drafted // requests that drafted (0 when none did).
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

from dynspec.build.llm_api import read_options
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
    options["speculative_config"]["speculative_model"] = cfg.draft_dir
    return cfg, options


def iteration_record(stat: Mapping[str, Any] | str) -> IterationStats:
    """One TRT-LLM iteration-stats entry -> the executor's IterationStats. Pure."""
    if isinstance(stat, str):
        stat = json.loads(stat)
    spec = stat.get("specDecodingStats") or {}
    ifb = stat.get("inflightBatchingStats") or {}
    drafted = int(spec.get("numDraftTokens", 0))
    accepted = int(spec.get("numAcceptedTokens", 0))
    drafting = int(spec.get("numRequestsWithDraftTokens", 0))
    return IterationStats(
        iteration=int(stat["iter"]),
        batch_size=int(stat.get("numActiveRequests", ifb.get("numScheduledRequests", 0))),
        k=drafted // drafting if drafting else 0,
        drafted=drafted,
        accepted=accepted,
        emitted=int(ifb.get("numGenRequests", 0)) + accepted,   # generation tokens: 1 + accepted per request
        seconds=float(stat.get("iterLatencyMS", 0.0)) / 1000.0,
        host_seconds=0.0,
    )


def iteration_records(stats: Iterable[Mapping[str, Any] | str]) -> tuple[IterationStats, ...]:
    return tuple(iteration_record(s) for s in stats)


class TrtllmEngine:
    """A running `tensorrt_llm.LLM` for one ENGINE_DIR."""

    def __init__(self, llm, sampling_params_cls, config: EngineConfig):
        self.llm, self._sp, self.config = llm, sampling_params_cls, config
        self._stats: list[IterationStats] = []

    @classmethod
    def open(cls, engine_dir: str | Path, **overrides) -> "TrtllmEngine":
        """LLM(**options) for engine_dir; overrides replace top-level option keys."""
        try:
            from tensorrt_llm import LLM, SamplingParams
        except ImportError as e:
            raise DynspecError(
                f"the trtllm engine needs TensorRT-LLM (tensorrt_llm==1.2.1 from NVIDIA's package index): {e}"
            ) from e
        cfg, options = load_options(engine_dir)
        options.update(overrides)
        return cls(LLM(**options), SamplingParams, cfg)

    # ---- requests -----------------------------------------------------------------------
    def _sampling(self, max_new_tokens: int, stop_ids: Sequence[int]):
        if max_new_tokens < 1:
            raise DynspecError(f"max_new_tokens={max_new_tokens} must be at least 1")
        return self._sp(max_tokens=max_new_tokens, stop_token_ids=[int(s) for s in stop_ids] or None,
                        detokenize=False)

    async def stream(self, prompt_ids: Sequence[int], max_new_tokens: int,
                     stop_ids: Sequence[int] = ()) -> AsyncIterator[list[int]]:
        """Yield lists of new token ids as TRT-LLM produces them (greedy: no sampling knobs set)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise DynspecError("prompt is empty")
        out = self.llm.generate_async(prompt, sampling_params=self._sampling(max_new_tokens, stop_ids),
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
    def iteration_stats(self, timeout: float = 2.0) -> tuple[IterationStats, ...]:
        """Every iteration seen so far (get_stats drains TRT-LLM's queue, so they are kept here)."""
        self._stats.extend(iteration_records(self.llm.get_stats(timeout=timeout)))
        return tuple(self._stats)

    def close(self) -> None:
        self.llm.shutdown()

    def __enter__(self) -> "TrtllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
