"""Contract with TensorRT-LLM 1.2.1, which cannot be installed here.

1. Every key `dynspec build` writes into llm_api_options.yaml is a field (or an accepted alias)
   of TRT-LLM 1.2.1's TorchLlmArgs / KvCacheConfig / CudaGraphConfig / Eagle3DecodingConfig.
   The field names are facts recorded from TRT-LLM's source into
   tests/fixtures/trtllm_1_2_1_llm_args.json (version, file and revision noted there).
2. The rendered draft_len_schedule passes 1.2.1's validation rules and, looked up the way
   1.2.1's drafter looks it up, gives the K the dynspec policy gives for every batch size.
   Both are written out below, independently of dynspec's own code.
"""
import bisect
import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_checkpoints import make_eagle3, make_llama  # noqa: E402

from dynspec.build.llm_api import LlmApiSettings, render_options  # noqa: E402
from dynspec.cli import main  # noqa: E402
from dynspec.runtime.policy import DraftSchedule  # noqa: E402

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "trtllm_1_2_1_llm_args.json").read_text())
FIELDS = {name: set(fields) for name, fields in FIXTURE["models"].items()}
ALIASES = FIXTURE["aliases"]


# ---- TRT-LLM 1.2.1's rules, written out (DecodingBaseConfig.validate_draft_len_schedule_and_sort,
# ---- Drafter.get_draft_len_for_batch_size, BaseCudaGraphConfig validator, TorchLlmArgs) ------------
def trtllm_121_validate(options: dict) -> None:
    sc = options["speculative_config"]
    sched, kmax = sc.get("draft_len_schedule"), sc["max_draft_len"]
    assert sc["decoding_type"] in FIXTURE["literals"]["Eagle3DecodingConfig.decoding_type"]
    assert options["backend"] in FIXTURE["literals"]["TorchLlmArgs.backend"]
    assert isinstance(kmax, int) and kmax > 0                       # "max_draft_len must be > 0 for Eagle"
    draft_keys = [k for k in ("speculative_model", "speculative_model_dir") if k in sc]
    assert len(draft_keys) == 1, draft_keys            # both: extra_forbidden on speculative_model_dir
    assert sc[draft_keys[0]]                           # "Draft model must be provided for EAGLE"
    if sched is not None:
        for b, k in sched.items():
            assert isinstance(b, int) and b >= 1, f"batch size threshold must be >= 1, got {b}"
            assert isinstance(k, int) and k >= 0, f"draft length must be >= 0, got {k}"
            assert k <= kmax, f"all draft lengths must be <= max_draft_len, got {k}"
        assert 1 in sched, "draft_len_schedule must include batch_size=1"
        assert sched[1] == kmax, "draft_len_schedule[1] must equal max_draft_len"
        # only PyExecutor's drafter (two-model) reads the schedule in 1.2.x
        assert sc.get("eagle3_one_model", True) is False
    cg = options.get("cuda_graph_config") or {}
    if cg.get("batch_sizes") and cg.get("max_batch_size", 0) != 0:
        assert cg["max_batch_size"] == max(cg["batch_sizes"])
    layers = sc.get("eagle3_layers_to_capture")
    if layers is not None:
        assert len(set(layers)) == len(layers)                      # it is a Set[int] in TRT-LLM


def trtllm_121_draft_len(sched: dict, batch_size: int) -> int:
    """Drafter.get_draft_len_for_batch_size: the largest threshold <= batch size (bisect_right)."""
    thresholds = sorted(sched)
    idx = bisect.bisect_right(thresholds, batch_size)
    return 0 if idx == 0 else sched[thresholds[idx - 1]]


def unknown_keys(options: dict) -> list[str]:
    bad = [k for k in options if k not in FIELDS["TorchLlmArgs"]]
    for key, model in FIXTURE["nested"].items():
        sub = options.get(key.split(".", 1)[1]) or {}
        accepted = FIELDS[model] | set(ALIASES.get(model, {}))
        bad += [f"{key}.{k}" for k in sub if k not in accepted]
    return bad


# ---- the real `dynspec build` output ------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    make_llama(root / "hf")
    make_eagle3(root / "eagle")
    assert main(["convert", "target", "--hf", str(root / "hf"), "--out", str(root / "target")]) == 0
    assert main(["convert", "eagle3", "--draft", str(root / "eagle"), "--target", str(root / "target"),
                 "--out", str(root / "draft")]) == 0
    engines = {}
    for name, flags in {
        "threshold": ["--threshold", "5", "--max-draft-len", "4"],
        "tiers": ["--schedule", "4:4,8:2,32:1", "--max-batch-size", "64"],
        "floored": ["--schedule", "4:3,16:2", "--min-draft-len", "1", "--max-batch-size", "128"],
    }.items():
        out = root / name
        assert main(["build", "--target", str(root / "target"), "--draft", str(root / "draft"),
                     "--out", str(out), "--trtllm-version", "1.2.1", *flags]) == 0
        engines[name] = out
    return engines


@pytest.mark.parametrize("name", ["threshold", "tiers", "floored"])
def test_every_written_key_exists_in_trtllm_121(built, name):
    options = yaml.safe_load((built[name] / "llm_api_options.yaml").read_text())
    assert unknown_keys(options) == []
    trtllm_121_validate(options)


