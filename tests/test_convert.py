"""`dynspec convert target|eagle3` on tiny checkpoints made here: transformers-saved Llama
targets (sharded and not, tied and untied, GQA) and public-format EAGLE-3 drafts. Outputs are
loaded back with transformers and compared; every bad input must fail with a message naming
the file/field/value, and leave no output folder behind."""
import datetime
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_checkpoints import eagle3_config, eagle3_state_dict, make_eagle3, make_llama, write_eagle3  # noqa: E402

from dynspec.checkpoint.shapes import ModelShape  # noqa: E402
from dynspec.checkpoint.tp_checks import tp_report  # noqa: E402
from dynspec.cli import main  # noqa: E402
from dynspec.errors import DynspecError  # noqa: E402


def convert_target(hf, out, *extra):
    return main(["convert", "target", "--hf", str(hf), "--out", str(out), *extra])


def logits(folder, ids):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        return m(torch.tensor([ids])).logits


def no_leftovers(parent: Path):
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """Unsharded, untied, GQA (8 heads, 4 KV heads), converted at tp 8 in float32."""
    root = tmp_path_factory.mktemp("target")
    hf = make_llama(root / "hf")
    assert convert_target(hf, root / "out", "--dtype", "float32") == 0
    return hf, root / "out"


# ---- target --------------------------------------------------------------------------------
def test_target_unsharded_untied_gqa(target):
    hf, out = target
    files = sorted(p.name for p in out.iterdir())
    assert files == ["config.json", "dynspec.json", "generation_config.json", "model.safetensors",
                     "model.safetensors.index.json", "tokenizer_config.json"]
    m = json.loads((out / "dynspec.json").read_text())
    from transformers import AutoModelForCausalLM

    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(str(hf)).parameters())
    assert m["parameter_count"] == n
    assert m["kind"] == "target" and m["architecture"] == "LlamaForCausalLM" and m["tp"] == 8
    # per rank at tp 8, float32: 8 layers x (q 64*8 + k,v 2*(64*8) [4 KV heads -> 1 per rank] + o 8*64
    #   + mlp 3*(64*16) + norms 2*64) + embed, lm_head 2*(96/8 * 64) + final norm 64
    per_layer = 64 * 8 + 2 * 64 * 8 + 8 * 64 + 3 * 64 * 16 + 2 * 64
    assert m["weight_bytes_per_rank"] == (8 * per_layer + 2 * 12 * 64 + 64) * 4
    assert m["kv_bytes_per_token_per_rank"] == 2 * 8 * 1 * 8 * 4      # K,V x layers x 1 head x head_dim x fp32
    assert m["kv_replication"] == 2
    assert {c["name"] for c in m["checks"]} == {"num_attention_heads", "num_key_value_heads",
                                                "intermediate_size", "vocab_size"}
    assert "replicated on 2 ranks" in next(c["detail"] for c in m["checks"] if c["name"] == "num_key_value_heads")
    ids = [1, 5, 9, 33, 2]
    assert torch.equal(logits(hf, ids), logits(out, ids))


def test_target_sharded_tied_bf16(tmp_path):
    hf = make_llama(tmp_path / "hf", tied=True, layers=6, max_shard_size="60KB", seed=1)
    assert (hf / "model.safetensors.index.json").is_file() and len(list(hf.glob("*.safetensors"))) > 3
    out = tmp_path / "out"
    assert convert_target(hf, out, "--max-shard-bytes", "40000") == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0].endswith(f"-of-{len(shards):05d}.safetensors")
    assert "lm_head.weight" not in index["weight_map"]                    # tied: the embedding serves both
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == cfg["torch_dtype"] == "bfloat16" and cfg["tie_word_embeddings"] is True
    m = json.loads((out / "dynspec.json").read_text())
    assert m["files"]["weights"] == shards
    ids = [3, 4, 5]
    ref = logits(hf, ids)
    assert (logits(out, ids) - ref).abs().max() < 0.05 * ref.abs().max()  # bf16 round trip


