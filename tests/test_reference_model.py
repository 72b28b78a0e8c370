"""The reference target against transformers' LlamaForCausalLM, cache semantics, and the EAGLE-3 draft."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from dynspec.errors import DynspecError
from dynspec.checkpoint.eagle3 import default_capture_layers
from dynspec.runtime.engines.reference.load import load_draft, load_target
from tests.helpers_models import LLAMA3_ROPE, make_tiny_draft, make_tiny_target

ATOL = 1e-4


def hf_model(folder):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def full(model, tokens, capture=()):
    """Our model over whole sequences from position 0 (fresh cache)."""
    B, T = tokens.shape
    model.setup_cache(B, T)
    return model(tokens, torch.arange(T).expand(B, T), capture=capture)


TARGETS = {
    "gqa_llama3_tied": dict(rope_scaling=LLAMA3_ROPE, tie=True),
    "gqa_untied_sharded": dict(tie=False, shards=3),
    "mha_llama3_untied": dict(heads=4, kv_heads=4, rope_scaling=LLAMA3_ROPE, tie=False),
    "mqa_headdim_tied_sharded": dict(heads=4, kv_heads=1, head_dim=24, tie=True, shards=2),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One GQA target with llama3 RoPE scaling + a draft, shared by the cache tests."""
    root = tmp_path_factory.mktemp("tiny")
    t = make_tiny_target(root / "target", layers=4, rope_scaling=LLAMA3_ROPE, seed=1)
    d = make_tiny_draft(root / "draft", t, draft_vocab=96, seed=1)
    return t, d