@pytest.mark.parametrize("name", ["threshold", "tiers", "floored"])
def test_rendered_schedule_matches_policy_under_121_lookup(built, name):
    options = yaml.safe_load((built[name] / "llm_api_options.yaml").read_text())
    engine = json.loads((built[name] / "engine.json").read_text())
    policy = DraftSchedule(tuple(tuple(t) for t in engine["schedule"]["tiers"]))
    sched = options["speculative_config"]["draft_len_schedule"]
    assert {str(k): v for k, v in sched.items()} == engine["trtllm_draft_len_schedule"]
    for b in range(1, 2 * options["max_batch_size"] + 1):
        assert trtllm_121_draft_len(sched, b) == policy.draft_len(b), b
    # every batch size where K changes has a CUDA graph
    graphs = set(options["cuda_graph_config"]["batch_sizes"])
    assert {k for k in sched if k <= options["max_batch_size"]} <= graphs
    # max_num_tokens holds a full decode batch at the static draft length (1.2.x pads drafts)
    kmax = options["speculative_config"]["max_draft_len"]
    assert options["max_num_tokens"] >= max(b * (1 + (kmax if policy.draft_len(b) else 0))
                                            for b in range(1, options["max_batch_size"] + 1))


def test_fixture_records_its_source():
    assert FIXTURE["trtllm_version"] == "1.2.1"
    src = FIXTURE["source"]
    assert src["repository"] == "NVIDIA/TensorRT-LLM" and src["file"] == "tensorrt_llm/llmapi/llm_args.py"
    assert src["revision"]


def accepted_draft_keys(revision: str, spec: dict) -> bool:
    """DecodingBaseConfig's draft field under extra='forbid', as the fixture records it per revision:
    exactly one of the revision's accepted names may appear."""
    names = set(FIXTURE["draft_model_key"][revision]["accepted"])
    given = {k for k in spec if k in ("speculative_model", "speculative_model_dir")}
    return len(given) == 1 and given <= names


@pytest.mark.parametrize("version", ["1.2.1", "1.3.0rc5"])
def test_draft_key_is_valid_with_and_without_pr_10099(version):
    """No 1.2.1 copy with a commit was available: the draft key must pass both 1.2-era shapes."""
    s = DraftSchedule(((4, 4), (8, 2)))
    spec = render_options("/t", "/d", s, [1, 3, 4], LlmApiSettings(8, version, 16, 512, 0.9))["speculative_config"]
    assert accepted_draft_keys("before_pr_10099", spec) and accepted_draft_keys("with_pr_10099", spec)
    assert spec["speculative_model_dir"] == "/d"


def test_draft_key_check_is_not_vacuous():
    assert not accepted_draft_keys("before_pr_10099", {"speculative_model": "/d"})
    assert accepted_draft_keys("with_pr_10099", {"speculative_model": "/d"})
    assert not accepted_draft_keys("with_pr_10099", {"speculative_model": "/d", "speculative_model_dir": "/d"})


def test_unknown_key_would_be_caught():
    """The check above is not vacuous: a key TRT-LLM does not know is reported."""
    s = DraftSchedule(((4, 4),))
    options = render_options("/t", "/d", s, [1, 3, 4], LlmApiSettings(8, "1.2.1", 16, 512, 0.9))
    options["speculative_config"]["num_speculative_tokens"] = 4          # a vLLM name
    options["kv_cache_config"]["gpu_memory_utilization"] = 0.9            # a vLLM name
    options["num_speculative_tokens"] = 4
    assert sorted(unknown_keys(options)) == ["TorchLlmArgs.kv_cache_config.gpu_memory_utilization",
                                             "TorchLlmArgs.speculative_config.num_speculative_tokens",
                                             "num_speculative_tokens"]


@pytest.mark.parametrize("spec, max_bs", [("1:1", 8), ("5:4", 256), ("4:4,8:2,32:1", 256), ("2:6,3:5,4:4,100:1", 64),
                                          ("300:2", 256)])
def test_schedules_render_valid_for_121(spec, max_bs):
    s = DraftSchedule.parse(spec)
    options = render_options("/t", "/d", s, [1, 3, 4], LlmApiSettings(8, "1.2.1", max_bs, 4096, 0.9))
    assert unknown_keys(options) == []
    trtllm_121_validate(options)
    sched = options["speculative_config"]["draft_len_schedule"]
    assert all(trtllm_121_draft_len(sched, b) == s.draft_len(b) for b in range(1, max_bs + 1))


# ---- bounds: refused before anything is written ------------------------------------------------
def _options(sched, **spec):
    return {"backend": "pytorch", "max_batch_size": 8, "cuda_graph_config": {"batch_sizes": [1, 2, 4, 8]},
            "speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 4, "eagle3_one_model": False,
                                   "speculative_model_dir": "/d", "draft_len_schedule": sched, **spec}}


@pytest.mark.parametrize("sched,spec,needle", [
    ({1: 1000000, 2: 0}, {"max_draft_len": 1000000}, "max_draft_len is 1000000; expected an integer in 1..32"),
    ({1: 4, 2: 0}, {"max_draft_len": True}, "max_draft_len is True"),
    ({1: 4, 2**31: 0}, {}, "key 2147483648 is not a batch size in 1..2147483647"),
    ({1: 4, 2: False}, {}, "value False at key 2"),
])
def test_validate_bounds_name_the_value(sched, spec, needle):
    from dynspec.build.validate import validate_options
    from dynspec.errors import DynspecError

    with pytest.raises(DynspecError, match=needle.replace("[", r"\[")):
        validate_options(_options(sched, **spec), "1.2.1")
    validate_options(_options({1: 4, 2: 0}), "1.2.1")        # the same options with sane values pass


def test_build_refuses_an_unbounded_k_in_one_line(tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "dynspec.cli", "build", "--target", str(tmp_path / "t"),
                           "--draft", str(tmp_path / "d"), "--out", str(tmp_path / "e"), "--schedule", "4:1000000"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and not (tmp_path / "e").exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "K=1000000 exceeds the limit 32" in lines[0], proc.stderr