def test_infeasible_tp_names_the_heads(tmp_path, capsys):
    hf = make_llama(tmp_path / "hf", hidden=48, heads=12, kv_heads=12, layers=2)
    assert convert_target(hf, tmp_path / "out", "--tp", "8") == 2
    err = capsys.readouterr().err
    assert "num_attention_heads=12 is not divisible by tp=8" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("shape, tp, ok, phrase", [
    (dict(heads=64, kv_heads=8), 8, True, "num_key_value_heads=8 splits 1 per rank"),
    (dict(heads=64, kv_heads=4), 8, True, "replicated on 2 ranks"),
    (dict(heads=64, kv_heads=3), 8, False, "num_key_value_heads=3 < tp=8"),
    (dict(heads=64, kv_heads=12), 8, False, "num_key_value_heads=12 is not divisible by tp=8 (12 % 8 = 4)"),
    (dict(intermediate=1000), 16, False, "intermediate_size=1000 is not divisible by tp=16 (1000 % 16 = 8)"),
    (dict(vocab=32001), 8, True, "vocab_size=32001 is padded to 32008 (+7 rows)"),
])
def test_tp_checks_name_the_number(shape, tp, ok, phrase):
    base = dict(layers=2, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672, vocab=128256)
    report = tp_report(ModelShape(**{**base, **shape}), tp)
    assert (not report.failures) == ok
    assert any(phrase in c.detail for c in report.checks), [c.detail for c in report.checks]


