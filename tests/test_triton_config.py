"""`dynspec triton`: generated model repositories, checked against Triton's own ModelConfig
protobuf (tritonclient) and, for the TRT-LLM variant, against TRT-LLM 1.2.1's LLM-API field
names and its draft_len_schedule lookup rule written out independently here.

The trtllm-llmapi repository is validated here, not run: there is no GPU or TensorRT-LLM on
these machines. The launch script is syntax-checked and run in its DRY_RUN mode.
"""
import bisect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from dynspec.cli import main
from dynspec.config import EngineConfig, ReferenceSettings
from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule
from dynspec.triton_repo.fill import Template, fill_tree, pbtxt_string
from dynspec.triton_repo.generate import REPO_MANIFEST, generate_repo
from dynspec.triton_repo.request_acceptance import ACCEPTANCE_OUTPUTS
from dynspec.triton_repo.request_parsing import INPUT_NAMES

FIELDS = json.loads((Path(__file__).parent / "fixtures" / "trtllm_1_2_1_llm_args.json").read_text())


def fake_pair(root: Path) -> tuple[Path, Path]:
    """Generation reads only engine.json and checks the checkpoints' config.json exist."""
    for name in ("target", "draft"):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps({"vocab_size": 128}))
    return root / "target", root / "draft"


def engine_dir(root: Path, schedule="4:4", version="1.2.1", tp=8, write_options=True, **kw) -> Path:
    target, draft = fake_pair(root)
    out = root / "engine"
    cfg = EngineConfig(target_dir="../target", draft_dir="../draft", schedule=DraftSchedule.parse(schedule),
                       tp=tp, trtllm_version=version, max_batch_size=64, max_seq_len=2048,
                       reference=ReferenceSettings(max_batch_size=16, max_seq_len=256), **kw)
    cfg.write(out)
    if write_options:     # what `dynspec build` writes beside engine.json
        from dynspec.build.llm_api import LlmApiSettings, render_options, to_yaml

        opts = render_options(str(target), str(draft), cfg.schedule, (1, 2, 3),
                              LlmApiSettings(tp, version, 64, 2048, 0.9))
        (out / cfg.llm_api_options).write_text(to_yaml(opts))
    return out


