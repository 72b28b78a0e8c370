"""What each TRT-LLM release dynspec renders for accepts in `speculative_config`.

One row per major.minor. The rows are facts from TRT-LLM's sources and pull requests
(docs/design.md, section 2); every renderer and validator in build/, and the TRT-LLM engine,
read them from here.

    release  schedule keys          eagle3_one_model        speculation gate knobs
    1.2.x    lower bounds (1.2.1)   written false           acceptance_window, acceptance_length_threshold
    1.3.x    upper bounds (1.3.0)   left out (default true) acceptance_rate_window_size, acceptance_rate_threshold
    1.4.x    upper bounds (1.3.0)   not accepted            acceptance_rate_window_size, acceptance_rate_threshold

Sources:
- 1.2.x: Drafter.get_draft_len_for_batch_size (bisect_right, lower bounds) honoured by the two-model
  drafter only, so eagle3_one_model: false (docs/design.md, section 2).
- 1.3.x: PR 10860 (NVIDIA/TensorRT-LLM#10860) moves the schedule to the one-model path with upper
  bounds. PR 12905 (NVIDIA/TensorRT-LLM#12905, "BREAKING") renames the gate's knobs
  acceptance_window -> acceptance_rate_window_size and acceptance_length_threshold ->
  acceptance_rate_threshold, and the threshold becomes an acceptance RATE in [0, 1] instead of an
  acceptance length; the 1.2 names and the two-model gate are removed.
- 1.4.x: PR 17366 (NVIDIA/TensorRT-LLM#17366, "BREAKING: Force 2 model spec dec to fall back to 1
  model") makes every EAGLE-3 config one-model; PR 18721 (NVIDIA/TensorRT-LLM#18721) removes the
  two-model path. The schedule keeps 1.3's upper-bound dialect, so 1.4 is rendered with it.
- Keeping the drafter alive at K=0: `keep_drafter_warm` and `min_runtime_draft_len` come from one open PR,
  16888 (NVIDIA/TensorRT-LLM#16888), as read-only properties of DecodingBaseConfig
  (tensorrt_llm/llmapi/llm_args.py of the PR's branch; its keep-warm iteration: warm only for Eagle3 /
  MTP-Eagle one-model linear drafting, min 0 there, 1 for other one-engine modes, 0 for two-model), and
  from no release: 1.2.x-1.4.x have neither, and as properties they are no LLM-API keys at all. So
  DRAFTER_KEEP_ALIVE_KEYS are rendered on no pin; where the schedule reaches K=0, `dynspec build` warns
  and offers `--min-draft-len 1` (build/trap.py).
Not established from a release tag: which 1.3.0rc first carries PR 12905 (1.3.0rcN builds older
than its merge still take the 1.2 gate names), and whether 1.4 refuses an eagle3_one_model key or
ignores it; dynspec never writes the key on 1.4 and refuses it there, which is valid either way.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from dynspec.errors import DynspecError

PINNED = "1.2.1"    # the default `--trtllm-version`
DRAFTER_KEEP_ALIVE_KEYS = ("keep_drafter_warm", "min_runtime_draft_len")   # PR 16888 only: never rendered

# Same grammar as runtime/policy/schedule_trtllm.py: '1.2.1', '1.3.0rc5', '1.4.0.post1'; ASCII digits only.
_VERSION = re.compile(r"([0-9]+)\.([0-9]+)(?:\.[0-9]+)?(?:[.\-+]?(?:rc|a|b|post|dev)[0-9]*)?", re.ASCII)


@dataclass(frozen=True)
class SpeculationGate:
    """Turns speculation off for good once the rolling acceptance over `window` samples falls
    below `threshold`. The threshold's unit depends on the release (TrtllmRelease.gate_unit):
        1.2.x  acceptance LENGTH, tokens per drafting request (>= 0), e.g. SpeculationGate(64, 1.3)
        1.3.x+ acceptance RATE, accepted / drafted in [0, 1],        e.g. SpeculationGate(64, 0.3)"""
    window: int
    threshold: float


@dataclass(frozen=True)
class TrtllmRelease:
    series: tuple[int, int]          # (major, minor)
    dialect: str                     # draft_len_schedule keys: 'lower' or 'upper' bounds
    schedule_version: str            # a version DraftSchedule.to_trtllm / from_trtllm render this dialect for
    one_model_key: str               # 'false': write eagle3_one_model: false; 'omit': leave it out;
                                     # 'rejected': the key must not appear
    gate_keys: tuple[str, str]       # (window, threshold) names in speculative_config
    gate_unit: str                   # 'length' or 'rate'
    renamed_gate_keys: tuple         # ((name this release refuses, the name it takes), ...)

    @property
    def name(self) -> str:
        return f"{self.series[0]}.{self.series[1]}.x"


_GATE_12 = ("acceptance_window", "acceptance_length_threshold")
_GATE_13 = ("acceptance_rate_window_size", "acceptance_rate_threshold")   # PR 12905

RELEASES = {
    (1, 2): TrtllmRelease((1, 2), "lower", "1.2.1", "false", _GATE_12, "length", tuple(zip(_GATE_13, _GATE_12))),
    (1, 3): TrtllmRelease((1, 3), "upper", "1.3.0", "omit", _GATE_13, "rate", tuple(zip(_GATE_12, _GATE_13))),
    (1, 4): TrtllmRelease((1, 4), "upper", "1.3.0", "rejected", _GATE_13, "rate", tuple(zip(_GATE_12, _GATE_13))),
}


def series(version: str) -> tuple[int, int]:
    """'1.3.0rc5' -> (1, 3). The whole string must match: ' 1.2.1' and '1.2.1\\n' are refused."""
    m = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if not m:
        raise DynspecError(f"unparseable TensorRT-LLM version {version!r}; expected e.g. '{PINNED}'")
    return int(m.group(1)), int(m.group(2))


def release(version: str) -> TrtllmRelease:
    """The row for `version`; a release dynspec has no facts for is refused by name.
        '1.2.1' -> RELEASES[(1, 2)];  '1.4.0rc1' -> RELEASES[(1, 4)];  '1.5.0' -> DynspecError"""
    key = series(version)
    if key not in RELEASES:
        known = ", ".join(r.name for r in RELEASES.values())
        raise DynspecError(
            f"TensorRT-LLM version {version!r} is not a release dynspec renders LLM-API options for; "
            f"known: {known} (default pin {PINNED})"
        )
    return RELEASES[key]


def gate_options(gate: SpeculationGate | None, rel: TrtllmRelease) -> dict:
    """speculative_config entries for a gate under the release's own knob names. Pure.
        SpeculationGate(64, 0.3), 1.3.x -> {'acceptance_rate_window_size': 64, 'acceptance_rate_threshold': 0.3}
        SpeculationGate(64, 1.3), 1.2.x -> {'acceptance_window': 64, 'acceptance_length_threshold': 1.3}"""
    if gate is None:
        return {}
    window_key, threshold_key = rel.gate_keys
    return {window_key: int(gate.window), threshold_key: float(gate.threshold)}