def test_missing_shard_is_named(tmp_path, capsys):
    hf = make_llama(tmp_path / "hf", layers=4, max_shard_size="60KB")
    victim = sorted(hf.glob("model-*.safetensors"))[1]
    victim.unlink()
    assert convert_target(hf, tmp_path / "out") == 2
    assert f"missing shard {victim.name}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_shape_mismatch_is_named(tmp_path, capsys):
    hf = make_llama(tmp_path / "hf", layers=2)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["intermediate_size"] = 256
    (hf / "config.json").write_text(json.dumps(cfg))
    assert convert_target(hf, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "shape mismatch: tensor 'model.layers.0.mlp." in err and "config.json implies [" in err and "256" in err
    assert not (tmp_path / "out").exists() and not no_leftovers(tmp_path)


def test_dtype_mismatch_is_named(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    hf = make_llama(tmp_path / "hf", layers=2)
    sd = load_file(str(hf / "model.safetensors"))
    sd["model.norm.weight"] = torch.ones(64, dtype=torch.int32)
    save_file(sd, str(hf / "model.safetensors"), metadata={"format": "pt"})
    assert convert_target(hf, tmp_path / "out") == 2
    assert "dtype mismatch: tensor 'model.norm.weight' in model.safetensors is torch.int32" in capsys.readouterr().err


def test_missing_layer_is_named(tmp_path, capsys):
    hf = make_llama(tmp_path / "hf", layers=2)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (hf / "config.json").write_text(json.dumps(cfg))
    assert convert_target(hf, tmp_path / "out") == 2
    assert "missing tensor 'model.layers.2." in capsys.readouterr().err


def test_nonempty_out_needs_force(target, tmp_path, capsys):
    hf, _ = target
    out = tmp_path / "out"
    assert convert_target(hf, out) == 0
    (out / "keep.txt").write_text("x")
    assert convert_target(hf, out) == 2
    assert "--force" in capsys.readouterr().err and (out / "keep.txt").exists()
    assert convert_target(hf, out, "--force") == 0                      # an earlier convert target's output
    assert not (out / "keep.txt").exists() and (out / "dynspec.json").is_file()


def test_failure_midway_leaves_nothing(target, tmp_path, monkeypatch, capsys):
    hf, _ = target
    from dynspec.checkpoint import writer

    calls = {"n": 0}
    real_add = writer.ShardWriter.add

    def failing_add(self, name, tensor):
        calls["n"] += 1
        if calls["n"] == 20:
            raise OSError("disk full (injected)")
        return real_add(self, name, tensor)

    monkeypatch.setattr(writer.ShardWriter, "add", failing_add)
    assert convert_target(hf, tmp_path / "out", "--max-shard-bytes", "30000") == 2
    assert "disk full (injected)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert not no_leftovers(tmp_path)


def test_fp8_without_modelopt_is_a_clear_error(target, tmp_path, capsys):
    pytest.importorskip("transformers")
    try:
        import modelopt  # noqa: F401
        pytest.skip("ModelOpt is importable here")
    except ImportError:
        pass
    hf, _ = target
    assert convert_target(hf, tmp_path / "out", "--quant", "fp8") == 2
    assert "NVIDIA ModelOpt" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_unsupported_model_type(tmp_path, capsys):
    hf = make_llama(tmp_path / "hf", layers=2)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (hf / "config.json").write_text(json.dumps(cfg))
    assert convert_target(hf, tmp_path / "out") == 2
    assert "field 'model_type' is 'gpt2'" in capsys.readouterr().err


# ---- EAGLE-3 draft ---------------------------------------------------------------------------
def convert_draft(draft, target_out, out, *extra):
    return main(["convert", "eagle3", "--draft", str(draft), "--target", str(target_out), "--out", str(out), *extra])


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_eagle3_public_format(target, tmp_path, fmt):
    _, tgt = target
    draft = make_eagle3(tmp_path / "eagle", fmt=fmt)
    out = tmp_path / "draft"
    assert convert_draft(draft, tgt, out) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 48
    assert cfg["target_hidden_size"] == 64 and cfg["num_hidden_layers"] == 1 and cfg["dtype"] == "float32"
    from safetensors.torch import load_file

    got = load_file(str(out / "model.safetensors"))
    src = eagle3_state_dict()
    assert set(got) == set(src)
    for k, v in src.items():
        assert torch.equal(got[k], v), k
    m = json.loads((out / "dynspec.json").read_text())
    assert m["capture_layers"] == [1, 3, 4]                                # (1, 8//2-1, 8-4)
    assert m["shares_target_embedding"] is True and m["target"]["layers"] == 8
    # per rank, fp32: attn 2*64*(8 + 2*8) + 8*64, mlp 3*64*16, 4 norms, fc 3*64*64 replicated,
    # lm_head (48/8)*64, d2t int32 48*4
    assert m["weight_bytes_per_rank"] == (2 * 64 * 24 + 8 * 64 + 3 * 64 * 16 + 4 * 64 + 3 * 64 * 64 + 6 * 64) * 4 + 48 * 4
    assert m["kv_bytes_per_token_per_rank"] == 2 * 1 * 1 * 8 * 4


@pytest.mark.parametrize("cfg_extra, source", [
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 4, 6]}}, "outputs of layers"),   # SGLang: as is
    ({"eagle_aux_hidden_state_layer_ids": [2, 5, 7]}, "vLLM"),                                  # inputs: minus 1
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 4, 6]},
      "eagle_aux_hidden_state_layer_ids": [2, 5, 7]}, "outputs of layers"),                     # both, agreeing
])
def test_eagle3_layers0_names_and_named_capture_layers(target, tmp_path, cfg_extra, source):
    _, tgt = target
    sd = {("model.layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
          for k, v in eagle3_state_dict().items()}
    draft = write_eagle3(tmp_path / "eagle", sd, eagle3_config(**cfg_extra), fmt="safetensors")
    assert convert_draft(draft, tgt, tmp_path / "draft") == 0
    m = json.loads((tmp_path / "draft" / "dynspec.json").read_text())
    assert m["capture_layers"] == [1, 4, 6] and source in m["capture_layers_source"]
    from safetensors.torch import load_file

    assert "midlayer.mlp.up_proj.weight" in load_file(str(tmp_path / "draft" / "model.safetensors"))


@pytest.mark.parametrize("case, phrase", [
    ("target_hidden", "target_hidden_size=32, but the target's hidden_size is 64"),
    ("vocab", "vocab_size=100 (the vocabulary behind d2t/t2d), but the target's vocab_size is 96"),
    ("heads", "num_attention_heads=4 is not divisible by tp=8"),
    ("capture_depth", "has ids [9] out of range for a target with 8 layers"),
    ("capture_conflict", "(vLLM: inputs of layers) disagree"),
    ("fc", "fuses 2 target layers"),
    ("d2t_range", "outside the target vocabulary 0..95"),
    ("t2d", "tensors 'd2t' and 't2d' disagree"),
    ("d2t_dtype", "tensor 'd2t' has dtype torch.float32"),
    ("arch", "field 'architectures' is ['LlamaForCausalLM']"),
])
def test_eagle3_incompatible_pairs(target, tmp_path, capsys, case, phrase):
    _, tgt = target
    sd, cfg = eagle3_state_dict(), eagle3_config()
    if case == "target_hidden":
        cfg["target_hidden_size"] = 32
    elif case == "vocab":
        cfg["vocab_size"] = 100
    elif case == "heads":
        sd, cfg = eagle3_state_dict(heads=4, kv_heads=4), eagle3_config(heads=4, kv_heads=4)
    elif case == "capture_depth":
        cfg["eagle_aux_hidden_state_layer_ids"] = [2, 5, 9]
    elif case == "capture_conflict":
        cfg["eagle_aux_hidden_state_layer_ids"] = [2, 5, 7]
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 5, 7]}
    elif case == "fc":
        sd = eagle3_state_dict(n_capture=2)
    elif case == "d2t_range":
        sd["d2t"] = sd["d2t"].clone()
        sd["d2t"][-1] += 500
    elif case == "d2t_dtype":
        sd["d2t"] = sd["d2t"].float()
    elif case == "t2d":
        sd["t2d"] = sd["t2d"].roll(1)
    elif case == "arch":
        cfg["architectures"] = ["LlamaForCausalLM"]
    draft = write_eagle3(tmp_path / "eagle", sd, cfg)
    assert convert_draft(draft, tgt, tmp_path / "draft") == 2
    assert phrase in capsys.readouterr().err
    assert not (tmp_path / "draft").exists()