def model_config(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def tensors(entries) -> dict:
    """name -> (data type, dims, optional); outputs have no `optional` field."""
    return {t.name: (mc.DataType.Name(t.data_type), list(t.dims), getattr(t, "optional", False)) for t in entries}


# ---- the filler ---------------------------------------------------------------------------------
def test_fill_substitutes_and_escapes_dollar():
    t = Template.parse("x.sh", 'A=${a}; echo "$${HOME}" $$1 ${b}')
    assert t.params == {"a", "b"}
    assert t.fill({"a": "1", "b": "two"}) == 'A=1; echo "${HOME}" $1 two'


def test_fill_errors_name_file_and_parameter(tmp_path):
    with pytest.raises(DynspecError, match=r"x.sh: no value for parameter\(s\) \['b'\]"):
        Template.parse("x.sh", "${a} ${b}").fill({"a": "1"})
    with pytest.raises(DynspecError, match=r"x.sh:2: malformed placeholder '\$\{1:-mpi\}'"):
        Template.parse("x.sh", "ok\nMODE=${1:-mpi}\n")
    with pytest.raises(DynspecError, match="must be a formatted str, not int"):
        Template.parse("x", "${a}").fill({"a": 1})
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "f.txt").write_text("${a}")
    with pytest.raises(DynspecError, match=r"unknown parameter\(s\) \['typo'\]"):
        fill_tree(tmp_path / "t", {"a": "1", "typo": "2"}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_pbtxt_string_round_trips_through_protobuf():
    value = 'dir with "quotes" and \\ backslash/ünï'
    cfg = text_format.Parse(f'parameters: {{ key: "p" value: {{ string_value: "{pbtxt_string(value)}" }} }}',
                            mc.ModelConfig())
    assert cfg.parameters["p"].string_value == value
    with pytest.raises(DynspecError, match="control characters"):
        pbtxt_string("a\nb")


# ---- reference variant --------------------------------------------------------------------------
# Optional inputs of tensorrtllm_backend's text-level model that a greedy decoder can take or refuse,
# copied by hand from TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt
# (commit 2a9abd95): name -> (data_type, dims). Left out: embeddings, LoRA, guided decoding, encoder
# inputs and return_perf_metrics-style counters; Triton itself refuses them as unexpected inputs.
ENSEMBLE_OPTIONAL = {
    "bad_words": ("TYPE_STRING", [-1]), "stop_words": ("TYPE_STRING", [-1]),
    "exclude_input_in_output": ("TYPE_BOOL", [1]), "pad_id": ("TYPE_INT32", [1]),
    "top_k": ("TYPE_INT32", [1]), "top_p": ("TYPE_FP32", [1]), "temperature": ("TYPE_FP32", [1]),
    "length_penalty": ("TYPE_FP32", [1]), "repetition_penalty": ("TYPE_FP32", [1]),
    "min_tokens": ("TYPE_INT32", [1]), "presence_penalty": ("TYPE_FP32", [1]),
    "frequency_penalty": ("TYPE_FP32", [1]), "seed": ("TYPE_UINT64", [1]),
    "return_log_probs": ("TYPE_BOOL", [1]), "return_context_logits": ("TYPE_BOOL", [1]),
    "return_generation_logits": ("TYPE_BOOL", [1]), "beam_width": ("TYPE_INT32", [1]),
    "num_return_sequences": ("TYPE_INT32", [1]),
}


def test_reference_config_parses_into_triton_model_config(tmp_path):
    eng = engine_dir(tmp_path)
    repo = generate_repo(eng, tmp_path / "repo", "reference")
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == [
        "dynspec/1/model.py", "dynspec/config.pbtxt", REPO_MANIFEST]
    cfg = model_config(repo / "dynspec" / "config.pbtxt")
    assert cfg.name == "dynspec" and cfg.backend == "python" and cfg.max_batch_size == 0
    assert cfg.model_transaction_policy.decoupled is True
    assert tensors(cfg.input) == {
        "text_input": ("TYPE_STRING", [1], True),
        "input_ids": ("TYPE_INT32", [-1], True),
        "max_tokens": ("TYPE_INT32", [1], False),
        "stream": ("TYPE_BOOL", [1], True),
        "end_id": ("TYPE_INT32", [1], True),
        **{name: (dtype, dims, True) for name, (dtype, dims) in ENSEMBLE_OPTIONAL.items()},
        "min_length": ("TYPE_INT32", [1], True),       # the ensemble's older name of min_tokens
        "random_seed": ("TYPE_UINT64", [1], True),     # the ensemble's older name of seed
    }
    assert set(tensors(cfg.input)) == set(INPUT_NAMES)
    assert tensors(cfg.output) == {"text_output": ("TYPE_STRING", [1], False),
                                   "output_ids": ("TYPE_INT32", [-1], False),
                                   "accepted_drafts": ("TYPE_INT32", [1], False),
                                   "drafted": ("TYPE_INT32", [1], False),
                                   "decode_steps": ("TYPE_INT32", [1], False),
                                   "mean_k": ("TYPE_FP32", [1], False)}
    assert [t.name for t in cfg.output][2:] == list(ACCEPTANCE_OUTPUTS)     # what model.py fills
    assert [(g.count, mc.ModelInstanceGroup.Kind.Name(g.kind)) for g in cfg.instance_group] == [(1, "KIND_CPU")]
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params["engine_dir"] == str(eng.resolve()) and params["device"] == "cpu"
    assert params["monitor_interval_ms"] == "50"
    assert any(Path(p, "dynspec").exists() or any(Path(p).glob("__editable__*dynspec*"))
               for p in params["python_site_packages"].split(os.pathsep))
    manifest = json.loads((repo / REPO_MANIFEST).read_text())
    assert manifest["variant"] == "reference" and manifest["engine_dir"] == str(eng.resolve())
    compile(repo.joinpath("dynspec/1/model.py").read_text(), "model.py", "exec")


def test_reference_engine_dir_with_awkward_path(tmp_path):
    eng = engine_dir(tmp_path / 'odd "name" dir')
    cfg = model_config(generate_repo(eng, tmp_path / "repo", device="cuda:1") / "dynspec" / "config.pbtxt")
    assert cfg.parameters["engine_dir"].string_value == str(eng.resolve())
    assert cfg.parameters["device"].string_value == "cuda:1"


# ---- trtllm-llmapi variant ----------------------------------------------------------------------
def lookup_lower(schedule: dict, b: int) -> int:
    """TRT-LLM 1.2.x: largest key <= b (bisect_right), written independently of dynspec."""
    keys = sorted(schedule)
    return schedule[keys[bisect.bisect_right(keys, b) - 1]]


def lookup_upper(schedule: dict, b: int) -> int:
    """TRT-LLM >= 1.3: smallest key >= b; above the largest key K = 0."""
    keys = sorted(schedule)
    i = bisect.bisect_left(keys, b)
    return schedule[keys[i]] if i < len(keys) else 0


def check_llm_args(args: dict, version: str) -> None:
    """Every key is a field of TRT-LLM 1.2.1's strict LLM-API models (unknown keys are rejected)."""
    models = FIELDS["models"]
    assert set(args) <= set(models["TorchLlmArgs"]), set(args) - set(models["TorchLlmArgs"])
    spec = args["speculative_config"]
    allowed = set(models["Eagle3DecodingConfig"]) | set(FIELDS["aliases"]["Eagle3DecodingConfig"])
    assert set(spec) <= allowed, set(spec) - allowed
    assert set(args.get("cuda_graph_config", {})) <= set(models["CudaGraphConfig"])
    assert args["backend"] == "pytorch" and spec["decoding_type"] == "Eagle3"


@pytest.mark.parametrize("version,schedule", [("1.2.1", "4:4"), ("1.2.1", "4:4,8:2,32:1"), ("1.3.0", "4:4,16:2")])
def test_llmapi_repo_from_engine_json(tmp_path, version, schedule):
    eng = engine_dir(tmp_path, schedule=schedule, version=version)
    repo = generate_repo(eng, tmp_path / "repo", "trtllm-llmapi")
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == [
        REPO_MANIFEST, "launch_triton.sh", "tensorrt_llm/1/model.yaml", "tensorrt_llm/config.pbtxt"]
    cfg = model_config(repo / "tensorrt_llm" / "config.pbtxt")
    doc = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    triton = doc.pop("triton_config")
    assert cfg.name == "tensorrt_llm" and cfg.backend == "python"
    assert cfg.model_transaction_policy.decoupled is True and triton["decoupled"] is True
    assert cfg.max_batch_size == triton["max_batch_size"] == 0
    ins, outs = tensors(cfg.input), tensors(cfg.output)
    assert ins["text_input"] == ("TYPE_STRING", [-1], False)
    assert ins["streaming"] == ("TYPE_BOOL", [1], True)
    assert ins["sampling_param_max_tokens"] == ("TYPE_INT32", [1], True)
    assert all(opt for name, (_, _, opt) in ins.items() if name != "text_input")
    assert outs["text_output"][0] == "TYPE_STRING"
    assert {"total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate"} <= set(outs)

    check_llm_args(doc, version)
    target, draft = (str((tmp_path / n).resolve()) for n in ("target", "draft"))
    assert doc["model"] == target and doc["tensor_parallel_size"] == 8
    spec = doc["speculative_config"]
    assert spec["speculative_model_dir"] == draft and spec["max_draft_len"] == 4
    assert spec.get("eagle3_one_model", True) is (version != "1.2.1")   # true is TRT-LLM's default
    sched = DraftSchedule.parse(schedule)
    lookup = lookup_lower if version.startswith("1.2") else lookup_upper
    rendered = spec["draft_len_schedule"]
    assert all(isinstance(k, int) for k in rendered)
    for b in range(1, 80):
        assert lookup(rendered, b) == sched.draft_len(b), b
    assert set(rendered) - {65} <= set(doc["cuda_graph_config"]["batch_sizes"])


def test_llmapi_merges_llm_api_options(tmp_path):
    eng = engine_dir(tmp_path, schedule="4:4,8:2")
    (eng / "llm_api_options.yaml").write_text(yaml.safe_dump({
        "backend": "pytorch",
        "tensor_parallel_size": 8,
        "max_batch_size": 64,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.85},
        "cuda_graph_config": {"enable_padding": True, "batch_sizes": [1, 2, 4, 5, 8, 9, 16, 32, 64]},
        "speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model": "../draft",
                               "eagle3_one_model": False, "draft_len_schedule": {1: 4, 5: 2, 9: 0}},
    }))
    repo = generate_repo(eng, tmp_path / "repo", "trtllm-llmapi")
    doc = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    doc.pop("triton_config")
    check_llm_args(doc, "1.2.1")
    assert doc["model"] == str((tmp_path / "target").resolve())
    assert doc["speculative_config"]["speculative_model"] == str((tmp_path / "draft").resolve())
    assert "speculative_model_dir" not in doc["speculative_config"]
    assert doc["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85}
    assert doc["speculative_config"]["draft_len_schedule"] == {1: 4, 5: 2, 9: 0}


@pytest.mark.parametrize("options,match", [
    ({"tensor_parallel_size": 4}, r"'tensor_parallel_size' is 4 but engine.json's tp is 8"),
    ({"backend": "tensorrt"}, r"'backend' is 'tensorrt'"),
    ({"triton_config": {}}, r"'triton_config' is Triton's"),
    ({"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 4, "eagle3_one_model": False,
                             "draft_len_schedule": {1: 4, 9: 0}}},
     r"means schedule '8:4' under TRT-LLM 1.2.1, but engine.json's schedule is '4:4'"),
    ({"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 4, "draft_len_schedule": {1: 4, 5: 0}}},
     r"llm_api_options.yaml: .*eagle3_one_model is None, must be false"),
    ([1, 2], "must hold a YAML mapping"),
])
def test_llmapi_bad_options_are_named(tmp_path, options, match):
    eng = engine_dir(tmp_path)
    (eng / "llm_api_options.yaml").write_text(yaml.safe_dump(options))
    with pytest.raises(DynspecError, match=match):
        generate_repo(eng, tmp_path / "repo", "trtllm-llmapi")
    assert not (tmp_path / "repo").exists()


def test_llmapi_repo_from_dynspec_build(tmp_path):
    """The options file that `dynspec build` writes goes into model.yaml unchanged (plus triton_config)."""
    sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
    from tiny_checkpoints import make_eagle3, make_llama

    make_llama(tmp_path / "hf")
    make_eagle3(tmp_path / "eagle")
    assert main(["convert", "target", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "target"),
                 "--dtype", "float32"]) == 0
    assert main(["convert", "eagle3", "--draft", str(tmp_path / "eagle"), "--target", str(tmp_path / "target"),
                 "--out", str(tmp_path / "draft")]) == 0
    assert main(["build", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                 "--out", str(tmp_path / "engine"), "--schedule", "4:4,8:2", "--max-batch-size", "64"]) == 0
    assert main(["triton", "--engine-dir", str(tmp_path / "engine"), "--out", str(tmp_path / "repo"),
                 "--variant", "trtllm-llmapi"]) == 0
    options = yaml.safe_load((tmp_path / "engine" / "llm_api_options.yaml").read_text())
    doc = yaml.safe_load((tmp_path / "repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert doc.pop("triton_config") == {"max_batch_size": 0, "decoupled": True}
    assert doc == options
    check_llm_args(doc, "1.2.1")


def test_launch_script_is_valid_bash_and_dry_runs(tmp_path):
    repo = generate_repo(engine_dir(tmp_path, tp=8), tmp_path / "repo", "trtllm-llmapi")
    script = repo / "launch_triton.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True)
    env = {**os.environ, "DRY_RUN": "1", "GRPC_PORT": "9001"}
    run = lambda *a, **kw: subprocess.run([str(script), *a], capture_output=True, text=True, **kw)  # noqa: E731
    mpi = run(env=env)
    assert mpi.returncode == 0, mpi.stderr
    assert mpi.stdout.split() == ["mpirun", "-n", "8", "--allow-run-as-root", "trtllm-llmapi-launch", "tritonserver",
                                  f"--model-repository={repo.resolve()}", "--http-port=8000", "--grpc-port=9001",
                                  "--metrics-port=8002"]
    spawn = run("spawn", env=env)
    assert spawn.stdout.split()[:2] == ["tritonserver", f"--model-repository={repo.resolve()}"]
    assert run("nonsense", env=env).returncode == 2

    missing = run(env={**os.environ, "TRTLLM_LLMAPI_MODEL_SRC": ""})
    assert missing.returncode == 2 and "tensorrt_llm/1/model.py is missing" in missing.stderr
    src = tmp_path / "upstream"
    src.mkdir()
    for f in ("model.py", "helpers.py"):
        (src / f).write_text(f"# {f}\n")
    echo = run("spawn", env={**os.environ, "TRTLLM_LLMAPI_MODEL_SRC": str(src), "TRITONSERVER": "echo"})
    assert echo.returncode == 0 and echo.stdout.split()[0] == f"--model-repository={repo.resolve()}"
    assert (repo / "tensorrt_llm" / "1" / "helpers.py").read_text() == "# helpers.py\n"


# ---- errors and the CLI -------------------------------------------------------------------------
def test_missing_and_malformed_engine_dirs(tmp_path):
    with pytest.raises(DynspecError, match="engine dir .*nope does not exist"):
        generate_repo(tmp_path / "nope", tmp_path / "repo")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DynspecError, match=r"engine config .*empty/engine.json does not exist"):
        generate_repo(tmp_path / "empty", tmp_path / "repo")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "engine.json").write_text("{not json")
    with pytest.raises(DynspecError, match="is not valid JSON"):
        generate_repo(bad, tmp_path / "repo")
    (bad / "engine.json").write_text(json.dumps({"format": "other/1"}))
    with pytest.raises(DynspecError, match="field 'format' is 'other/1'"):
        generate_repo(bad, tmp_path / "repo")
    eng = engine_dir(tmp_path / "x")
    (tmp_path / "x" / "draft" / "config.json").unlink()
    with pytest.raises(DynspecError, match=r"field 'draft_dir' points to .*draft, which has no config.json"):
        generate_repo(eng, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_bad_arguments_and_force(tmp_path):
    eng = engine_dir(tmp_path)
    with pytest.raises(DynspecError, match="unknown Triton variant 'onnx'"):
        generate_repo(eng, tmp_path / "repo", "onnx")
    with pytest.raises(DynspecError, match="device 'gpu0' is not"):
        generate_repo(eng, tmp_path / "repo", device="gpu0")
    repo = generate_repo(eng, tmp_path / "repo")
    with pytest.raises(DynspecError, match="exists and is not empty; pass --force"):
        generate_repo(eng, repo, "trtllm-llmapi")
    generate_repo(eng, repo, "trtllm-llmapi", force=True)
    assert (repo / "tensorrt_llm").is_dir() and not (repo / "dynspec").exists()


def test_cli(tmp_path, capsys):
    eng = engine_dir(tmp_path)
    assert main(["triton", "--engine-dir", str(eng), "--out", str(tmp_path / "repo")]) == 0
    assert "python -m dynspec.triton_repo.server" in capsys.readouterr().out
    assert main(["triton", "--engine-dir", str(tmp_path / "missing"), "--out", str(tmp_path / "r2")]) == 2
    assert "dynspec triton: error: engine dir" in capsys.readouterr().err


@pytest.mark.parametrize("where,flag", [("engine", "--engine-dir"), ("engine/repo", "--engine-dir"),
                                        ("target", "engine.json target_dir"), ("draft/x", "engine.json draft_dir"),
                                        (".", "--engine-dir")])
def test_out_apart_from_the_engine_dir_and_its_checkpoints(tmp_path, where, flag):
    eng = engine_dir(tmp_path)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    with pytest.raises(DynspecError, match=f"--out .* {flag} "):
        generate_repo(eng, tmp_path / where, force=True)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
