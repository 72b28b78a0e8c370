"""Tensor parallelism of the reference engine (docs/tensor_parallel.md).

In process: the layout of ranks, the sharding rules, a sharded layer summed over its ranks
against transformers' own decoder layer (float64), the vocabulary-parallel argmax, the refusal
of an impossible split before any weight is read.
Under a real `mpirun` (gloo, float64, tiny random Llama + EAGLE-3 draft, 4 heads / 2 KV heads):
the sharded models' logits and captures; TP=2 and TP=4 (KV heads replicated) token-identical to
TP=1 and to transformers greedy, through the concurrency-10 / threshold-5 / K=15 case; every
rank ran the same (iteration, b, K, graphs) through K flips both ways; 2 replicas of TP=2 with
idle leaders; a killed or hung worker ends the job with an error on the leader in bounded time.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.engines.reference import tp, tp_shard
from dynspec.runtime.engines.reference.layer_ops import apply_rope, rms_norm, rope_tables, silu_mul
from dynspec.runtime.engines.reference.model_config import TargetConfig
from dynspec.runtime.tp.tp_groups import TpContext, init_tp
from dynspec.runtime.tp.tp_layout import layout
from tests.helpers_models import make_tiny_draft, make_tiny_target
from tests.mpi.tp_run import Job, drive
from tests.helpers_mpi import ONE_THREAD, mpirun

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "mpi" / "tp_run.py"
SCHEDULE = "5:15"          # the users' failure case: K=15 up to batch 5, plain decode above
CONCURRENCY = 10
# One torch thread per rank: N ranks x 2 OpenMP threads on CI's 2 busy cores spin against each
# other (a TP=1 run of these jobs: 1.5 s with 1 thread, 34 s with 2 on a loaded machine).


# ----------------------------------------------------------------------------- layout

def test_layout_replicas_of_tp_ranks():
    lay = [layout(r, 6, 2) for r in range(6)]
    assert [(x.replica, x.tp_rank, x.leader, x.is_leader) for x in lay] == [
        (0, 0, 0, True), (0, 1, 0, False), (1, 0, 2, True), (1, 1, 2, False), (2, 0, 4, True), (2, 1, 4, False)]
    assert lay[3].tp_ranks == (2, 3) and lay[0].replicas == 3
    with pytest.raises(DynspecError, match=r"mpirun -n 3 is not a multiple of --tp 2 \(3 % 2 = 1\)"):
        layout(0, 3, 2)
    with pytest.raises(DynspecError, match="--tp 0 must be at least 1"):
        layout(0, 1, 0)


def test_world_of_one_needs_no_process_group():
    ctx = init_tp(1)
    x = torch.arange(4.0)
    assert ctx.tp == 1 and ctx.all_reduce(x) is x and ctx.all_gather(x) is x
    assert not torch.distributed.is_initialized()
    with pytest.raises(DynspecError, match="mpirun -n 1 is not a multiple of --tp 2"):
        init_tp(2)


# ----------------------------------------------------------------------------- sharding rules

def test_rules_by_name():
    assert tp_shard.rule_of("layers.3.wqkv") == "qkv" and tp_shard.rule_of("wqkv") == "qkv"
    assert tp_shard.rule_of("layers.0.w13") == "gate_up"
    assert tp_shard.rule_of("layers.0.wo") == tp_shard.rule_of("w2") == "row"
    assert tp_shard.rule_of("output") == tp_shard.rule_of("tok_embeddings.weight") == tp_shard.rule_of("lm_head") == "vocab"
    assert tp_shard.rule_of("layers.0.attention_norm") == tp_shard.rule_of("fc") == tp_shard.rule_of("d2t") == "replicated"


def test_kv_heads_split_or_replicated_by_converts_rule():
    # 2 KV heads at N=4: each rank one head, each head on 2 ranks (convert: kv_replication = 2)
    s = tp_shard.TpShape(tp=4, heads=4, kv_heads=2, head_dim=3, intermediate=8, vocab=10, embed_vocab=10)
    assert (s.local_heads, s.local_kv_heads, s.kv_replication) == (1, 1, 2)
    assert [s.kv_head0(r) for r in range(4)] == [0, 0, 1, 1]
    s8 = tp_shard.TpShape(tp=4, heads=8, kv_heads=8, head_dim=3, intermediate=8, vocab=10, embed_vocab=10)
    assert [s8.kv_head0(r) for r in range(4)] == [0, 2, 4, 6] and s8.kv_replication == 1
    # rows of wqkv tagged by (kind, head): rank 3 keeps q head 3 and KV head 1 (q head 3 // 2 groups)
    hd = 3
    tags = [("q", i // hd) for i in range(4 * hd)] + [("k", i // hd) for i in range(2 * hd)] + \
           [("v", i // hd) for i in range(2 * hd)]
    code = {t: i for i, t in enumerate(sorted(set(tags)))}
    w = torch.tensor([[float(code[t])] for t in tags])
    inv = {v: k for k, v in code.items()}
    got = [inv[int(x)] for x in tp_shard.shard_qkv(w, s, 3)[:, 0].tolist()]
    assert got == [("q", 3)] * hd + [("k", 1)] * hd + [("v", 1)] * hd


def test_vocab_rows_padded_then_split():
    w = torch.arange(10.0).view(5, 2)                       # V=5 at N=2 -> 6 rows, 3 per rank
    assert tp_shard.shard_vocab(w, 0, 2).tolist() == [[0, 1], [2, 3], [4, 5]]
    assert tp_shard.shard_vocab(w, 1, 2).tolist() == [[6, 7], [8, 9], [0, 0]]


def test_impossible_split_names_the_number(tmp_path):
    cfg = TargetConfig(vocab_size=100, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=6,
                       num_kv_heads=3, head_dim=8, rms_norm_eps=1e-5, rope_theta=1e4, rope_scaling=None,
                       tie_word_embeddings=False, max_position_embeddings=64)
    with pytest.raises(DynspecError) as e:
        tp_shard.check_tp(cfg, cfg, 4, "t/config.json")
    msg = str(e.value)
    assert "TP=4 is infeasible for t/config.json" in msg
    assert "num_attention_heads=6 is not divisible by tp=4 (6 % 4 = 2)" in msg
    assert "num_key_value_heads=3 < tp=4 and tp is not a multiple of it (4 % 3 = 1)" in msg


def test_refused_before_any_weight_is_read(tmp_path):
    target = make_tiny_target(tmp_path / "t", heads=4, kv_heads=2, hidden=48, intermediate=90)
    draft = make_tiny_draft(tmp_path / "d", target)
    for f in list(target.glob("*.safetensors")) + list(draft.glob("*.safetensors")):
        f.write_bytes(b"not weights")                       # reading any weight would fail differently
    ctx = TpContext(layout(0, 4, 4), torch.device("cpu"), 1.0)
    with pytest.raises(DynspecError, match=r"intermediate_size=90 is not divisible by tp=4 \(90 % 4 = 2\)"):
        tp.load_tp_engine(str(target), str(draft), ctx)


# ----------------------------------------------------------------------------- sharded math, in process

def _layer_over_ranks(blk, s: tp_shard.TpShape, x, cos, sin):
    """Decoder layer `blk` computed as N ranks would, each with its shard of the weights and
    its own heads; the two all-reduces written as sums. x [1, T, h]; cos, sin [1, 1, T, hd/2]."""
    F = torch.nn.functional
    eps, hd = blk.c.rms_norm_eps, blk.c.head_dim
    lh, lkv = s.local_heads, s.local_kv_heads
    T = x.shape[1]
    shards = [tp_shard.shard_weights({"wqkv": blk.wqkv, "wo": blk.wo, "w13": blk.w13, "w2": blk.w2}, s, r)
              for r in range(s.tp)]
    h = rms_norm(x, blk.attention_norm, eps)
    attn = 0
    for w in shards:
        q, k, v = (t.view(1, T, -1, hd).transpose(1, 2)
                   for t in F.linear(h, w["wqkv"]).split((lh * hd, lkv * hd, lkv * hd), dim=-1))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)       # [1, lh | lkv, T, hd]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        attn = attn + F.linear(o.transpose(1, 2).reshape(1, T, lh * hd), w["wo"])
    x = x + attn
    h = rms_norm(x, blk.ffn_norm, eps)
    return x + sum(F.linear(silu_mul(F.linear(h, w["w13"])), w["w2"]) for w in shards)


@pytest.mark.parametrize("n", [2, 4])
def test_sharded_layer_equals_transformers_layer_float64(tmp_path, n):
    """Oracle: transformers' own LlamaDecoderLayer on the same weights (4 heads, 2 KV heads:
    split at N=2, replicated at N=4)."""
    from transformers import LlamaForCausalLM

    from dynspec.runtime.engines.reference.load import load_target

    folder = make_tiny_target(tmp_path / "t", heads=4, kv_heads=2, vocab=161)
    target = load_target(folder, dtype=torch.float64)
    hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    c = target.config
    T = 6
    x = torch.randn(1, T, c.hidden_size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    pos = torch.arange(T)[None]
    with torch.no_grad():
        ref = hf.model.layers[1](x, attention_mask=None, position_ids=pos,
                                 position_embeddings=hf.model.rotary_emb(x, pos))
    ref = ref[0] if isinstance(ref, tuple) else ref
    cos, sin = rope_tables(c.head_dim, c.rope_theta, c.rope_scaling, T, "cpu", torch.float64)
    with torch.no_grad():
        sharded = _layer_over_ranks(target.layers[1], tp_shard.tp_shape(c, n), x, cos[None, None], sin[None, None])
    torch.testing.assert_close(sharded, ref, rtol=1e-12, atol=1e-12)
    # vocabulary-parallel head: gathered shard logits are the full logits; the embedding sum is exact
    w = target.output.detach()
    logits = torch.cat([x @ tp_shard.shard_vocab(w, r, n).T for r in range(n)], dim=-1)[..., :c.vocab_size]
    torch.testing.assert_close(logits, x @ w.T, rtol=1e-12, atol=1e-12)
    emb = target.tok_embeddings.weight.detach()
    ids = torch.tensor([0, 5, 80, 159, 160])
    rows = tp_shard.shard_vocab(emb, 0, n).shape[0]
    parts = [torch.where(((ids >= r * rows) & (ids < (r + 1) * rows))[:, None],
                         tp_shard.shard_vocab(emb, r, n)[(ids - r * rows).clamp(0, rows - 1)], 0.0) for r in range(n)]
    assert torch.equal(sum(parts), emb[ids])


# ----------------------------------------------------------------------------- each rank loads only its shard

def _load_shards(target_dir, draft_dir, n: int, rank: int, dtype=torch.float64):
    """(target, draft) as rank `rank` of N=n loads them: shards only, then apply_tp(loaded=True)."""
    from functools import partial

    from dynspec.runtime.engines.reference.load import load_draft, load_target

    ctx = TpContext(layout(rank, n, n), torch.device("cpu"), 1.0)
    full_t = load_target(target_dir, dtype=dtype)
    full_d = load_draft(draft_dir, full_t, dtype=dtype)
    ts, ds = tp_shard.check_tp(full_t.config, full_d.config, n)
    t = load_target(target_dir, dtype=dtype, part=partial(tp_shard.shard_part, s=ts, rank=rank))
    d = load_draft(draft_dir, t, dtype=dtype, part=partial(tp_shard.shard_part, s=ds, rank=rank))
    tp.apply_tp(t, d, ctx, loaded=True)
    tp.apply_tp(full_t, full_d, ctx)
    return (t, d), (full_t, full_d)


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("n", [2, 4])
def test_sharded_load_equals_load_then_shard(tmp_path, n, tie):
    """Oracle: the whole model loaded, then sharded by apply_tp (shard_weights' rules on the fused
    weights). Loading each HF tensor's part per rank must give the same tensors, bit for bit:
    q/k/v and gate/up parts stacked = the fused shard, KV heads replicated at N=4 (2 KV heads),
    vocab 161 padded (the last rank's zero row), the draft's own embedding and a tied target."""
    target = make_tiny_target(tmp_path / "t", heads=4, kv_heads=2, vocab=161, layers=3, tie=tie)
    draft = make_tiny_draft(tmp_path / "d", target, kv_heads=2, embed=not tie)
    for rank in range(n):
        (t, d), (ft, fd) = _load_shards(target, draft, n, rank)
        got = dict(t.named_parameters()) | {"draft." + k: v for k, v in d.named_parameters()}
        want = dict(ft.named_parameters()) | {"draft." + k: v for k, v in fd.named_parameters()}
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), f"rank {rank}: {k}"
        assert torch.equal(d.d2t, fd.d2t) and torch.equal(d.t2d, fd.t2d)
        assert (d.embed_tokens is t.tok_embeddings) == tie
        assert t.layers[0].q_size == ft.layers[0].q_size and t.config == ft.config and d.config == fd.config


def test_a_rank_reads_only_its_slices(tmp_path, monkeypatch):
    """Every sharded HF tensor is read through get_slice (never get_tensor, which would
    materialise the whole tensor), and the slices read hold exactly this rank's shard: at N=2,
    the bytes read are the replicated tensors plus half of each sharded one (+ no padding read)."""
    from functools import partial

    from dynspec.checkpoint import tensor_reader
    from dynspec.runtime.engines.reference.load import load_target

    target = make_tiny_target(tmp_path / "t", heads=4, kv_heads=2, vocab=161, layers=3)
    sharded = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens",
               "lm_head")
    read: dict[str, int] = {}

    class Handle:
        def __init__(self, h):
            self.h = h

        def get_tensor(self, name):
            assert not any(k in name for k in sharded), f"{name} read whole"
            t = self.h.get_tensor(name)
            read[name] = t.numel()
            return t

        def get_slice(self, name):
            h = self.h

            class Slice:
                def get_shape(self):
                    return h.get_slice(name).get_shape()

                def __getitem__(self, index):
                    t = h.get_slice(name)[index]
                    read[name] = t.numel()
                    return t
            return Slice()

    real = tensor_reader.TensorReader._handle
    monkeypatch.setattr(tensor_reader.TensorReader, "_handle", lambda self, path: Handle(real(self, path)))
    ts = tp_shard.tp_shape(TargetConfig.from_hf(json.loads((target / "config.json").read_text()), "t"), 2)
    t = load_target(target, dtype=torch.float64, part=partial(tp_shard.shard_part, s=ts, rank=1))
    monkeypatch.undo()
    from safetensors import safe_open
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        full = {k: f.get_slice(k).get_shape() for k in f.keys()}
    for name, shape in full.items():
        numel = int(torch.tensor(shape).prod())
        if name == "model.embed_tokens.weight" or name == "lm_head.weight":
            assert read[name] == (161 - 81) * shape[1], name          # rows 81..160; the pad row is made, not read
        elif any(k in name for k in sharded):
            assert read[name] == numel // 2, name
        else:
            assert read[name] == numel, name
    assert t.lm_head.shape[0] == 81 and not t.lm_head[-1].any()


def test_bin_checkpoints_load_whole_then_slice(tmp_path):
    """pytorch_model.bin has no partial reads: the file is loaded whole, the rank's part copied
    out; the shards equal those of a safetensors copy of the same weights."""
    a = make_tiny_target(tmp_path / "a", heads=4, kv_heads=2, vocab=161, layers=3)
    b = make_tiny_target(tmp_path / "b", heads=4, kv_heads=2, vocab=161, layers=3, fmt="bin")
    da = make_tiny_draft(tmp_path / "da", a, kv_heads=2, embed=True)
    db = make_tiny_draft(tmp_path / "db", b, kv_heads=2, embed=True, fmt="bin")
    assert list(b.glob("*.bin")) and not list(b.glob("*.safetensors"))
    (ta, _), _ = _load_shards(a, da, 2, 1)
    (tb, _), _ = _load_shards(b, db, 2, 1)
    for (k, x), (_, y) in zip(ta.named_parameters(), tb.named_parameters()):
        assert torch.equal(x, y), k


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_vocab_parallel_argmax_matches_torch_argmax(n):
    g = torch.Generator().manual_seed(n)
    vocab = 11
    full = torch.randint(0, 4, (6, 3, vocab), generator=g).double()   # small ints: many ties
    rows = tp_shard.shard_vocab(torch.zeros(vocab, 1), 0, n).shape[0]
    padded = torch.cat([full, torch.full((6, 3, rows * n - vocab), 99.0)], dim=-1)   # padding must never win
    pairs = torch.stack([tp.shard_argmax(padded[..., r * rows:(r + 1) * rows], vocab, r) for r in range(n)], dim=-2)
    assert torch.equal(tp.pick_argmax(pairs), full.argmax(dim=-1))


# ----------------------------------------------------------------------------- under mpirun

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp_pair")
    target = make_tiny_target(d / "target", heads=4, kv_heads=2, vocab=161, layers=4)
    draft = make_tiny_draft(d / "draft", target, kv_heads=2, embed=True)
    return str(target), str(draft)


def jobs() -> list[Job]:
    """Three waves, so K flips both ways: 3 jobs (b=3, K=15), 8 more at iteration 3 (b=10, K=0),
    the batch drains below 6 (K=15), 4 more at iteration 30 (K=0 again if b > 5)."""
    g = torch.Generator().manual_seed(7)
    waves = [(0, 3, 24), (3, 8, 10), (30, 4, 8)]
    out = []
    for at, count, budget in waves:
        for i in range(count):
            ids = tuple(torch.randint(2, 160, (3 + (len(out) % 5),), generator=g).tolist())
            out.append(Job(ids, budget + 2 * (i % 3), at))
    return out


def run_tp(tmp_path, pair, n: int, ranks: int | None = None, *extra: str, env: dict | None = None,
           timeout: float = 100):
    """mpirun -n RANKS (default n) tests/mpi/tp_run.py --tp n over jobs() -> (process, seconds, OUT.json)."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"ids": list(j.ids), "max_new": j.max_new, "at": j.at} for j in jobs()]))
    out = tmp_path / f"tp{n}.json"
    cmd = [mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", str(ranks or n), *ONE_THREAD, sys.executable,
           str(SCRIPT), "--tp", str(n), "--target", pair[0], "--draft", pair[1], "--prompts", str(prompts),
           "--schedule", SCHEDULE, "--concurrency", str(CONCURRENCY), "--dtype", "float64", "--out", str(out), *extra]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env={**os.environ, **(env or {})})
    return proc, time.monotonic() - t0, out


