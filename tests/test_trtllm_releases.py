"""Contract with each TRT-LLM release dynspec renders LLM-API options for: 1.2.1 (the pin), 1.3.x, 1.4.x.

The facts per release (runtime/engines/trtllm_release.py; TRT-LLM PRs 10860, 12905, 17366, 18721) are written
out below a second time, independently of dynspec's code: the exact speculative_config keys, the
two draft_len_schedule lookups, and the gate knob names each release accepts.
"""
import bisect
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dynspec.build.llm_api import LlmApiSettings, decode_tokens, render_options
from dynspec.build.trap import trap_warning
from dynspec.build.validate import validate_options
from dynspec.errors import DynspecError
from dynspec.runtime.engines.trtllm_release import SpeculationGate, release
from dynspec.runtime.policy import DraftSchedule

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "trtllm_1_2_1_llm_args.json").read_text())

PINS = ("1.2.1", "1.3.0", "1.3.0rc5", "1.4.0", "1.4.0rc1")
GATE_12 = ("acceptance_window", "acceptance_length_threshold")
GATE_13 = ("acceptance_rate_window_size", "acceptance_rate_threshold")     # PR 12905

# speculative_config keys, in the order dynspec writes them, per release.
KEYS = {
    "1.2": ["decoding_type", "max_draft_len", "speculative_model_dir", "eagle3_one_model",
            "eagle3_layers_to_capture", "draft_len_schedule"],
    "1.3": ["decoding_type", "max_draft_len", "speculative_model_dir", "eagle3_layers_to_capture",
            "draft_len_schedule"],
    "1.4": ["decoding_type", "max_draft_len", "speculative_model_dir", "eagle3_layers_to_capture",
            "draft_len_schedule"],
}


def series(version: str) -> str:
    return ".".join(version.split(".")[:2])


# ---- the two lookups, written out -----------------------------------------------------------------
def lookup_lower(sched: dict, b: int) -> int:
    """1.2.x Drafter.get_draft_len_for_batch_size: the largest key <= b (bisect_right)."""
    keys = sorted(sched)
    i = bisect.bisect_right(keys, b)
    return 0 if i == 0 else sched[keys[i - 1]]


def lookup_upper(sched: dict, b: int) -> int:
    """1.3.x+ (PR 10860): the smallest key >= b (bisect_left); above the largest key K = 0."""
    keys = sorted(sched)
    i = bisect.bisect_left(keys, b)
    return 0 if i == len(keys) else sched[keys[i]]


LOOKUP = {"1.2": lookup_lower, "1.3": lookup_upper, "1.4": lookup_upper}


def render(version: str, spec: str = "4:4,8:2", max_bs: int = 64, gate=None) -> dict:
    return render_options("/t", "/d", DraftSchedule.parse(spec), [1, 3, 4],
                          LlmApiSettings(8, version, max_bs, 4096, 0.9, gate=gate))


# ---- rendering ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", PINS)
def test_each_release_gets_its_exact_keys(version):
    sc = render(version)["speculative_config"]
    assert list(sc) == KEYS[series(version)]
    assert sc["draft_len_schedule"] == ({1: 4, 5: 2, 9: 0} if version.startswith("1.2") else {4: 4, 8: 2})
    if version.startswith("1.2"):
        assert sc["eagle3_one_model"] is False      # only the two-model drafter honours a 1.2 schedule


@pytest.mark.parametrize("version, gate, keys", [
    ("1.2.1", SpeculationGate(64, 1.5), GATE_12),
    ("1.3.0", SpeculationGate(64, 0.3), GATE_13),
    ("1.4.0", SpeculationGate(64, 0.3), GATE_13),
])
def test_gate_renders_under_the_release_names(version, gate, keys):
    sc = render(version, gate=gate)["speculative_config"]
    assert list(sc) == KEYS[series(version)] + list(keys)
    assert (sc[keys[0]], sc[keys[1]]) == (64, gate.threshold)
    validate_options(render(version, gate=gate), version)


def test_121_gate_keys_are_fields_of_the_121_config():
    sc = render("1.2.1", gate=SpeculationGate(32, 2.0))["speculative_config"]
    accepted = set(FIXTURE["models"]["Eagle3DecodingConfig"]) | set(FIXTURE["aliases"]["Eagle3DecodingConfig"])
    assert set(sc) <= accepted
    assert not set(GATE_13) & accepted                 # the 1.3 names do not exist in 1.2.1


