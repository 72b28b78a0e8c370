"""ENGINE_DIR/llm_api_options.yaml: TRT-LLM LLM-API arguments, usable unchanged as
`trtllm-serve MODEL --extra_llm_api_options FILE`, by trtllm-bench's --extra_llm_api_options,
and as `LLM(**yaml.safe_load(FILE))`.

Rendered for TRT-LLM 1.2.1, schedule "4:4,8:2" (max batch 64), capture layers (1, 39, 76):
    model: /abs/target                    # absolute: the file is read from any working dir
    backend: pytorch
    tensor_parallel_size: 8
    max_batch_size: 64
    max_seq_len: 4096
    max_num_tokens: 8192                  # >= every b * (1 + K_eff(b)), see decode_tokens
    enable_iter_perf_stats: true          # LLM.get_stats() returns nothing without it
    kv_cache_config: {free_gpu_memory_fraction: 0.9}
    cuda_graph_config: {enable_padding: true, batch_sizes: [1, 2, 4, 5, 8, 9, 16, 32, 64]}
    speculative_config:
      decoding_type: Eagle3
      max_draft_len: 4
      speculative_model_dir: /abs/draft   # the field before TRT-LLM PR 10099, an alias after it
      eagle3_one_model: false             # 1.2.x: only the two-model drafter honours a schedule
      eagle3_layers_to_capture: [1, 39, 76]
      draft_len_schedule: {1: 4, 5: 2, 9: 0}
Newer pins change only speculative_config (render_speculative_config).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import yaml

# The file's name and draft key, and its reader, live with the runtime that opens the file: one
# reader of the format, shared by every stage.
from dynspec.runtime.engines.trtllm_options import DRAFT_KEY
from dynspec.runtime.engines.trtllm_release import SpeculationGate, gate_options, release
from dynspec.runtime.policy import DraftSchedule

DEFAULT_MAX_NUM_TOKENS = 8192   # TRT-LLM's own default; also bounds one prefill chunk


@dataclass(frozen=True)
class LlmApiSettings:
    tp: int
    trtllm_version: str
    max_batch_size: int
    max_seq_len: int
    kv_cache_fraction: float
    max_num_tokens: int | None = None   # None: max(8192, decode_tokens(...))
    gate: SpeculationGate | None = None  # rendered under the release's own knob names (trtllm_release.py)


def graph_batch_sizes(schedule: DraftSchedule, rendered: dict[int, int], max_batch_size: int) -> list[int]:
    """Powers of two up to max_batch_size, max_batch_size itself, every tier bound and every
    rendered schedule key that a batch can reach. Bounds (4, 8) and 1.2.x keys (1, 5, 9) mean
    padding never carries a batch across a tier: b=5 pads to 5, not to 8."""
    sizes = {max_batch_size}
    p = 1
    while p < max_batch_size:
        sizes.add(p)
        p *= 2
    sizes.update(b for b in schedule.bounds if b <= max_batch_size)
    sizes.update(k for k in rendered if k <= max_batch_size)
    return sorted(sizes)


def decode_tokens(schedule: DraftSchedule, max_batch_size: int, version: str) -> int:
    """Most tokens one decode iteration feeds the target: max over b of b * (1 + K_eff(b)).

    K_eff = K on 1.3.x and 1.4.x (one-model graphs per (b, K)). On 1.2.x the two-model drafter
    pads every drafting request to the static max_draft_len for CUDA graphs, so K_eff =
    max_draft_len whenever K > 0.
    Example 1.2.x, "4:4,8:2", max batch 64: max(4*5, 8*5, 64*1) = 64.
    """
    pad = release(version).dialect == "lower"
    best = 0
    for b in {*schedule.bounds, max_batch_size}:
        if b > max_batch_size:
            continue
        k = schedule.draft_len(b)
        k_eff = schedule.max_draft_len if (pad and k > 0) else k
        best = max(best, b * (1 + k_eff))
    return best


def rendered_schedule(schedule: DraftSchedule, version: str) -> dict[int, int]:
    """The draft_len_schedule dict for `version`, in its release's dialect. "4:4,8:2":
        1.2.1 -> {1: 4, 5: 2, 9: 0}      1.3.0 / 1.4.0 -> {4: 4, 8: 2}"""
    rendered = schedule.to_trtllm(release(version).schedule_version)
    return {int(k): int(v) for k, v in rendered.items()}


def render_speculative_config(draft_dir: str, schedule: DraftSchedule, capture_layers: Sequence[int],
                              version: str, gate: SpeculationGate | None = None) -> dict:
    """speculative_config for `version`. Pure. The keys per release, "4:4,8:2", no gate:
        1.2.x  decoding_type, max_draft_len, speculative_model_dir, eagle3_one_model (false),
               eagle3_layers_to_capture, draft_len_schedule {1: 4, 5: 2, 9: 0}
        1.3.x  the same without eagle3_one_model (one-model is the default), draft_len_schedule {4: 4, 8: 2}
        1.4.x  as 1.3.x; eagle3_one_model is not a key there at all (PRs 17366, 18721)
    A gate adds the release's two knobs (PR 12905 renamed them in 1.3)."""
    rel = release(version)
    spec: dict = {
        "decoding_type": "Eagle3",
        "max_draft_len": schedule.max_draft_len,
        DRAFT_KEY: str(draft_dir),
    }
    if rel.one_model_key == "false":
        spec["eagle3_one_model"] = False
    spec["eagle3_layers_to_capture"] = [int(i) for i in capture_layers]
    spec["draft_len_schedule"] = rendered_schedule(schedule, version)
    spec.update(gate_options(gate, rel))
    return spec


def render_options(target_dir: str, draft_dir: str, schedule: DraftSchedule,
                   capture_layers: Sequence[int], s: LlmApiSettings) -> dict:
    """The LLM-API options dict for one engine dir. Pure."""
    spec = render_speculative_config(draft_dir, schedule, capture_layers, s.trtllm_version, s.gate)
    rendered = spec["draft_len_schedule"]
    return {
        "model": str(target_dir),
        "backend": "pytorch",
        "tensor_parallel_size": s.tp,
        "max_batch_size": s.max_batch_size,
        "max_seq_len": s.max_seq_len,
        "max_num_tokens": s.max_num_tokens or max(DEFAULT_MAX_NUM_TOKENS,
                                                  decode_tokens(schedule, s.max_batch_size, s.trtllm_version)),
        "enable_iter_perf_stats": True,
        "kv_cache_config": {"free_gpu_memory_fraction": s.kv_cache_fraction},
        "cuda_graph_config": {
            "enable_padding": True,
            "batch_sizes": graph_batch_sizes(schedule, rendered, s.max_batch_size),
        },
        "speculative_config": spec,
    }


def to_yaml(options: dict) -> str:
    header = ("# TRT-LLM LLM-API options written by `dynspec build`. Use unchanged with\n"
              "#   trtllm-serve MODEL --extra_llm_api_options THIS_FILE, trtllm-bench --extra_llm_api_options,\n"
              "#   or LLM(**yaml.safe_load(open(THIS_FILE))). Rebuild rather than edit: engine.json records it.\n")
    return header + yaml.safe_dump(options, sort_keys=False, default_flow_style=None)
