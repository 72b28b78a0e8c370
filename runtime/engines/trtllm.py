"""The TensorRT-LLM engine: an ENGINE_DIR opened with `tensorrt_llm.LLM(**options)`.

TRT-LLM runs its own continuous batching and applies `draft_len_schedule` itself, so this
engine sits at the client side of the executor: submit prompts, stream tokens, read back the
per-iteration record {b, K, drafted, accepted} that the reference engine's executor keeps.

`import tensorrt_llm` happens in `TrtllmEngine.start` only; nothing else here needs it.

K is one value per iteration for the whole batch on every TRT-LLM release dynspec renders for
(1.2.x-1.4.x, both drafter paths; docs/design.md, "Per-request draft length on TensorRT-LLM"), so
a per-request K is a reference-engine feature: `check_draft_granularity` refuses it here.

One `LLM.get_stats()` entry (C++ IterationStats as JSON; 1.2-era builds may hand back the JSON
string instead of the dict) + the DraftLengths the LLM was started with -> one IterationStats,
by `iteration_record`, the one parser of these entries in dynspec (the engine and
benchmarks/trtllm_driver.py both use it). TRT-LLM 1.2.1, draft_len_schedule {1: 4, 3: 2, 9: 0}
(max_draft_len 4):
    {"iter": 7, "iterLatencyMS": 21.5, "numActiveRequests": 3,
     "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 3, ...},
     "specDecodingStats": {"numDraftTokens": 12, "numAcceptedTokens": 4,
                           "numRequestsWithDraftTokens": 3, "acceptanceLength": 2.33, ...}}
    -> IterationStats(iteration=7, batch_size=3, k=2, drafted=6, accepted=4, emitted=7,
                      seconds=0.0215, host_seconds=0.0, decode_rows=3, prefill_tokens=None)
Rules (field names from cpp/tensorrt_llm/executor/jsonSerialization.cpp; meanings from the
1.2-era PyExecutor iteration-stats code, docs/design.md, section 2, "Stats parser"):
- batch_size = numActiveRequests, the count PyExecutor looks draft_len_schedule up with
  (len(active_requests)). TRT-LLM always writes it; an entry without it is refused, not guessed.
  numActiveRequests == 0 is an idle iteration: no record.
- K = the started schedule's K at numActiveRequests, not a ratio of the counts: on 1.2.x
  numDraftTokens sums each drafting request's draft list after the zero padding to
  max_draft_len that CUDA graphs need, so numDraftTokens / numRequestsWithDraftTokens reads
  max_draft_len (12 / 3 = 4 above), not the scheduled K (2).
- drafted = K x numRequestsWithDraftTokens (6 above). numDraftTokens is a consistency check
  only: it must be max_draft_len or K tokens per drafting request (a build that stops padding);
  anything else is refused. accepted = numAcceptedTokens (at most numDraftTokens).
- With the overlap scheduler (dynspec leaves it on) a record is computed one iteration late, after
  the next iteration has reset the requests' draft lists; at a K>0 -> K=0 edge the requests that
  drafted can drop out (numRequestsWithDraftTokens 0 while K > 0). That is a reading of the call
  order, not a measured fact. Such a record keeps its K with drafted = accepted = 0: drafting with
  unknown acceptance, which leaves the acceptance rate alone. A K=0 record that reports drafting
  requests but accepted nothing (the same edge the other way round) is read as plain decode.
- decode_rows = inflightBatchingStats.numGenRequests (the generation requests PyExecutor
  scheduled); prefill_tokens = inflightBatchingStats.numCtxTokens (the model engine's context
  tokens of the iteration, prompt chunks included). A field the entry lacks is None, not 0:
  the example above has no numCtxTokens, so its prefill is unknown, not zero.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

from dynspec.config import EngineConfig
from dynspec.errors import DynspecError
from dynspec.runtime.engines.trtllm_options import DRAFT_KEY, DRAFT_KEYS, read_options
from dynspec.runtime.engines.trtllm_release import release
from dynspec.runtime.serving.executor import IterationStats
from dynspec.runtime.policy import MAX_BATCH_SIZE, DraftSchedule


@dataclass(frozen=True)
class DraftLengths:
    """What a started LLM drafts: K per batch size, looked up as PyExecutor does, and the static
    max_draft_len that 1.2.x pads each drafting request to. No tiers: no speculation."""
    schedule: DraftSchedule = DraftSchedule()
    max_draft_len: int = 0

    def k(self, batch_size: int) -> int:
        return self.schedule.draft_len(batch_size)


def draft_lengths(options: Mapping, version: str) -> DraftLengths:
    """LLM() options (speculative_config still a mapping) -> DraftLengths. Pure.
        no speculative_config                        -> K = 0 everywhere
        max_draft_len 3, no draft_len_schedule       -> K = 3 at every batch size
        max_draft_len 4, {1: 4, 3: 2, 9: 0} on 1.2.1 -> K = 4 for b 1..2, 2 for 3..8, 0 above"""
    spec = options.get("speculative_config")
    if spec is None:
        return DraftLengths()
    kmax = spec.get("max_draft_len") if isinstance(spec, Mapping) else None
    if isinstance(kmax, bool) or not isinstance(kmax, int) or kmax < 1:
        raise DynspecError(f"speculative_config.max_draft_len is {kmax!r}; expected an integer >= 1")
    sched = spec.get("draft_len_schedule")
    if sched is None:
        return DraftLengths(DraftSchedule.static(kmax, MAX_BATCH_SIZE), kmax)
    return DraftLengths(DraftSchedule.from_trtllm(sched, release(version).schedule_version), kmax)


# How many draft lengths one iteration may carry: "batch" (one K for every decode row) or
# "request" (a K per row, the reference engine's ragged verify).
DRAFT_GRANULARITIES = ("batch", "request")


def check_draft_granularity(granularity: str, version: str) -> None:
    """Refuse what TRT-LLM `version` cannot run. Pure.
        ("batch", "1.2.1")   -> None
        ("request", "1.4.0") -> DynspecError naming the reason and the engine that can"""
    rel = release(version)
    if granularity not in DRAFT_GRANULARITIES:
        raise DynspecError(f"draft length granularity {granularity!r} is not one of {list(DRAFT_GRANULARITIES)}")
    if granularity == "request":
        raise DynspecError(
            f"per-request draft length is a reference-engine feature: TRT-LLM {version} ({rel.name}) decides one K "
            f"per iteration for the whole batch and pads every request's drafts to it (PyExecutor "
            f"max_total_draft_tokens / runtime_draft_len, Drafter.pad_draft_tokens_for_cuda_graph); run this "
            f"engine dir with the reference engine, or with granularity 'batch'"
        )


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


def _entry(stat: Mapping[str, Any] | str, position: int) -> Mapping:
    if isinstance(stat, str):
        try:
            stat = json.loads(stat)
        except ValueError as e:
            raise DynspecError(f"TRT-LLM iteration stats entry {position} is not JSON: {e}") from None
    if not isinstance(stat, Mapping):
        raise DynspecError(f"TRT-LLM iteration stats entry {position} is {type(stat).__name__}, not an object")
    if "numActiveRequests" not in stat:
        raise DynspecError(
            f"TRT-LLM iteration stats entry {position} has no numActiveRequests (the batch size the schedule is "
            f"looked up with): {dict(stat)!r}"
        )
    return stat


def _drafts(stat: Mapping, lengths: DraftLengths, batch: int, where: str) -> tuple[int, int, int]:
    """(K, drafted, accepted) of one entry by the rules in the module docstring."""
    spec = stat.get("specDecodingStats") or {}
    reported = _count(stat, spec, "numDraftTokens", where)
    accepted = _count(stat, spec, "numAcceptedTokens", where)
    n = _count(stat, spec, "numRequestsWithDraftTokens", where)
    k = lengths.k(batch)
    padded = (lengths.max_draft_len * n, k * n) if k else (reported,)
    if (reported > 0) != (n > 0) or n > batch or accepted > reported or reported not in padded:
        raise DynspecError(
            f"TRT-LLM iteration stats {where}: numDraftTokens={reported}, numAcceptedTokens={accepted} over "
            f"numRequestsWithDraftTokens={n} with numActiveRequests={batch} is inconsistent with K={k} "
            f"(max_draft_len {lengths.max_draft_len}): expected max_draft_len or K drafts per drafting request"
        )
    if k == 0 and accepted:
        raise DynspecError(
            f"TRT-LLM iteration stats {where}: numAcceptedTokens={accepted} at numActiveRequests={batch}, where the "
            f"schedule gives K=0"
        )
    return k, k * n, accepted


def iteration_record(stat: Mapping[str, Any] | str, lengths: DraftLengths,
                     position: int = 0) -> IterationStats | None:
    """One TRT-LLM iteration-stats entry -> the executor's IterationStats, or None for an idle
    iteration. Pure. `lengths`: how the LLM was started; `position` numbers an entry without "iter"."""
    stat = _entry(stat, position)
    where = f"entry {position}"
    batch = _count(stat, stat, "numActiveRequests", where)
    if batch == 0:
        return None
    ifb = stat.get("inflightBatchingStats") or {}
    k, drafted, accepted = _drafts(stat, lengths, batch, where)
    return IterationStats(
        iteration=int(stat.get("iter", position)),
        batch_size=batch,
        k=k,
        drafted=drafted,
        accepted=accepted,
        emitted=_count(stat, ifb, "numGenRequests", where) + accepted,   # generation tokens: 1 + accepted per request
        seconds=float(stat.get("iterLatencyMS", 0.0)) / 1000.0,
        host_seconds=0.0,
        decode_rows=_reported_count(stat, ifb, "numGenRequests", where),
        prefill_tokens=_reported_count(stat, ifb, "numCtxTokens", where),
    )


def iteration_records(stats: Iterable[Mapping[str, Any] | str], lengths: DraftLengths) -> tuple[IterationStats, ...]:
    """Every non-idle entry, in order."""
    records = (iteration_record(s, lengths, i) for i, s in enumerate(stats))
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

    def __init__(self, llm, sampling_params_cls, config: EngineConfig, lengths: DraftLengths):
        self.llm, self._sp, self.config, self.lengths = llm, sampling_params_cls, config, lengths
        self._stats: list[IterationStats] = []

    @classmethod
    def open(cls, engine_dir: str | Path, granularity: str = "batch", **overrides) -> "TrtllmEngine":
        """LLM(**options) for engine_dir; overrides replace top-level option keys."""
        cfg, options = load_options(engine_dir)
        options.update(overrides)
        return cls.start(options, cfg, granularity)

    @classmethod
    def start(cls, options: Mapping, config: EngineConfig, granularity: str = "batch") -> "TrtllmEngine":
        """LLM(**options) for LLM-API options as written in llm_api_options.yaml (with "model");
        no speculative_config runs the target alone. granularity "request" is refused before
        anything is imported or started (check_draft_granularity), as is engine.json's
        "policy": "per-request"."""
        check_draft_granularity("request" if config.policy == "per-request" else granularity, config.trtllm_version)
        try:
            import tensorrt_llm
            from tensorrt_llm import LLM, SamplingParams
        except ImportError as e:
            raise DynspecError(
                f"the trtllm engine needs TensorRT-LLM (tensorrt_llm==1.2.1 from NVIDIA's package index): {e}"
            ) from e
        options = dict(options)
        lengths = draft_lengths(options, config.trtllm_version)
        if options.get("speculative_config") is not None:
            import tensorrt_llm.llmapi  # noqa: F401  (the decoding config classes)

            options["speculative_config"] = decoding_config(tensorrt_llm.llmapi, options["speculative_config"])
        return cls(LLM(**options), SamplingParams, config, lengths)

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
        new = iteration_records(self.llm.get_stats(timeout=timeout), self.lengths)
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