@pytest.mark.parametrize("version", PINS)
@pytest.mark.parametrize("spec, max_bs", [("4:4,8:2", 64), ("5:4", 256), ("2:6,3:5,4:4,100:1", 64), ("1:1", 8),
                                          ("4:3,16:2,64:1", 64)])
def test_schedule_semantics_per_release(version, spec, max_bs):
    s = DraftSchedule.parse(spec)
    options = render(version, spec, max_bs)
    validate_options(options, version)
    sched = options["speculative_config"]["draft_len_schedule"]
    look = LOOKUP[series(version)]
    assert [look(sched, b) for b in range(1, 2 * max_bs + 1)] == [s.draft_len(b) for b in range(1, 2 * max_bs + 1)]
    assert {k for k in sched if k <= max_bs} <= set(options["cuda_graph_config"]["batch_sizes"])


def test_the_two_lookups_disagree_on_the_same_dict():
    """The oracle is not vacuous: one dict read under the other release's rule gives other K."""
    sched = {1: 4, 5: 2, 9: 0}
    assert [lookup_lower(sched, b) for b in (1, 4, 5, 9)] == [4, 4, 2, 0]
    assert [lookup_upper(sched, b) for b in (1, 4, 5, 9)] == [4, 2, 2, 0]


def test_decode_budget_pads_only_on_12():
    s = DraftSchedule.parse("4:4,8:3,32:2")
    assert decode_tokens(s, 64, "1.2.1") == max(4 * 5, 8 * 5, 32 * 5, 64 * 1)
    assert decode_tokens(s, 64, "1.3.0") == decode_tokens(s, 64, "1.4.0") == max(4 * 5, 8 * 4, 32 * 3, 64 * 1)


def test_trap_warning_names_the_one_engine_path_on_14():
    w = trap_warning("1.4.0", DraftSchedule.parse("4:4,8:2"), 32)
    assert "from batch size 9" in w and "PR 16888" in w and "17366" in w


# ---- validation: the other release's names are refused by name -----------------------------------
def _options(version: str, **spec) -> dict:
    options = render(version)
    options["speculative_config"].update(spec)
    return options


@pytest.mark.parametrize("version, key, right", [
    ("1.2.1", "acceptance_rate_window_size", "acceptance_window"),
    ("1.2.1", "acceptance_rate_threshold", "acceptance_length_threshold"),
    ("1.3.0", "acceptance_window", "acceptance_rate_window_size"),
    ("1.3.0", "acceptance_length_threshold", "acceptance_rate_threshold"),
    ("1.4.0", "acceptance_window", "acceptance_rate_window_size"),
    ("1.4.0", "acceptance_length_threshold", "acceptance_rate_threshold"),
])
def test_wrong_gate_names_are_refused_naming_key_and_version(version, key, right):
    with pytest.raises(DynspecError, match=rf"speculative_config\.{key} is not a TRT-LLM {version} field: "
                                           rf"PR 12905 .* calls it {right}"):
        validate_options(_options(version, **{key: 1}), version)


@pytest.mark.parametrize("version, spec, needle", [
    ("1.3.0", {"acceptance_rate_threshold": 1.5}, r"acceptance_rate_threshold is 1\.5; on TRT-LLM 1\.3\.0 it is "
                                                   r"an acceptance rate in \[0, 1\]"),
    ("1.4.0", {"acceptance_rate_threshold": -0.1}, r"acceptance_rate_threshold is -0\.1"),
    ("1.2.1", {"acceptance_length_threshold": -1.0}, r"acceptance_length_threshold is -1\.0; on TRT-LLM 1\.2\.1 "
                                                      r"it is an acceptance length"),
    ("1.3.0", {"acceptance_rate_window_size": 2.5}, r"acceptance_rate_window_size is 2\.5"),
    ("1.2.1", {"acceptance_window": True}, r"acceptance_window is True"),
    ("1.4.0", {"eagle3_one_model": True}, r"eagle3_one_model is not a TRT-LLM 1\.4\.0 field: .*PR 17366"),
    ("1.4.0rc1", {"eagle3_one_model": False}, r"eagle3_one_model is not a TRT-LLM 1\.4\.0rc1 field"),
    ("1.2.1", {"eagle3_one_model": True}, r"eagle3_one_model is True, must be false"),
    ("1.3.0", {"max_concurrency": 8}, r"TRT-LLM 1\.3\.0 rejects max_concurrency"),
    ("1.4.0", {"max_concurrency": 8}, r"TRT-LLM 1\.4\.0 rejects max_concurrency"),
])
def test_release_rules(version, spec, needle):
    with pytest.raises(DynspecError, match=needle):
        validate_options(_options(version, **spec), version)