@pytest.fixture(scope="module")
def tp1_outputs(pair):
    """TP=1 in this process (the same engine code, no process group) and transformers greedy."""
    from transformers import LlamaForCausalLM

    from dynspec.runtime.serving.executor import Executor
    from dynspec.runtime.policy import DraftSchedule

    sched = DraftSchedule.parse(SCHEDULE)
    engine = tp.load_tp_engine(pair[0], pair[1], init_tp(1), dtype="float64", max_batch_size=CONCURRENCY,
                               max_seq_len=64, max_draft_len=sched.max_draft_len)
    ex = Executor(engine, sched)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                       # see ONE_THREAD
    try:
        ours = [list(r.output_ids) for r in drive(ex, jobs())]
    finally:
        torch.set_num_threads(threads)
    hf = LlamaForCausalLM.from_pretrained(pair[0], dtype=torch.float64).eval()
    ref = []
    for p, m, _ in ((j.ids, j.max_new, j.at) for j in jobs()):
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=m, min_new_tokens=m, do_sample=False, pad_token_id=0, eos_token_id=None)
        ref.append(out[0, len(p):].tolist())
    assert ours == ref, "TP=1 differs from transformers greedy"
    return ours, ex.stats


def check_same_steps(doc: dict, ranks: range) -> list:
    steps = [doc["steps"][str(r)] for r in ranks]
    for r, s in zip(ranks, steps):
        assert s == steps[0], f"rank {r} ran a different sequence than rank {ranks[0]}"
    return steps[0]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sharded_models_equal_unsharded(tmp_path, pair):
    """Target logits, captured layers and draft logits of one batch (ids at both vocab ends and
    at a shard edge) under mpirun -n 2: the model's reduction points alone, without the engine
    (TP=4 runs through the engine in test_tp4_replicated_kv_heads_equals_tp1)."""
    n = 2
    from dynspec.runtime.engines.reference.load import load_draft, load_target
    from tests.mpi.tp_forward import forward

    out = tmp_path / "fwd.pt"
    cmd = [mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", str(n), *ONE_THREAD, sys.executable,
           str(ROOT / "tests" / "mpi" / "tp_forward.py"), "--tp", str(n), "--target", pair[0], "--draft", pair[1],
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(out)
    target = load_target(pair[0], dtype=torch.float64)
    ref = forward(target, load_draft(pair[1], target, dtype=torch.float64))
    for key in ("target_logits", "hidden", "draft_logits"):
        torch.testing.assert_close(got[key], ref[key], rtol=1e-12, atol=1e-12, msg=key)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tp2_equals_tp1_and_transformers_through_k_flips(tmp_path, pair, tp1_outputs):
    proc, wall, out = run_tp(tmp_path, pair, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["outputs"] == tp1_outputs[0]
    steps = check_same_steps(doc, range(2))
    ks = [k for _, _, k, _ in steps]
    assert {(b, k) for _, b, k, _ in steps} == {(st.batch_size, st.k) for st in tp1_outputs[1]}
    # K=15 up to 5 rows emitting, so at b <= 5 K=0 too where prompts end their prefill beside the rows
    assert all(k == 0 or (k == 15 and b <= 5) for _, b, k, _ in steps) and any(k == 15 for _, _, k, _ in steps)
    flips = [(a, b) for a, b in zip(ks, ks[1:]) if a != b]
    assert (0, 15) in flips and (15, 0) in flips, ks                # K=0 stretches and back, both ways
    assert any(g[0] == "refresh" for _, _, _, gs in steps for g in gs)   # resumed after K=0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tp2_with_whole_mixed_forwards_equals_tp1(tmp_path, pair, tp1_outputs):
    """Mixed iterations through mixed_graphs.py's whole forwards on both ranks (uncaptured on
    CPU): the all-reduces inside the pieces, the padding to token buckets and the head's argmax
    reduction after them keep the ranks in step and the tokens TP=1's and transformers'."""
    proc, wall, out = run_tp(tmp_path, pair, 2, None, "--whole-mixed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["outputs"] == tp1_outputs[0]
    steps = check_same_steps(doc, range(2))
    mixed = sum(1 for st in tp1_outputs[1] if st.prefill_tokens)
    assert doc["whole_runs"] == [mixed, mixed] and mixed > 0 and len(steps) == len(tp1_outputs[1])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tp2_per_row_k_through_whole_forwards_and_the_overlapped_loop_equals_transformers(tmp_path, pair, tp1_outputs):
    """Each row's own K drawn afresh every iteration (runtime/policy/per_request.py), the rows packed
    unpadded in the whole forwards, the overlapped loop, mpirun -n 2: every rank runs the same
    steps and the tokens are transformers' greedy ones."""
    proc, wall, out = run_tp(tmp_path, pair, 2, None, "--per-row", "5", "--whole-mixed", "--overlap")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["outputs"] == tp1_outputs[0]
    check_same_steps(doc, range(2))
    assert doc["per_row_steps"] > 10 and doc["whole_runs"][0] == doc["whole_runs"][1] > doc["per_row_steps"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tp2_overlapped_loop_equals_tp1_and_transformers(tmp_path, pair, tp1_outputs):
    """The overlapped executor loop under mpirun -n 2: the leader broadcasts the plan of i+1 (rows
    carried on the device) before reading i's result; every rank runs the same launches, through
    the same K flips, and the tokens are TP=1's serial ones and transformers'."""
    proc, wall, out = run_tp(tmp_path, pair, 2, None, "--overlap")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["outputs"] == tp1_outputs[0]
    assert doc["overlapped"] == doc["iterations"] > 0
    steps = check_same_steps(doc, range(2))
    assert len(steps) == doc["iterations"]                          # every launch was read back once
    ks = [k for _, b, k, _ in steps if b > 0]
    assert 0 in ks and 15 in ks


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tp2_lazy_draft_sync_with_split_catch_ups_equals_tp1(tmp_path, pair, tp1_outputs):
    """Lazy draft sync under mpirun -n 2 (docs/design.md, "Draft sync"): the K=0 stretch at b=10
    stores the features, the rows catch their draft up when K returns, a budget of 64 tokens splits
    those catch-ups over iterations and a store of 8 tokens drops the oldest; the catch-up spans
    ride in the broadcast plan, so both ranks run the same steps, and the tokens are TP=1's."""
    proc, wall, out = run_tp(tmp_path, pair, 2, None, "--draft-sync", "lazy", "--max-num-tokens", "64",
                             "--sync-cap", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["outputs"] == tp1_outputs[0]
    check_same_steps(doc, range(2))
    ups = [i for i, c in enumerate(doc["catch_up"]) if c]
    assert any(b == a + 1 for a, b in zip(ups, ups[1:])) and doc["stale_draft"] > 0, doc["catch_up"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tp4_replicated_kv_heads_equals_tp1(tmp_path, pair, tp1_outputs):
    proc, wall, out = run_tp(tmp_path, pair, 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["outputs"] == tp1_outputs[0]
    check_same_steps(doc, range(4))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_replicas_of_tp2_idle_leaders(tmp_path, pair, tp1_outputs):
    """mpirun -n 4 --tp 2: replicas {0,1} and {2,3}, each serving the same jobs on its own. The
    leaders idle for twice the 4 s timeout first: their heartbeats keep the workers waiting."""
    proc, wall, out = run_tp(tmp_path, pair, 2, 4, "--idle", "8", env={"DYNSPEC_TP_TIMEOUT_S": "4"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["outputs"] == tp1_outputs[0]
    assert check_same_steps(doc, range(0, 2)) == check_same_steps(doc, range(2, 4))


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault, after, within", [("kill", 0.0, 5.0), ("hang", 3.0, 12.0)])
def test_dead_or_hung_worker_fails_requests_and_ends_job(tmp_path, pair, fault, after, within):
    """Timeout 3 s: a killed worker is seen at once (connection reset), a hung one only when the
    timeout expires. Times count from the submission of the 10 requests, so they include the 4
    steps before the fault (slack for a busy CI machine)."""
    proc, wall, _ = run_tp(tmp_path, pair, 2, None, "--fault", fault, "--fault-at", "4",
                           env={"DYNSPEC_TP_TIMEOUT_S": "3"})
    err = proc.stderr
    assert proc.returncode != 0, err[-3000:]
    assert f"fault: {fault} at engine step 4 (step)" in err
    line = next((x for x in err.splitlines() if "open requests ended after" in x), None)
    assert line is not None, err[-3000:]
    assert line.endswith(str(["error"] * CONCURRENCY)), line
    assert after <= float(line.split("ended after ")[1].split(" s")[0]) < within, line
    assert "[dynspec rank 0] TpFault: leader: TP rank 0 (world rank 0):" in err
    assert "aborting all 2 ranks" in err
    assert wall < 60, f"the job took {wall:.1f} s to end"       # start-up included (4+ s of imports a rank)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_dead_worker_under_the_overlapped_loop_fails_requests_and_ends_job(tmp_path, pair):
    """The overlapped loop's workers run launches, not steps: the fault lands on launch 4, while
    the leader may already hold launch 5's plan; every open request ends as "error" and the job
    ends, as under the serial loop."""
    proc, wall, _ = run_tp(tmp_path, pair, 2, None, "--overlap", "--fault", "kill", "--fault-at", "4",
                           env={"DYNSPEC_TP_TIMEOUT_S": "3"})
    err = proc.stderr
    assert proc.returncode != 0, err[-3000:]
    assert "fault: kill at engine step 4 (launch)" in err
    line = next((x for x in err.splitlines() if "open requests ended after" in x), None)
    assert line is not None, err[-3000:]
    assert line.endswith(str(["error"] * CONCURRENCY)), line
    assert float(line.split("ended after ")[1].split(" s")[0]) < 5.0, line
    assert "[dynspec rank 0] TpFault: leader: TP rank 0 (world rank 0):" in err
    assert wall < 60, f"the job took {wall:.1f} s to end"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_exception_on_a_worker_aborts_the_job(tmp_path, pair):
    """A Python error on one rank: one line naming the rank, then MPI Abort ends every rank."""
    proc, wall, _ = run_tp(tmp_path, pair, 2, None, "--fault", "raise", "--fault-at", "4",
                           env={"DYNSPEC_TP_TIMEOUT_S": "30"})     # the abort, not a timeout, must end it
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "[dynspec rank 1] RuntimeError: injected fault at engine step 4; aborting all 2 ranks" in proc.stderr
    assert "MPI_ABORT was invoked on rank 1" in proc.stdout + proc.stderr
    assert wall < 30, f"the job took {wall:.1f} s to end"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mpirun_refuses_an_impossible_split_before_reading_weights(tmp_path):
    """3 heads at --tp 2, weight files unreadable: every rank stops on the config alone."""
    target = make_tiny_target(tmp_path / "t", heads=3, kv_heads=3, hidden=48)
    draft = make_tiny_draft(tmp_path / "d", target)
    for f in list(target.glob("*.safetensors")) + list(draft.glob("*.safetensors")):
        f.write_bytes(b"not weights")
    proc, wall, _ = run_tp(tmp_path, (str(target), str(draft)), 2)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "DynspecError: TP=2 is infeasible for " in proc.stderr
    assert "num_attention_heads=3 is not divisible by tp=2 (3 % 2 = 1)" in proc.stderr
    assert "cannot read" not in proc.stderr and "corrupt" not in proc.stderr


def test_every_rank_captures_graphs_in_the_same_order():
    """Ranks are separate processes with their own string-hash seeds. Graph warm-up and capture
    run collectives, so each rank must walk the keys in one order: the sweep's set of keys from
    a keep-warm mode and a plain one holds decode (b, warm) beside decode (b, off) at every
    bucket, and ordering by (kind, bucket, k) alone left those in hash order (2 H200s: NCCL
    watchdog timeout in warm-up, the ranks one collective apart)."""
    code = ("from dynspec.runtime.engines.reference.graph_keys import capture_order, reachable_graphs\n"
            "from dynspec.runtime.policy import ConstantK, DraftSchedule\n"
            "keys = set(reachable_graphs([DraftSchedule.parse('4:3')], 64, 'warm'))"
            " | set(reachable_graphs([DraftSchedule.parse('4:3')], 64, 'lazy'))"
            " | set(reachable_graphs([ConstantK(0)], 64, 'off'))\n"
            "print([tuple(vars(k).values()) for k in capture_order(keys)])")
    orders = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(6)}
    assert len(orders) == 1
    assert "('decode', 8, 0, 'lazy', True), ('decode', 8, 0, 'off', True), ('decode', 8, 0, 'warm', True)" in orders.pop()


@pytest.mark.parametrize("tail,status", [("exit_status(0)", 0), ("exit_status(3)", 3),
                                         ("raise OSError('disk full')", 1), ("raise SystemExit(2)", 1)])
def test_hard_exit_keeps_the_clis_status_and_fails_without_it(tail, status):
    """After shutdown on CUDA a rank leaves through hard_exit. Its status is the one the CLI handed
    to exit_status; an exception after the last collective (before exit_status) exits 1, not 0,
    and so does a SystemExit that bypassed exit_status (atexit cannot see its code)."""
    code = f"from dynspec.runtime.tp.tp_lifecycle import exit_status, hard_exit\nhard_exit()\n{tail}\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == status, proc.stderr