@pytest.mark.parametrize("name", list(TARGETS))
def test_target_logits_match_transformers(tmp_path, name):
    folder = make_tiny_target(tmp_path, seed=3, **TARGETS[name])
    ours = load_target(folder)
    ref = hf_model(folder)
    tokens = torch.randint(0, ours.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    logits, _ = full(ours, tokens)
    want = ref(tokens).logits
    assert logits.shape == want.shape == (2, 48, ours.config.vocab_size)
    assert (logits - want).abs().max() < ATOL
    last, _ = ours(tokens, torch.arange(48).expand(2, 48), logits="last")
    assert last.shape == (2, 1, ours.config.vocab_size)
    assert (last[:, 0] - want[:, -1]).abs().max() < ATOL


def test_bf16_checkpoint_upcasts_and_bf16_model_runs(tmp_path):
    folder = make_tiny_target(tmp_path, dtype=torch.bfloat16, tie=False)
    ours, ref = load_target(folder), hf_model(folder)
    tokens = torch.randint(0, 160, (1, 20))
    assert (full(ours, tokens)[0] - ref(tokens).logits).abs().max() < ATOL
    low = load_target(folder, dtype=torch.bfloat16)
    assert low.tok_embeddings.weight.dtype == low.layers[0].wqkv.dtype == torch.bfloat16
    logits, _ = full(low, tokens)
    assert logits.dtype == torch.float32   # CPU logits come back in float32
    assert (logits.argmax(-1) == ref(tokens).logits.argmax(-1)).float().mean() > 0.9


def test_capture_matches_transformers_hidden_states(tiny):
    folder, _ = tiny
    ours, ref = load_target(folder), hf_model(folder)
    L = ours.config.num_layers
    tokens = torch.randint(0, 160, (2, 16))
    outputs = []   # raw decoder-layer outputs; transformers' hidden_states[L] is the NORMED last one
    hooks = [layer.register_forward_hook(lambda m, i, o: outputs.append(o[0] if isinstance(o, tuple) else o))
             for layer in ref.model.layers]
    hs = ref(tokens, output_hidden_states=True).hidden_states
    for h in hooks:
        h.remove()
    capture = (L - 1, 0, 2)                  # any order; concatenated in the order given
    _, cap = full(ours, tokens, capture=capture)
    h = ours.config.hidden_size
    assert cap.shape == (2, 16, 3 * h)
    for j, i in enumerate(capture):
        assert (cap[..., j * h:(j + 1) * h] - outputs[i]).abs().max() < ATOL
        if i < L - 1:  # hidden_states[i + 1] is the output of layer i (except the last, normed)
            assert (cap[..., j * h:(j + 1) * h] - hs[i + 1]).abs().max() < ATOL
    with pytest.raises(ValueError):
        full(ours, tokens, capture=(L,))


def test_incremental_decoding_equals_full_forward(tiny):
    """Rows at different lengths, row0 offset, 1- and multi-token steps, kv_len, rollback."""
    folder, _ = tiny
    m = load_target(folder)
    V = m.config.vocab_size
    g = torch.Generator().manual_seed(5)
    seqs = torch.randint(0, V, (3, 40), generator=g)
    ref_logits, ref_cap = full(m, seqs, capture=(1, 3))
    m.setup_cache(6, 64)
    row0, lens = 2, [5, 11, 3]
    for r, n in enumerate(lens):      # per-row prefill of different lengths into rows 2..4
        lo, cap = m(seqs[r:r + 1, :n], torch.arange(n)[None], row0=row0 + r, capture=(1, 3))
        assert (lo[0] - ref_logits[r, :n]).abs().max() < ATOL
        assert (cap[0] - ref_cap[r, :n]).abs().max() < ATOL
    pos = torch.tensor(lens)
    for T, kv_len in [(1, None), (3, 32), (1, 20), (4, None), (2, 40)]:
        # garbage "draft" tokens past each row's length, then rolled back: must not leak
        junk = torch.randint(0, V, (3, 3), generator=g)
        m(junk, pos[:, None] + torch.arange(3), row0=row0)
        p = pos[:, None] + torch.arange(T)                        # [3, T] per-row positions
        tok = torch.gather(seqs, 1, p)
        lo, cap = m(tok, p, row0=row0, kv_len=kv_len, capture=(1, 3))
        for r in range(3):
            assert (lo[r] - ref_logits[r, p[r]]).abs().max() < ATOL
            assert (cap[r] - ref_cap[r, p[r]]).abs().max() < ATOL
        last, _ = m(tok, p, row0=row0, kv_len=kv_len, logits="last")   # rewriting the same K/V is harmless
        assert (last[:, 0] - lo[:, -1]).abs().max() < ATOL
        pos = pos + T


# ----------------------------------------------------------------------------- draft

def naive_draft(folder, target, tokens, fused):
    """Independent EAGLE-3 reference from the raw checkpoint tensors and transformers' RoPE."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb, repeat_kv

    sd = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    cfg = json.loads((folder / "config.json").read_text())
    B, T = tokens.shape
    h, nh, kvh = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // nh

    def norm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]))

    emb = sd["embed_tokens.weight"][tokens] if "embed_tokens.weight" in sd else target.tok_embeddings(tokens)
    hidden = fused @ sd["fc.weight"].T
    x = torch.cat([norm(emb, sd["midlayer.input_layernorm.weight"]), norm(hidden, sd["midlayer.hidden_norm.weight"])], -1)
    q = (x @ sd["midlayer.self_attn.q_proj.weight"].T).view(B, T, nh, hd).transpose(1, 2)
    k = (x @ sd["midlayer.self_attn.k_proj.weight"].T).view(B, T, kvh, hd).transpose(1, 2)
    v = (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(B, T, kvh, hd).transpose(1, 2)
    rope = LlamaRotaryEmbedding(LlamaConfig(hidden_size=h, num_attention_heads=nh, rope_theta=cfg["rope_theta"],
                                            rope_scaling=cfg["rope_scaling"], max_position_embeddings=256))
    cos, sin = rope(x, torch.arange(T)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    att = (q @ repeat_kv(k, nh // kvh).transpose(-1, -2)) / hd ** 0.5
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    o = (att @ repeat_kv(v, nh // kvh)).transpose(1, 2).reshape(B, T, nh * hd)
    x = hidden + o @ sd["midlayer.self_attn.o_proj.weight"].T
    y = norm(x, sd["midlayer.post_attention_layernorm.weight"])
    out = x + (F.silu(y @ sd["midlayer.mlp.gate_proj.weight"].T) * (y @ sd["midlayer.mlp.up_proj.weight"].T)) \
        @ sd["midlayer.mlp.down_proj.weight"].T
    return norm(out, sd["norm.weight"]) @ sd["lm_head.weight"].T, out


@pytest.mark.parametrize("embed", [False, True])
def test_draft_matches_naive_reference(tmp_path, embed):
    t = make_tiny_target(tmp_path / "t", rope_scaling=LLAMA3_ROPE, layers=5)
    d = make_tiny_draft(tmp_path / "d", t, embed=embed, capture_layers=(0, 2, 4))
    target = load_target(t)
    draft = load_draft(d, target)
    assert (draft.embed_tokens is target.tok_embeddings) != embed
    tokens = torch.randint(0, 160, (2, 24))
    fused = torch.randn(2, 24, 3 * 64)
    draft.setup_cache(2, 24)
    logits, out = draft(tokens, fused, torch.arange(24).expand(2, 24))
    want_logits, want_out = naive_draft(d, target, tokens, fused)
    assert logits.shape == (2, 24, 80) and out.shape == (2, 24, 64)
    assert (logits - want_logits).abs().max() < ATOL
    assert (out - want_out).abs().max() < ATOL


def test_draft_bin_equals_safetensors_and_own_hidden_path(tmp_path, tiny):
    t, _ = tiny
    target = load_target(t)
    a = load_draft(make_tiny_draft(tmp_path / "st", t, seed=4, fmt="safetensors"), target)
    b = load_draft(make_tiny_draft(tmp_path / "bin", t, seed=4, fmt="bin"), target)
    tokens = torch.randint(0, 160, (2, 9))
    fused = torch.randn(2, 9, a.config.fused_width)
    pos = torch.arange(9).expand(2, 9)
    for m in (a, b):
        m.setup_cache(2, 16)
    la, oa = a(tokens, fused, pos)
    lb, ob = b(tokens, fused, pos)
    assert torch.equal(la, lb) and torch.equal(oa, ob)
    # an h-wide hidden skips fc: feeding fc(fused) gives the same result
    lc, oc = a(tokens, F.linear(fused, a.fc), pos)
    assert (lc - la).abs().max() < ATOL and (oc - oa).abs().max() < ATOL


def test_draft_rejects_wrong_fused_width(tiny):
    t, d = tiny
    draft = load_draft(d, load_target(t))
    draft.setup_cache(1, 8)
    with pytest.raises(DynspecError, match="width 128"):
        draft(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, 128), torch.arange(3)[None])


def test_draft_incremental_equals_full(tiny):
    t, d = tiny
    target = load_target(t)
    draft = load_draft(d, target)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 160, (2, 30), generator=g)
    fused = torch.randn(2, 30, draft.config.fused_width, generator=g)
    draft.setup_cache(2, 30)
    want_logits, want_out = draft(tokens, fused, torch.arange(30).expand(2, 30))
    draft.setup_cache(5, 48)
    row0 = 3
    for r, n in enumerate((7, 12)):
        draft(tokens[r:r + 1, :n], fused[r:r + 1, :n], torch.arange(n)[None], row0=row0 + r)
    pos = torch.tensor([7, 12])
    for T in (1, 3, 2, 1, 5):
        # a chain step fed with its own hidden (stale rows), then rolled back and rewritten
        draft(tokens[:, :1], torch.randn(2, 1, draft.config.hidden_size), pos[:, None], row0=row0)
        p = pos[:, None] + torch.arange(T)
        lo, out = draft(torch.gather(tokens, 1, p), fused[torch.arange(2)[:, None], p], p, row0=row0, kv_len=40)
        for r in range(2):
            assert (lo[r] - want_logits[r, p[r]]).abs().max() < ATOL
            assert (out[r] - want_out[r, p[r]]).abs().max() < ATOL
        pos = pos + T


def test_d2t_mapping(tiny):
    t, d = tiny
    draft = load_draft(d, load_target(t))
    from safetensors.torch import load_file

    sd = load_file(str(d / "model.safetensors"))
    ids = torch.nonzero(sd["t2d"]).flatten()            # sorted target ids of the draft vocab
    dv = draft.config.draft_vocab_size
    assert dv == 96 and torch.equal(draft.to_target_ids(torch.arange(dv)), ids)
    assert torch.equal(draft.to_target_ids(torch.tensor([[0, dv - 1]])), ids[[0, dv - 1]].view(1, 2))
    assert draft.t2d.sum() == dv and draft.t2d[draft.to_target_ids(torch.arange(dv))].all()


def test_capture_layer_conventions(tmp_path, tiny):
    """eagle_config ids are layer outputs; vLLM's top-level ids are layer inputs (id - 1)."""
    t, _ = tiny
    target = load_target(t)
    a = load_draft(make_tiny_draft(tmp_path / "a", t, capture_layers=(0, 1, 3), capture_key="eagle_config"), target)
    b = load_draft(make_tiny_draft(tmp_path / "b", t, capture_layers=(0, 1, 3), capture_key="vllm"), target)
    assert a.capture_layers == b.capture_layers == (0, 1, 3)
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    c = load_draft(tmp_path / "a", target, capture_layers=(3, 2, 1))
    assert c.capture_layers == (3, 2, 1)
    assert default_capture_layers(32) == (1, 15, 28)


def test_default_capture_layers_for_deep_target(tmp_path):
    t = make_tiny_target(tmp_path / "t", layers=8, hidden=32, heads=2, kv_heads=1)
    d = make_tiny_draft(tmp_path / "d", t, capture_key=None)
    assert load_draft(d, load_target(t)).capture_layers == (1, 3, 4)


def test_random_pair_tiny_round_trip(tmp_path):
    from dynspec.pairs.random_pair import write_random_pair

    pair = write_random_pair(tmp_path / "pair", preset="tiny", seed=1, dtype=torch.bfloat16)
    target = load_target(pair.target)
    draft = load_draft(pair.draft, target)
    tokens = torch.randint(0, target.config.vocab_size, (1, 6))
    logits, cap = full(target, tokens, capture=draft.capture_layers)
    draft.setup_cache(1, 6)
    dl, out = draft(tokens, cap, torch.arange(6)[None])
    assert torch.isfinite(logits).all() and torch.isfinite(dl).all()
    assert dl.shape == (1, 6, draft.config.draft_vocab_size)
    three = write_random_pair(tmp_path / "three", preset="tiny", seed=1, layers=3)
    t3 = load_target(three.target)
    assert t3.config.num_layers == 3 and load_draft(three.draft, t3).capture_layers == (0, 1, 2)


# ----------------------------------------------------------------------------- the committed tiny pair

def test_committed_tiny_pair_loads_and_speculates():
    from dynspec.corpus import ASSET_DIR
    from dynspec.pairs.decode import plain_greedy, spec_decode

    folder = ASSET_DIR
    if not (folder / "draft" / "config.json").is_file():
        pytest.skip("tiny pair not built")
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert size <= 6 * 2**20
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder / "target"))
    target = load_target(folder / "target")
    draft = load_draft(folder / "draft", target)
    assert len(tok) == target.config.vocab_size
    assert draft.config.draft_vocab_size < target.config.vocab_size
    assert len(set(draft.capture_layers)) == 3
    prompt = tok("    def __init__(self, name, value=None):\n        self.name = name\n")["input_ids"]
    out, accepted = spec_decode(target, draft, prompt, 32, 4)
    assert out == plain_greedy(target, prompt, 32)
    assert sum(accepted) / len(accepted) > 1.0