@pytest.mark.parametrize("version, spec", [
    ("1.2.1", {"acceptance_window": 0, "acceptance_length_threshold": 1}),
    ("1.3.0", {"acceptance_rate_window_size": 128, "acceptance_rate_threshold": 0}),
    ("1.4.0", {"acceptance_rate_window_size": 128, "acceptance_rate_threshold": 1.0}),
    ("1.3.0", {"eagle3_one_model": True}),            # still a 1.3 field (two-model removal is 1.4)
])
def test_release_rules_accept_the_right_names(version, spec):
    validate_options(_options(version, **spec), version)


# ---- unknown releases --------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.5.0", "1.1.0", "0.21.0", "2.0.0rc1"])
def test_unknown_release_is_a_clear_error(version):
    needle = rf"TensorRT-LLM version '{version}' is not a release dynspec renders .*known: 1\.2\.x, 1\.3\.x, 1\.4\.x"
    for call in (lambda: release(version), lambda: render(version),
                 lambda: validate_options(render("1.3.0"), version)):
        with pytest.raises(DynspecError, match=needle):
            call()


@pytest.mark.parametrize("version", ["1.2", "v1.2.1", " 1.2.1", "1.2.1\n", "\uff11.2.1", "", None])
def test_unparseable_release_is_a_clear_error(version):
    if version == "1.2":                               # major.minor alone is a version
        assert release(version).series == (1, 2)
        return
    with pytest.raises(DynspecError, match="unparseable TensorRT-LLM version"):
        release(version)


# ---- per-request draft length: a reference-engine feature ------------------------------------------
@pytest.mark.parametrize("version", PINS)
def test_per_request_k_is_refused_on_every_release(version):
    from dynspec.runtime.engines.trtllm import check_draft_granularity

    check_draft_granularity("batch", version)
    with pytest.raises(DynspecError, match=rf"per-request draft length is a reference-engine feature: "
                                           rf"TRT-LLM {version} .* one K per iteration"):
        check_draft_granularity("request", version)
    with pytest.raises(DynspecError, match="granularity 'row' is not one of"):
        check_draft_granularity("row", version)


def test_start_refuses_per_request_before_importing_tensorrt_llm(monkeypatch):
    from dynspec.runtime.engines.trtllm import TrtllmEngine

    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)      # an import would fail with another message
    with pytest.raises(DynspecError, match="per-request draft length is a reference-engine feature"):
        TrtllmEngine.start(render("1.4.0"), SimpleNamespace(trtllm_version="1.4.0", policy="schedule"), granularity="request")
    with pytest.raises(DynspecError, match="needs TensorRT-LLM"):
        TrtllmEngine.start(render("1.4.0"), SimpleNamespace(trtllm_version="1.4.0", policy="schedule"))


@pytest.mark.parametrize("version", ["1.3.0", "1.4.0"])
def test_draft_lengths_read_upper_bound_releases(version):
    from dynspec.runtime.engines.trtllm import draft_lengths

    lengths = draft_lengths(render(version), version)
    assert [lengths.k(b) for b in (1, 4, 5, 8, 9)] == [4, 4, 2, 2, 0] and lengths.max_draft_len == 4


@pytest.mark.parametrize("version", PINS)
def test_no_release_gets_the_drafter_keep_alive_keys_and_k0_is_warned(version):
    """keep_drafter_warm / min_runtime_draft_len exist only in open PR 16888 (runtime/engines/trtllm_release.py):
    no pin renders them, and a schedule that reaches K=0 is warned with the --min-draft-len 1 floor."""
    from dynspec.build.trap import trap_warning
    from dynspec.runtime.engines.trtllm_release import DRAFTER_KEEP_ALIVE_KEYS

    opts = render(version)
    flat = json.dumps(opts)
    assert not any(k in flat for k in DRAFTER_KEEP_ALIVE_KEYS)
    w = trap_warning(version, DraftSchedule.parse("4:4,8:2"), 64)
    assert "from batch size 9" in w and "--min-draft-len 1" in w
