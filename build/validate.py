"""Check rendered LLM-API options against the rules of the pinned TRT-LLM version before they
are written, so a bad engine dir fails here and not at `LLM(...)` start-up on eight GPUs.

Rules (docs/design.md section 2, and DecodingBaseConfig.validate_draft_len_schedule_and_sort in
TRT-LLM's 1.2-era tensorrt_llm/llmapi/llm_args.py):
    all       max_draft_len in 1..MAX_DRAFT_LEN (dynspec's ceiling, runtime/policy.py),
              keys in 1..MAX_BATCH_SIZE (int32), values >= 0 and <= max_draft_len, values
              non-increasing with the key, every key <= max_batch_size is a CUDA-graph batch size
    1.2.x     key 1 exists and equals max_draft_len; eagle3_one_model is false
    1.3.x     the smallest key's value equals max_draft_len; no max_concurrency alongside
"""
from __future__ import annotations

from typing import Mapping

from dynspec.errors import DynspecError
from dynspec.runtime.policy import MAX_BATCH_SIZE, MAX_DRAFT_LEN, trtllm_dialect


def validate_options(options: Mapping, version: str) -> None:
    dialect = trtllm_dialect(version)
    if options.get("backend") != "pytorch":
        raise DynspecError(f"backend is {options.get('backend')!r}; dynamic draft length needs 'pytorch'")
    sc = options.get("speculative_config")
    if not isinstance(sc, Mapping):
        raise DynspecError("speculative_config is missing")
    if sc.get("decoding_type") != "Eagle3":
        raise DynspecError(f"speculative_config.decoding_type is {sc.get('decoding_type')!r}; expected 'Eagle3'")
    kmax = sc.get("max_draft_len")
    if isinstance(kmax, bool) or not isinstance(kmax, int) or not 1 <= kmax <= MAX_DRAFT_LEN:
        raise DynspecError(f"speculative_config.max_draft_len is {kmax!r}; expected an integer in 1..{MAX_DRAFT_LEN}")
    sched = sc.get("draft_len_schedule")
    if not sched:
        return
    where = f"speculative_config.draft_len_schedule {dict(sched)}"
    items = sorted(sched.items())
    prev = None
    for key, k in items:
        if isinstance(key, bool) or not isinstance(key, int) or not 1 <= key <= MAX_BATCH_SIZE:
            raise DynspecError(f"{where}: key {key!r} is not a batch size in 1..{MAX_BATCH_SIZE}")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= kmax:
            raise DynspecError(f"{where}: value {k!r} at key {key} is outside 0..max_draft_len={kmax}")
        if prev is not None and k > prev:
            raise DynspecError(f"{where}: K increases from {prev} to {k} at key {key}; values must not increase")
        prev = k
    graphs = set((options.get("cuda_graph_config") or {}).get("batch_sizes") or ())
    max_bs = options.get("max_batch_size")
    missing = [key for key, _ in items if max_bs is not None and key <= max_bs and key not in graphs]
    if missing:
        raise DynspecError(f"{where}: keys {missing} are not in cuda_graph_config.batch_sizes")
    if dialect == "lower":
        if 1 not in sched:
            raise DynspecError(f"{where}: TRT-LLM {version} needs key 1")
        if sched[1] != kmax:
            raise DynspecError(f"{where}: TRT-LLM {version} needs draft_len_schedule[1] == max_draft_len={kmax}")
        if sc.get("eagle3_one_model") is not False:
            raise DynspecError(
                f"{where}: TRT-LLM {version} honours a schedule only in the two-model drafter; "
                f"eagle3_one_model is {sc.get('eagle3_one_model')!r}, must be false"
            )
    else:
        if items[0][1] != kmax:
            raise DynspecError(f"{where}: TRT-LLM {version} needs the smallest key's value == max_draft_len={kmax}")
        if sc.get("max_concurrency") is not None:
            raise DynspecError(f"{where}: TRT-LLM {version} rejects max_concurrency together with a schedule")