@pytest.mark.parametrize("V, chunks", [(10, 3), (1000, 7), (128256, 128), (5, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_first_max_equals_torch_max_ties_included(V, chunks, dtype):
    """layer_ops.first_max (the greedy head's argmax) == torch.max / argmax over the last axis: few
    rows of small integers (ties everywhere), and maxima placed alone in the tail, in the last
    piece, at a piece's edges and twice (the lower index wins)."""
    from dynspec.runtime.engines.reference.layer_ops import first_max

    g = torch.Generator().manual_seed(V)
    cases = [torch.randint(0, 4, shape + (V,), generator=g).to(dtype) for shape in [(1,), (3,), (2, 2), (200,)]]
    w = max(1, V // chunks)
    for at in {a for a in (V - 1, chunks * w - 1, chunks * w - w, w, 0, V // 2) if a < V}:
        x = torch.zeros(2, V, dtype=dtype)
        x[0, at] = 1
        x[1, at], x[1, V - 1 - at] = 1, 1
        cases.append(x)
    cases.append(torch.randint(0, 4, (V, 2), generator=g).to(dtype).t())    # a last axis of stride 2
    for x in cases:
        v, i = first_max(x, chunks)
        rv, ri = x.max(dim=-1)
        assert torch.equal(v, rv) and torch.equal(i, ri) and torch.equal(i, x.argmax(dim=-1)), (V, chunks, x.shape)