def test_eagle3_bin_is_loaded_weights_only(target, tmp_path, capsys):
    _, tgt = target
    sd = eagle3_state_dict()
    sd["note"] = datetime.date(2024, 1, 1)        # not a tensor: weights_only refuses the global
    draft = write_eagle3(tmp_path / "eagle", sd, eagle3_config(), fmt="bin")
    assert convert_draft(draft, tgt, tmp_path / "draft") == 2
    assert "torch.load(weights_only=True)" in capsys.readouterr().err


def test_eagle3_needs_a_converted_target(target, tmp_path, capsys):
    hf, _ = target
    draft = make_eagle3(tmp_path / "eagle")
    assert convert_draft(draft, hf, tmp_path / "draft") == 2
    assert "convert it first with `dynspec convert target`" in capsys.readouterr().err


def test_capture_default_rejects_repeats():
    from dynspec.checkpoint.eagle3 import resolve_capture_layers

    with pytest.raises(DynspecError, match=r"default EAGLE-3 capture layers \(1, 2, 2\) do not fit"):
        resolve_capture_layers({}, "config.json", 6)
    assert resolve_capture_layers({}, "c", 80).layers == (1, 39, 76)


# ---- the shared reader's rules (dynspec.checkpoint) ------------------------------------------
def test_truncated_shard_is_one_line(tmp_path, capsys):
    hf = make_llama(tmp_path / "hf", layers=4, max_shard_size="60KB")
    victim = sorted(hf.glob("model-*.safetensors"))[1]
    victim.write_bytes(victim.read_bytes()[:-100])
    assert convert_target(hf, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(victim) in err and "truncated" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad, phrase", [
    (lambda t: t.to(torch.float8_e4m3fn), "is torch.float8_e4m3fn; source checkpoints must be bf16, fp16 or fp32"),
    (lambda t: t.index_put((torch.tensor([3]),), torch.tensor(float("nan"))), "holds 1 NaN/Inf value(s)"),
    (lambda t: t.index_put((torch.tensor([0]),), torch.tensor(float("-inf"))), "holds 1 NaN/Inf value(s)"),
])
def test_float8_and_nonfinite_tensors_are_refused(tmp_path, capsys, bad, phrase):
    from safetensors.torch import load_file, save_file

    hf = make_llama(tmp_path / "hf", layers=2)
    sd = load_file(str(hf / "model.safetensors"))
    sd["model.norm.weight"] = bad(sd["model.norm.weight"])
    save_file(sd, str(hf / "model.safetensors"), metadata={"format": "pt"})
    assert convert_target(hf, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"model.safetensors: tensor 'model.norm.weight' {phrase}" in err
    assert not (tmp_path / "out").exists()


def test_duplicate_tensor_across_shards_names_both(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    hf = make_llama(tmp_path / "hf", layers=2)
    sd = load_file(str(hf / "model.safetensors"))
    save_file({"model.norm.weight": torch.zeros_like(sd["model.norm.weight"])}, str(hf / "extra.safetensors"))
    assert convert_target(hf, tmp_path / "out") == 2                     # no index: both headers are read
    err = capsys.readouterr().err
    assert "'model.norm.weight' appears in both" in err and "extra.safetensors" in err and "model.safetensors" in err
    sharded = make_llama(tmp_path / "sharded", layers=4, max_shard_size="60KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    home = index["weight_map"]["model.norm.weight"]
    other = next(f for f in sorted(set(index["weight_map"].values())) if f != home)
    extra = load_file(str(sharded / other))
    extra["model.norm.weight"] = torch.zeros(64)
    save_file(extra, str(sharded / other), metadata={"format": "pt"})
    assert convert_target(sharded, tmp_path / "out2") == 2                # the index names one; a shard hides another
    err = capsys.readouterr().err
    assert "'model.norm.weight' appears in both" in err and home in err and other in err


@pytest.mark.parametrize("value", [128.7, "64", 0, -64, True, 64.0])
def test_eagle3_target_hidden_size_must_be_a_positive_int(target, tmp_path, capsys, value):
    _, tgt = target
    cfg = eagle3_config()
    cfg["target_hidden_size"] = value
    draft = write_eagle3(tmp_path / "eagle", eagle3_state_dict(), cfg)
    assert convert_draft(draft, tgt, tmp_path / "draft") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"config.json: field 'target_hidden_size' is {value!r}; expected a positive integer" in err
