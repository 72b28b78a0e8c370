"""Check rendered LLM-API options against the rules of the pinned TRT-LLM version before they
are written, so a bad engine dir fails here and not at `LLM(...)` start-up on eight GPUs.

Rules (docs/design.md section 2; DecodingBaseConfig.validate_draft_len_schedule_and_sort in
TRT-LLM's llm_args.py; the release rows in runtime/engines/trtllm_release.py):
    all       max_draft_len in 1..MAX_DRAFT_LEN (dynspec's ceiling, runtime/policy/__init__.py),
              keys in 1..MAX_BATCH_SIZE (int32), values >= 0 and <= max_draft_len, values
              non-increasing with the key, every key <= max_batch_size is a CUDA-graph batch size
    1.2.x     key 1 exists and equals max_draft_len; eagle3_one_model is false;
              gate knobs acceptance_window / acceptance_length_threshold (a length >= 0)
    1.3.x     the smallest key's value equals max_draft_len; no max_concurrency alongside;
              gate knobs acceptance_rate_window_size / acceptance_rate_threshold (a rate in [0, 1])
    1.4.x     as 1.3.x, and no eagle3_one_model key: every EAGLE-3 config is one-model
A gate knob under the other release's name is refused by name, e.g. on 1.3.0:
    speculative_config.acceptance_window is not a TRT-LLM 1.3.0 field: PR 12905 renamed it
    acceptance_rate_window_size (1.3.x and later)
"""
from __future__ import annotations

from typing import Mapping

from dynspec.errors import DynspecError
from dynspec.runtime.engines.trtllm_release import TrtllmRelease, release
from dynspec.runtime.policy import MAX_BATCH_SIZE, MAX_DRAFT_LEN


def _check_gate_names(sc: Mapping, rel: TrtllmRelease, version: str) -> None:
    """A 1.2 gate name on 1.3+/1.4 or a 1.3 name on 1.2 names itself, the version and its replacement."""
    for key, right in rel.renamed_gate_keys:
        if key in sc:
            when = "1.3.x and later" if rel.gate_unit == "rate" else f"{rel.name}, before 1.3"
            raise DynspecError(
                f"speculative_config.{key} is not a TRT-LLM {version} field: PR 12905 renamed the "
                f"speculation gate's knobs, and TRT-LLM {rel.name} calls it {right} ({when})"
            )


def _check_gate_values(sc: Mapping, rel: TrtllmRelease, version: str) -> None:
    window_key, threshold_key = rel.gate_keys
    window, threshold = sc.get(window_key), sc.get(threshold_key)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise DynspecError(f"speculative_config.{window_key} is {window!r}; TRT-LLM {version} needs an integer >= 0")
    if threshold is None:
        return
    number = isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
    if rel.gate_unit == "rate" and not (number and 0.0 <= threshold <= 1.0):
        raise DynspecError(
            f"speculative_config.{threshold_key} is {threshold!r}; on TRT-LLM {version} it is an acceptance rate "
            f"in [0, 1] (PR 12905), not an acceptance length"
        )
    if rel.gate_unit == "length" and not (number and threshold >= 0):
        raise DynspecError(
            f"speculative_config.{threshold_key} is {threshold!r}; on TRT-LLM {version} it is an acceptance "
            f"length >= 0 (tokens per drafting request)"
        )


def _check_one_model(sc: Mapping, rel: TrtllmRelease, version: str) -> None:
    if rel.one_model_key == "rejected" and "eagle3_one_model" in sc:
        raise DynspecError(
            f"speculative_config.eagle3_one_model is not a TRT-LLM {version} field: {rel.name} runs every EAGLE-3 "
            f"config one-model (PR 17366 forced two-model configs to one-model, PR 18721 removed the two-model "
            f"path); leave the key out"
        )


def _check_schedule(options: Mapping, sc: Mapping, rel: TrtllmRelease, version: str) -> None:
    kmax = sc["max_draft_len"]
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
    if rel.dialect == "lower":
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


def validate_options(options: Mapping, version: str) -> None:
    rel = release(version)
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
    _check_gate_names(sc, rel, version)
    _check_one_model(sc, rel, version)
    _check_gate_values(sc, rel, version)
    _check_schedule(options, sc, rel, version)
