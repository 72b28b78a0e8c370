"""config.json values that type-check but no model runs with: an eos_token_id that is not an
int (or list of ints) inside the vocabulary, rms_norm_eps, rope scaling factors and
max_position_embeddings outside their bounds (dynspec/checkpoint/config_fields.py). `dynspec
convert` refuses each with exit 2 and one line naming the file and the field, and writes nothing;
the reference engine's loader refuses the same configs. `dynspec generate` on a target with fewer
positions than its default cache length takes the target's limit."""
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_checkpoints import make_llama  # noqa: E402

from dynspec.checkpoint.config_fields import check_config  # noqa: E402
from dynspec.cli import main  # noqa: E402
from dynspec.errors import DynspecError  # noqa: E402
from dynspec.runtime.generate.session import tiny_pair_dirs  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return make_llama(tmp_path_factory.mktemp("bounds") / "hf", layers=2)


def copy_with(src: Path, dst: Path, file: str = "config.json", **changes) -> Path:
    shutil.copytree(src, dst)
    doc = json.loads((dst / file).read_text()) if (dst / file).exists() else {}
    doc.update(changes)
    (dst / file).write_text(json.dumps(doc))
    return dst


def one_line(capsys) -> str:
    lines = capsys.readouterr().err.strip("\n").splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("field, value, phrase", [
    ("eos_token_id", [1.5], "field 'eos_token_id' is [1.5]"),
    ("eos_token_id", 1.5, "field 'eos_token_id' is 1.5"),
    ("eos_token_id", 96, "field 'eos_token_id' is 96; expected an int or a list of ints in [0, 96)"),
    ("eos_token_id", [2, -1], "field 'eos_token_id' is [2, -1]"),
    ("eos_token_id", "2", "field 'eos_token_id' is '2'"),
    ("eos_token_id", [True], "field 'eos_token_id' is [True]"),
    ("rms_norm_eps", 1e308, "field 'rms_norm_eps' is 1e+308"),
    ("rms_norm_eps", 1e-30, "field 'rms_norm_eps' is 1e-30"),
    ("rope_scaling", {"rope_type": "linear", "factor": 1e308}, "field 'rope_scaling.factor' is 1e+308"),
    ("rope_scaling", {"rope_type": "linear", "factor": 0.5}, "field 'rope_scaling.factor' is 0.5"),
    ("rope_scaling", dict(LLAMA3, factor=4096.0), "field 'rope_scaling.factor' is 4096.0"),
    ("rope_scaling", dict(LLAMA3, high_freq_factor=1e9), "field 'rope_scaling.high_freq_factor' is 1000000000.0"),
    ("max_position_embeddings", 1, "field 'max_position_embeddings' is 1"),
    ("max_position_embeddings", 2**31, f"field 'max_position_embeddings' is {2**31}"),
])
def test_convert_refuses_a_value_out_of_bounds(hf, tmp_path, capsys, field, value, phrase):
    src = copy_with(hf, tmp_path / "hf", **{field: value})
    out = tmp_path / "out"
    assert main(["convert", "target", "--hf", str(src), "--out", str(out), "--tp", "1", "--dtype", "float32"]) == 2
    line = one_line(capsys)
    assert str(src / "config.json") in line and phrase in line, line
    assert not out.exists()


def test_convert_refuses_a_generation_config_eos_outside_the_vocab(hf, tmp_path, capsys):
    src = copy_with(hf, tmp_path / "hf", "generation_config.json", eos_token_id=[0, 500])
    assert main(["convert", "target", "--hf", str(src), "--out", str(tmp_path / "out"), "--tp", "1"]) == 2
    line = one_line(capsys)
    assert str(src / "generation_config.json") in line and "field 'eos_token_id' is [0, 500]" in line, line


@pytest.mark.parametrize("cfg", [
    {"vocab_size": 96, "eos_token_id": [1, 95]}, {"vocab_size": 96, "eos_token_id": None},
    {"eos_token_id": []}, {"rms_norm_eps": 1e-5}, {"rms_norm_eps": 1e-2}, {"rms_norm_eps": 1e-12},
    {"max_position_embeddings": 64}, {"max_position_embeddings": 10**9},
    {"rope_scaling": {"rope_type": "linear", "factor": 1}}, {"rope_scaling": dict(LLAMA3, factor=1024)},
    {"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3", **{k: v for k, v in LLAMA3.items()
                                                                      if k != "rope_type"}}},
])
def test_values_inside_the_bounds_pass(cfg):
    check_config(cfg, "config.json")


def test_rope_parameters_factor_is_bounded_too():
    params = {"rope_theta": 1e4, "rope_type": "linear", "factor": 1e308}
    with pytest.raises(DynspecError, match=r"c.json: field 'rope_parameters.factor' is 1e\+308"):
        check_config({"rope_parameters": params}, "c.json")


def test_the_reference_engine_refuses_the_same_eos(tmp_path, capsys):
    """generate reads config.json through the same checker: eos [1.5] is one line, not a run."""
    target, draft = tiny_pair_dirs()
    t = copy_with(Path(target), tmp_path / "target", eos_token_id=[1.5])
    assert main(["generate", "--target", str(t), "--draft", draft, "--num-prompts", "1",
                 "--max-new-tokens", "2"]) == 2
    line = one_line(capsys)
    assert str(t / "config.json") in line and "field 'eos_token_id' is [1.5]" in line, line


def test_generate_takes_the_targets_positions_when_below_its_default(tmp_path, capsys):
    """The default cache length (1024) is capped by max_position_embeddings 512, not refused."""
    target, draft = tiny_pair_dirs()
    t = copy_with(Path(target), tmp_path / "target", max_position_embeddings=512)
    assert main(["generate", "--target", str(t), "--draft", draft, "--num-prompts", "2",
                 "--max-new-tokens", "4", "--concurrency", "2"]) == 0
    capsys.readouterr()
    assert main(["generate", "--target", str(t), "--draft", draft, "--num-prompts", "1",
                 "--max-new-tokens", "2", "--max-seq-len", "1024"]) == 2
    assert "max_seq_len 1024" in one_line(capsys)
