"""Every bad checkpoint gives a DynspecError that names the file and the field or tensor."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dynspec.errors import DynspecError
from dynspec.runtime.engines.reference.load import load_draft, load_target
from tests.helpers_models import make_tiny_draft, make_tiny_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    t = make_tiny_target(root / "target", layers=4, vocab=128, hidden=32, heads=4, kv_heads=2)
    d = make_tiny_draft(root / "draft", t, draft_vocab=64, capture_layers=(0, 1, 3))
    return t, d, load_target(t)


def copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def edit_weights(folder: Path, fn) -> None:
    path = folder / "model.safetensors"
    sd = load_file(str(path))
    fn(sd)
    save_file(sd, str(path))


def raises(match: str, fn, *args, **kw) -> str:
    with pytest.raises(DynspecError) as e:
        fn(*args, **kw)
    msg = str(e.value)
    for part in match.split("|"):
        assert part in msg, f"{part!r} not in {msg!r}"
    return msg


# ----------------------------------------------------------------------------- target

def test_missing_folder_and_config(tmp_path):
    raises("does not exist", load_target, tmp_path / "nope")
    (tmp_path / "t").mkdir()
    raises("t has no config.json", load_target, tmp_path / "t")


def test_bad_json_and_fields(tmp_path, pair):
    t = copy_folder(pair[0], tmp_path / "t")
    (t / "config.json").write_text("{not json")
    raises("config.json|not valid JSON", load_target, t)
    (t / "config.json").write_text(json.dumps([1, 2]))
    raises("config.json|JSON object", load_target, t)
    cases = {
        "hidden_size": (None, "missing field 'hidden_size'"),
        "num_attention_heads": ("4", "field 'num_attention_heads' is '4'; expected a positive integer"),
        "num_key_value_heads": (3, "'num_key_value_heads' (3)"),
        "rms_norm_eps": (-1.0, "field 'rms_norm_eps' is -1.0; expected a positive finite number"),
        "hidden_act": ("gelu", "field 'hidden_act'"),
        "model_type": ("gpt2", "field 'model_type'"),
        "rope_scaling": ({"rope_type": "yarn", "factor": 2.0}, "rope_scaling.rope_type"),
        "tie_word_embeddings": ("yes", "field 'tie_word_embeddings' is 'yes'; expected true or false"),
    }
    for field, (value, msg) in cases.items():
        good = copy_folder(pair[0], tmp_path / f"f_{field}")
        edit_config(good, **{field: value})
        raises(f"{good / 'config.json'}|{msg}", load_target, good)
    llama3 = copy_folder(pair[0], tmp_path / "llama3")
    edit_config(llama3, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    raises("config.json|missing field 'low_freq_factor'", load_target, llama3)


def test_no_weight_files(tmp_path, pair):
    t = tmp_path / "t"
    t.mkdir()
    (t / "config.json").write_bytes((pair[0] / "config.json").read_bytes())
    raises("has no weight files", load_target, t)


def test_missing_shard_named_in_index(tmp_path):
    t = make_tiny_target(tmp_path / "t", layers=2, hidden=32, shards=2)
    (t / "model-00002-of-00002.safetensors").unlink()
    raises("model.safetensors.index.json|model-00002-of-00002.safetensors|does not exist", load_target, t)
    (t / "model.safetensors.index.json").write_text("{}")
    raises("model.safetensors.index.json|weight_map", load_target, t)


def test_corrupt_safetensors_and_bin(tmp_path, pair):
    t = copy_folder(pair[0], tmp_path / "t")
    (t / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage" + b"\x00" * 50)
    raises("model.safetensors|cannot read weights", load_target, t)
    data = (pair[0] / "model.safetensors").read_bytes()
    (t / "model.safetensors").write_bytes(data[: len(data) // 2])          # truncated
    raises("model.safetensors|", load_target, t)
    b = make_tiny_target(tmp_path / "b", layers=2, hidden=32, fmt="bin")
    (b / "pytorch_model.bin").write_bytes(b"PK\x03\x04 definitely not a zip")
    raises("pytorch_model.bin|cannot read weights", load_target, b)


def test_bin_with_code_is_refused(tmp_path, pair):
    """weights_only=True: a pickle that is not plain tensors is rejected, never executed."""
    b = make_tiny_target(tmp_path / "b", layers=2, hidden=32, fmt="bin")
    torch.save({"x": torch.zeros(1), "obj": Path("/")}, b / "pytorch_model.bin")
    raises("pytorch_model.bin|cannot read weights", load_target, b)


def test_missing_tensor_and_shape_mismatch(tmp_path, pair):
    t = copy_folder(pair[0], tmp_path / "t")
    edit_weights(t, lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"))
    raises("missing tensor 'model.layers.1.mlp.up_proj.weight'", load_target, t)
    s = copy_folder(pair[0], tmp_path / "s")
    edit_weights(s, lambda sd: sd.__setitem__("model.layers.0.self_attn.k_proj.weight", torch.zeros(8, 32)))
    raises("model.safetensors|'model.layers.0.self_attn.k_proj.weight'|[8, 32]|[16, 32]", load_target, s)
    u = copy_folder(pair[0], tmp_path / "u")
    edit_weights(u, lambda sd: sd.pop("lm_head.weight"))
    raises("missing tensor 'lm_head.weight'|tie_word_embeddings=false", load_target, u)


# ----------------------------------------------------------------------------- draft

def test_draft_missing_config_and_weights(tmp_path, pair):
    _, d, target = pair
    (tmp_path / "d").mkdir()
    raises("draft folder|has no config.json", load_draft, tmp_path / "d", target)
    (tmp_path / "d" / "config.json").write_bytes((d / "config.json").read_bytes())
    raises("draft folder|has no weight files", load_draft, tmp_path / "d", target)


def test_draft_hidden_size_mismatch(tmp_path, pair):
    t, d, target = pair
    x = copy_folder(d, tmp_path / "x")
    edit_config(x, target_hidden_size=48)
    raises("config.json|hidden-size mismatch|'target_hidden_size' is 48|32", load_draft, x, target)
    y = copy_folder(d, tmp_path / "y")
    edit_config(y, hidden_size=48)   # no target_hidden_size: the draft's hidden must be the target's
    raises("config.json|hidden-size mismatch|'hidden_size' is 48", load_draft, y, target)
    # a wider draft with its own embeddings and target_hidden_size loads fine
    z = make_tiny_draft(tmp_path / "z", t, hidden=48, heads=4, kv_heads=2, embed=True, capture_layers=(0, 1, 3))
    assert load_draft(z, target).config.hidden_size == 48
    w = copy_folder(z, tmp_path / "w")
    edit_weights(w, lambda sd: sd.pop("embed_tokens.weight"))
    raises("embed_tokens.weight|48|32", load_draft, w, target)


def test_draft_vocab_mismatches(tmp_path, pair):
    _, d, target = pair
    v = copy_folder(d, tmp_path / "v")
    edit_config(v, vocab_size=100)
    raises("config.json|field 'vocab_size' is 100|128", load_draft, v, target)
    a = copy_folder(d, tmp_path / "a")
    edit_weights(a, lambda sd: sd.__setitem__("d2t", sd["d2t"][:60]))
    raises("model.safetensors|'d2t'|[60]|[64]", load_draft, a, target)
    b = copy_folder(d, tmp_path / "b")
    edit_weights(b, lambda sd: sd.__setitem__("t2d", torch.ones(100, dtype=torch.bool)))
    raises("model.safetensors|'t2d'|[100]|[128]", load_draft, b, target)
    c = copy_folder(d, tmp_path / "c")
    edit_weights(c, lambda sd: sd.__setitem__("d2t", sd["d2t"] + 500))
    raises("model.safetensors|'d2t' maps draft ids to target ids|outside the target vocabulary 0..127",
           load_draft, c, target)
    e = copy_folder(d, tmp_path / "e")
    edit_weights(e, lambda sd: sd.__setitem__("t2d", torch.roll(sd["t2d"], 1)))
    raises("'d2t' and 't2d' disagree", load_draft, e, target)
    f = copy_folder(d, tmp_path / "f")
    edit_weights(f, lambda sd: sd.pop("d2t"))
    raises("missing tensor 'd2t'|draft_vocab_size 64 < vocab_size 128", load_draft, f, target)
    g = copy_folder(d, tmp_path / "g")
    edit_weights(g, lambda sd: sd.__setitem__("d2t", sd["d2t"].float()))
    raises("'d2t' has dtype torch.float32|integer", load_draft, g, target)


def test_draft_capture_layers(tmp_path, pair):
    _, d, target = pair
    a = copy_folder(d, tmp_path / "a")
    edit_config(a, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 4]})
    raises("config.json|'eagle_config.eagle_aux_hidden_state_layer_ids'|[4] out of range|4 layers", load_draft, a, target)
    b = copy_folder(d, tmp_path / "b")
    edit_config(b, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 1, 3]})
    raises("repeats a layer", load_draft, b, target)
    c = copy_folder(d, tmp_path / "c")
    edit_config(c, eagle_config=None, eagle_aux_hidden_state_layer_ids=[0, 1, 2])   # vLLM: id 0 = embeddings
    raises("'eagle_aux_hidden_state_layer_ids'|[0] out of range|input of layer", load_draft, c, target)
    e = copy_folder(d, tmp_path / "e")
    edit_config(e, eagle_aux_hidden_state_layer_ids=[2, 3, 4])     # = outputs (1, 2, 3) != (0, 1, 3)
    raises("disagree", load_draft, e, target)
    f = copy_folder(d, tmp_path / "f")
    edit_config(f, eagle_config=None)           # default (1, L//2-1, L-4) = (1, 1, 0) for L=4
    raises("default EAGLE-3 capture layers|eagle_config.eagle_aux_hidden_state_layer_ids", load_draft, f, target)
    raises("capture_layers (override)|[7] out of range", load_draft, d, target, capture_layers=(0, 1, 7))
    # two capture layers: fc is [h, 3*h_t] in the file -> shape mismatch names fc.weight
    raises("'fc.weight'|[32, 96]|[32, 64]", load_draft, d, target, capture_layers=(0, 1))


def test_draft_missing_tensor_shape_and_layers(tmp_path, pair):
    _, d, target = pair
    a = copy_folder(d, tmp_path / "a")
    edit_weights(a, lambda sd: sd.pop("midlayer.hidden_norm.weight"))
    raises("missing tensor 'midlayer.hidden_norm.weight'", load_draft, a, target)
    b = copy_folder(d, tmp_path / "b")
    edit_weights(b, lambda sd: sd.__setitem__("midlayer.self_attn.q_proj.weight", torch.zeros(32, 32)))
    raises("'midlayer.self_attn.q_proj.weight'|[32, 32]|[32, 64]", load_draft, b, target)
    c = copy_folder(d, tmp_path / "c")
    edit_config(c, num_hidden_layers=2)
    raises("config.json|'num_hidden_layers' is 2", load_draft, c, target)
    e = copy_folder(d, tmp_path / "e")
    edit_config(e, architectures=["LlamaForCausalLM"])
    raises("config.json|'architectures'", load_draft, e, target)
    f = copy_folder(d, tmp_path / "f")
    edit_config(f, draft_vocab_size=200)
    raises("'draft_vocab_size' (200) exceeds", load_draft, f, target)


# ----------------------------------------------------------------------------- the shared reader's rules

def test_nonfinite_and_float8_tensors_are_refused(tmp_path, pair):
    t = copy_folder(pair[0], tmp_path / "t")
    edit_weights(t, lambda sd: sd["model.layers.1.mlp.up_proj.weight"].__setitem__((2, 3), float("nan")))
    raises("model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' holds 1 NaN/Inf", load_target, t)
    f = copy_folder(pair[0], tmp_path / "f")
    edit_weights(f, lambda sd: sd.__setitem__("model.norm.weight", sd["model.norm.weight"].to(torch.float8_e5m2)))
    raises("model.safetensors: tensor 'model.norm.weight' is torch.float8_e5m2", load_target, f)


def test_duplicate_names_across_shards_name_both_files(tmp_path, pair):
    """Two unindexed shards both holding a tensor: refused, naming both (neither is picked silently)."""
    t = copy_folder(pair[0], tmp_path / "t")
    save_file({"model.norm.weight": torch.zeros(32)}, str(t / "zz-extra.safetensors"))
    raises("'model.norm.weight' appears in both|model.safetensors|zz-extra.safetensors", load_target, t)


def test_draft_aliases_for_one_tensor_are_refused(tmp_path, pair):
    _, d, target = pair
    a = copy_folder(d, tmp_path / "a")
    edit_weights(a, lambda sd: sd.__setitem__("layers.0.hidden_norm.weight", sd["midlayer.hidden_norm.weight"].clone()))
    raises("'layers.0.hidden_norm.weight'|'midlayer.hidden_norm.weight'|are both", load_draft, a, target)


def test_truncated_shard_of_an_index_names_the_file(tmp_path):
    t = make_tiny_target(tmp_path / "t", layers=2, hidden=32, shards=2)
    victim = t / "model-00002-of-00002.safetensors"
    victim.write_bytes(victim.read_bytes()[:-64])
    raises(f"{victim}: cannot read weights (truncated", load_target, t)


def test_value_scan_tells_overflowing_sums_from_nan():
    """The scan sums each tensor; an fp16 sum past 65504 is inf without any inf in the tensor."""
    from dynspec.checkpoint.tensor_reader import check_values

    big = torch.full((100,), 60000.0, dtype=torch.float16)
    assert check_values("w", big, Path("f.safetensors")) is big
    for v in (float("nan"), float("inf"), float("-inf")):
        x = torch.ones(7, dtype=torch.bfloat16)
        x[3] = v
        raises("f.safetensors: tensor 'w' holds 1 NaN/Inf", check_values, "w", x, Path("f.safetensors"))
