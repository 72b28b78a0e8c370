"""CUDA-graph engine == eager engine. Runs on the H200 (`pytest -m gpu`); skipped without CUDA.

Every pure-decode (bucket, K) graph the schedule can reach is captured before the first
request, and the whole-forward graphs of the mixed iterations (mixed_graphs.py: one per token
bucket, row bucket and T). The run must never fall back to eager for a decode iteration, and
its tokens must equal the eager engine's and transformers' greedy output (float32, so graph vs
eager kernels cannot flip an argmax). Both take every row through the ragged Triton kernel
(ragged.py): decode steps with RoPE inside it, decode rows and prompt chunks in one launch."""
import logging
import random
import time

import pytest
import torch

from dynspec.runtime.engines.reference.graph_keys import reachable_graphs
from dynspec.runtime.engines.reference.load import load_reference_engine
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.loop import Loop
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.generate.session import capture
from tests.helpers_greedy import assert_greedy_up_to_ties
from tests.helpers_lockstep import serve_in_lockstep
from tests.helpers_models import make_tiny_pair
from tests.helpers_rope import assert_rope_write_matches

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("gpu_pair"), vocab=256, hidden=128, layers=6, heads=8, kv_heads=2,
                          seed=3, draft_vocab=128, draft_seed=4)


def _run(pair, policy, keep_warm, graphs, prompts, lens, on_captured=lambda: None):
    """All requests at once, of different lengths, under a 64-token budget: prompts arrive in
    chunks beside decode rows, then the batch drains 16 -> 1 and K climbs. graphs: the decode
    and whole-forward graphs captured (GraphMode.FULL, with warm_mixed's iterations), else every
    step eager. on_captured() runs after the capture, before the first request."""
    eng = load_reference_engine(*pair, device="cuda", dtype="float32", max_batch_size=16, max_seq_len=128,
                                max_draft_len=policy.max_draft_len or 1, max_num_tokens=64)
    if graphs:
        keys = reachable_graphs([policy], 16, keep_warm)
        assert capture(eng, keys) > len(keys)
    else:
        eng.warm_chunks()
    on_captured()
    ex = Executor(eng, policy, keep_warm=keep_warm)
    handles = [ex.submit(p, n) for p, n in zip(prompts, lens)]
    ex.run_until_idle()
    return [h.result().output_ids for h in handles], eng, ex


def assert_transformers_greedy(pair, prompts, lens, outputs) -> None:
    """Each output equals transformers' greedy generation of the target in float32 on the GPU, up
    to a near-tie of its logits (tests/helpers_greedy.py): at most one row may end at one."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(pair[0], dtype=torch.float32).cuda().eval()
    assert assert_greedy_up_to_ties(hf, prompts, lens, outputs) <= 1


@pytest.mark.parametrize("keep_warm", [True, False])
def test_graphs_equal_eager_and_greedy(pair, keep_warm, monkeypatch):
    from dynspec.runtime.engines.reference.ragged import RaggedAttention

    runs, fused = _spy_whole(monkeypatch), []
    rope_attend = RaggedAttention.rope_attend

    def spy(self, *a):
        o = rope_attend(self, *a)
        fused.append(o is not None)
        return o

    monkeypatch.setattr(RaggedAttention, "rope_attend", spy)
    rng = random.Random(0)
    prompts = [tuple(rng.randrange(256) for _ in range(rng.randint(4, 40))) for _ in range(16)]
    lens = [4 + 4 * i for i in range(16)]
    policy = DraftSchedule.parse("2:5,4:3,8:1")
    graph_out, eng, ex = _run(pair, policy, keep_warm, True, prompts, lens, on_captured=runs.clear)
    n_whole = len(runs)
    assert any(fused)                               # decode graphs: RoPE + K/V write inside the Triton kernel
    fused.clear()
    eager_out, eager, _ = _run(pair, policy, keep_warm, False, prompts, lens)
    assert len(runs) == n_whole and eager.whole is None     # the eager engine never ran a whole graph
    assert any(fused)                               # eager decode steps: the same kernel
    assert n_whole > 0 and all(replayed for _, _, replayed in runs)
    top = eng.whole.buckets[-1]                     # past it: eager
    fits = [s for s in ex.stats if s.prefill_tokens and s.decode_rows * (s.k + 1) + s.prefill_tokens <= top]
    assert n_whole == len(fits)                     # every mixed iteration that fits replayed its graph
    assert eng.eager_fallbacks == 0
    assert all(len(g.graphs) == (1 if k.kind == "refresh" else 3) for k, g in eng.graph_chains.items())   # chains
    assert eng.whole.buckets == (16, 32, 48, 64)
    assert {s.k for s in ex.stats} >= {0, 1, 3, 5}
    assert any(s.decode_rows and s.prefill_tokens for s in ex.stats)
    assert graph_out == eager_out
    assert_transformers_greedy(pair, prompts[-6:], lens[-6:], graph_out[-6:])


def _spy_whole(monkeypatch) -> list:
    """(key, b, replayed) of every WholeMixed.run."""
    from dynspec.runtime.engines.reference.mixed_graphs import WholeMixed

    runs = []
    real = WholeMixed.run
    def run(self, key):
        buf = self.s.buffers
        b = int((buf.slot[:key[1]] != buf.pad_slot).sum())              # real decode rows (the rest pad)
        runs.append((key, b, key in self.graphs))
        return real(self, key)

    monkeypatch.setattr(WholeMixed, "run", run)
    return runs


def test_whole_mixed_graphs_equal_transformers(pair, monkeypatch):
    """Mixed iterations as whole-forward graphs (attention captured too) give transformers'
    tokens in float32: chunk-only iterations, decode rows at K=0 and K>0, padded row buckets."""
    runs = _spy_whole(monkeypatch)
    rng = random.Random(1)
    prompts = [tuple(rng.randrange(256) for _ in range(rng.randint(4, 40))) for _ in range(16)]
    lens = [4 + 4 * i for i in range(16)]
    out, eng, ex = _run(pair, DraftSchedule.parse("2:5,4:3,8:1"), True, True, prompts, lens, on_captured=runs.clear)
    assert runs and all(replayed for _, _, replayed in runs) and len(eng.whole.graphs) > 0
    assert any(b == 0 for _, b, _ in runs) and any(B > b > 0 for (_, B, _, _), b, _ in runs)
    assert any(T > 1 for (_, _, T, _), b, _ in runs if b) and any(T == 1 for (_, _, T, _), b, _ in runs if b)
    assert_transformers_greedy(pair, prompts, lens, out)


def _compiled() -> dict:
    """Compiled variants so far: torch.compile's graphs and each Triton kernel's."""
    from torch._dynamo.utils import counters

    from dynspec.runtime.engines.reference import norm_kernel, ragged_kernel, rope_kernel, swiglu_kernel

    out = {"dynamo": dict(counters["stats"])}
    for fn in (ragged_kernel.ragged_paged_attention, norm_kernel._add_rms_norm_kernel, rope_kernel._rope_write_kernel,
               swiglu_kernel._silu_mul_kernel):
        caches = getattr(fn, "device_caches", None)           # Triton >= 3.2: device -> (kernel cache, ...)
        out[fn.__name__] = (sum(len(c[0]) for c in caches.values()) if caches is not None
                            else sum(len(c) for c in getattr(fn, "cache", {}).values()))
    return out


@pytest.mark.parametrize("prompt_lens,max_seq,budget", [((4, 40), 128, 64), ((100, 300), 512, 512)],
                         ids=["short-prompts", "chunks-over-several-query-blocks"])
def test_nothing_compiles_while_serving_after_the_capture(pair, prompt_lens, max_seq, budget):
    """After session.capture (decode graphs, warm_chunks, whole graphs, warm_mixed), 40 requests
    through 16 rows (finished rows replaced: arrivals beside decode rows at two K > 0 at least) compile
    no new compiled graph and no new Triton specialisation: each first use would stall a
    served step. Prompts of 4..40 tokens, then of 100..300 (chunks over several query blocks)."""
    rng = random.Random(5)
    prompts = [tuple(rng.randrange(256) for _ in range(rng.randint(*prompt_lens))) for _ in range(40)]
    lens = [rng.randint(2, 30) for _ in prompts]
    # a step counts the prompts it ends as rows (DraftSchedule.emitting): 15 decode rows beside a
    # prompt that ends count 16, and 16 + 1; the 17 tier keeps K=1 there, K=3 and 5 in the ramp-up
    policy = DraftSchedule.parse("4:5,8:3,17:1")
    eng = load_reference_engine(*pair, device="cuda", dtype="float32", max_batch_size=16, max_seq_len=max_seq,
                                max_draft_len=5, max_num_tokens=budget)
    capture(eng, reachable_graphs([policy], 16, True, budget))
    before = _compiled()
    ex = Executor(eng, policy, keep_warm=True)
    for p, n in zip(prompts, lens):
        ex.submit(p, n)
    ex.run_until_idle()
    assert len({s.k for s in ex.stats if s.decode_rows and s.prefill_tokens} - {0}) >= 2   # mixed at two K > 0
    assert before["ragged_paged_attention"] > 0                          # the kernel cache is read where Triton keeps it
    assert _compiled() == before


@pytest.mark.parametrize("acceptance", ["greedy", "bernoulli"])
def test_nothing_compiles_serving_llama_shapes_in_bf16_in_waves(tmp_path_factory, acceptance):
    """The served shapes of the H200 benchmarks: the Llama-3.1-8B preset's heads, head dim and
    vocabulary (three layers, random weights), bf16, a 424-token cache, regime B lengths (prompts
    64..192, outputs 32..224). Three schedules, K = 5, 3, 1 at every batch size, each serving
    32 requests through 16 rows, so the second wave arrives beside decode rows. After the
    capture nothing compiles, and no step stalls (a first use compiling there took 1-2 s)."""
    from dynspec.pairs.random_pair import write_random_pair
    from dynspec.runtime.policy.acceptance import Bernoulli, Greedy

    paths = write_random_pair(tmp_path_factory.mktemp("llama_shapes") / "pair", "llama-3.1-8b", layers=3,
                              device="cuda")
    schedules = [DraftSchedule.parse(f"16:{k}") for k in (5, 3, 1)]
    eng = load_reference_engine(str(paths.target), str(paths.draft), device="cuda", dtype="bfloat16",
                                max_batch_size=16, max_seq_len=424, max_draft_len=5)
    capture(eng, reachable_graphs(schedules, 16, True, eng.max_num_tokens))
    before = _compiled()
    rng = random.Random(7)
    slow, recompiles = [], _Messages()
    dynamo_log = logging.getLogger("torch._dynamo")
    torch._logging.set_logs(recompiles=True)            # from here on: what a served step would compile
    dynamo_log.addHandler(recompiles)
    try:
        for policy in schedules:
            ex = Executor(eng, policy, keep_warm=True, allow_lossy=True,
                          acceptance=Bernoulli(0.5) if acceptance == "bernoulli" else Greedy())
            for _ in range(32):
                ex.submit(tuple(rng.randrange(1000, 30000) for _ in range(rng.randint(64, 192))),
                          rng.randint(32, 224))
            ex.run_until_idle()
            slow += [(s.k, s.decode_rows, s.prefill_tokens, round(s.seconds, 3)) for s in ex.stats if s.seconds > 0.2]
    finally:
        dynamo_log.removeHandler(recompiles)
        torch._logging.set_logs()
    assert sum(s.decode_rows > 0 and s.prefill_tokens > 0 for s in ex.stats) > 0
    after = _compiled()
    assert after == before and not slow, (f"compiled {before} -> {after}; steps over 0.2 s (K, b, prefill, s): "
                                          f"{slow}; recompiles: {recompiles.lines[:4]}")


class _Messages(logging.Handler):
    """Keeps the text of every record it is handed (dynamo's recompile reasons, guards included)."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record) -> None:
        self.lines.append(record.getMessage()[:2000])


def test_the_overlapped_loop_serves_arrivals_with_no_hidden_sync(pair):
    """The overlapped executor on CUDA graphs (float32 tiny pair, a 64-token budget): 40 requests
    through 16 rows in a closed loop of 12, so arrivals land beside decode rows while K moves
    between 5, 3, 1 and 0. From the first request on, torch.cuda.set_sync_debug_mode("error")
    makes any synchronizing call PyTorch knows of (a pageable copy, .item(), nonzero) raise
    wherever it is, planning, admission, staging or launch: the loop's one wait per iteration is
    the result copy's event. Its tokens equal the serial loop's on the same engine."""
    from dynspec.runtime.serving.driver import closed_loop

    rng = random.Random(9)
    jobs = [(tuple(rng.randrange(256) for _ in range(rng.randint(4, 40))), rng.randint(2, 30)) for _ in range(40)]
    policy = DraftSchedule.parse("2:5,4:3,8:1")
    eng = load_reference_engine(*pair, device="cuda", dtype="float32", max_batch_size=16, max_seq_len=128,
                                max_draft_len=5, max_num_tokens=64)
    capture(eng, reachable_graphs([policy], 16, "lazy", 64))
    serial = [h.result().output_ids for h in closed_loop(Executor(eng, policy), jobs, 12)]
    ex = Executor(eng, policy, loop=Loop.OVERLAPPED)
    torch.cuda.set_sync_debug_mode("error")
    try:
        handles = closed_loop(ex, jobs, 12)
        ex.run_until_idle()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [h.result().output_ids for h in handles] == serial
    stats = ex.stats
    assert all(s.overlapped for s in stats) and any(s.decode_rows and s.prefill_tokens for s in stats)
    assert {s.k for s in stats if s.decode_rows} >= {0, 1, 3, 5}


@pytest.mark.parametrize("keep_warm", [True, False])
def test_whole_k0_graphs_leave_the_eager_state(pair, keep_warm, monkeypatch):
    """K = 0 whole-graph iterations end the step inside the graph (head, captures, keep-warm K/V,
    the draft's chunk pass): two engines with decode graphs serve the same requests in lockstep,
    one with whole graphs, one running mixed iterations eagerly. Bernoulli acceptance is a hash of (request, position), so both
    make the same plans and accept the same counts even where a draft differs; after every step
    the carried draft state agrees (float32; the kernels differ, so within tolerance)."""
    from dynspec.runtime.policy.acceptance import Bernoulli

    runs = _spy_whole(monkeypatch)
    policy = DraftSchedule.parse("2:3,4:0")                     # K = 0 from 3 rows up
    engines, exs = [], []
    for whole in (True, False):
        eng = load_reference_engine(*pair, device="cuda", dtype="float32", max_batch_size=8, max_seq_len=128,
                                    max_draft_len=3, max_num_tokens=64)
        keys = reachable_graphs([policy], 8, keep_warm, 64)
        if whole:
            assert capture(eng, keys) > len(keys)
        else:
            eng.capture_decode_graphs(keys)
            eng.warm_chunks()
        engines.append(eng)
        exs.append(Executor(eng, policy, keep_warm=keep_warm, acceptance=Bernoulli(0.5, seed=1), allow_lossy=True))
    rng = random.Random(3)
    prompts = [tuple(rng.randrange(256) for _ in range(rng.randint(4, 40))) for _ in range(12)]
    lens = [rng.randint(4, 24) for _ in prompts]
    agree = []

    def check(step: int) -> None:
        a, b = engines
        n = a.pad_slot
        agree.append(((a.next_draft[:n] == b.next_draft[:n]).float().mean().item()))
        torch.testing.assert_close(a.draft_hidden[:n], b.draft_hidden[:n], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(a.last_capture[:n], b.last_capture[:n], rtol=1e-3, atol=1e-3)

    serve_in_lockstep(exs, prompts, lens, rng, check)
    assert [(s.batch_size, s.k, s.accepted) for s in exs[0].stats] == [(s.batch_size, s.k, s.accepted)
                                                                        for s in exs[1].stats]
    assert sum(agree) >= 0.98 * len(agree)
    assert sum(1 for (_, _, T, _), b, replayed in runs if T == 1 and replayed) >= 3 and all(r for _, _, r in runs)
    assert any(s.k == 0 and s.decode_rows and s.prefill_tokens for s in exs[0].stats)


@pytest.mark.parametrize("whole", [False, True])
def test_chunks_over_several_query_blocks_equal_transformers(pair, whole, monkeypatch):
    """Prompts of 150..300 tokens under a 512-token budget: the packed chunks span many work items
    of the ragged kernel and several blocks.
    Eager mixed iterations (beside decode graphs), or whole-forward graphs; float32; transformers' tokens."""
    runs = _spy_whole(monkeypatch)
    policy = DraftSchedule.parse("2:3,4:1")
    eng = load_reference_engine(*pair, device="cuda", dtype="float32", max_batch_size=4, max_seq_len=384,
                                max_draft_len=3, max_num_tokens=512)
    keys = reachable_graphs([policy], 4, True, 512)
    if whole:
        capture(eng, keys)
    else:
        eng.capture_decode_graphs(keys)
        eng.warm_chunks()
    rng = random.Random(2)
    prompts = [tuple(rng.randrange(256) for _ in range(rng.randint(150, 300))) for _ in range(4)]
    ex = Executor(eng, policy, keep_warm=True)
    handles = [ex.submit(p, 12) for p in prompts]
    ex.run_until_idle()
    assert max(s.prefill_tokens for s in ex.stats) > 256
    assert bool(runs) == whole and all(replayed for _, _, replayed in runs)
    assert not whole or any(key[0] - key[1] * key[2] > 128 for key, _, _ in runs)   # a whole graph over > 1 q block
    assert_transformers_greedy(pair, prompts, [12] * len(prompts), [h.result().output_ids for h in handles])


def _llama8b_shaped_pair():
    """A random Llama-3.1-8B-shaped target + EAGLE-3 draft in bf16, made on the GPU (no files)."""
    from dynspec.runtime.engines.reference.draft import Eagle3Config, Eagle3Draft
    from dynspec.runtime.engines.reference.layer_ops import Kernels
    from dynspec.runtime.engines.reference.model import Target
    from dynspec.runtime.engines.reference.model_config import TargetConfig

    tc = TargetConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                      num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=None,
                      tie_word_embeddings=False, max_position_embeddings=8192)
    dc = Eagle3Config(hidden_size=4096, target_hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                      intermediate_size=14336, draft_vocab_size=32000, vocab_size=128256, rms_norm_eps=1e-5,
                      rope_theta=500000.0, rope_scaling=None, max_position_embeddings=8192, capture_layers=(1, 15, 28))
    kw = dict(device="cuda", dtype=torch.bfloat16)
    target = Target(tc, **kw).eval()
    draft = Eagle3Draft(dc, embed=target.tok_embeddings, **kw).eval()
    with torch.no_grad():
        for m in (target, draft):
            for p in m.parameters():
                p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    target.kernels = Kernels(compiled=True)
    return target, draft


def test_decode_b1_1024_context_timing():
    """b=1 plain decode with 1024 tokens of context in a 4096-token cache, bf16, at the 8B shape:
    eager steps, then the decode graph chain. Prints the figures; asserts only that a graphed
    step is no slower than an eager one."""
    from dynspec.runtime.policy.acceptance import Greedy
    from dynspec.runtime.engines.reference.graph_keys import GraphKey
    from dynspec.runtime.engines.reference.engine import ReferenceEngine
    from dynspec.runtime.serving.plan import PromptChunk, make_plan

    target, draft = _llama8b_shaped_pair()
    ctx, ms = 1024, {}
    eng = ReferenceEngine(target, draft, max_batch_size=1, max_seq_len=4096, max_draft_len=1, max_num_tokens=2048)
    slot = eng.reserve(ctx + 64)
    prompt = tuple(random.Random(0).randrange(128000) for _ in range(ctx))
    eng.step(make_plan(0, [], [], [], False, eng.buckets, slots=[], chunks=[PromptChunk(slot, 0, prompt, None)]),
             Greedy())
    plan = make_plan(0, [ctx], [5], [True], False, eng.buckets, slots=[slot])

    def step_ms(n: int = 100) -> float:
        for _ in range(5):
            eng.step(plan, Greedy())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            eng.step(plan, Greedy())
        torch.cuda.synchronize()
        return 1e3 * (time.perf_counter() - t0) / n

    ms["eager"] = step_ms()
    t0 = time.perf_counter()
    eng.capture_decode_graphs([GraphKey("decode", 1, sync="off")])
    capture_s = time.perf_counter() - t0
    ms["full"] = step_ms()
    print(f"\n[decode b=1 ctx={ctx} cache=4096 bf16] eager step {ms['eager']:.3f} ms, graphed step "
          f"{ms['full']:.3f} ms, capture+compile {capture_s:.1f} s", flush=True)
    kv_per_token = 2 * 32 * 8 * 128 * 2                     # K and V, 32 layers, 8 KV heads, hd 128, bf16
    free = torch.cuda.mem_get_info()[0]
    print(f"[capacity] KV bytes/token {kv_per_token}; free after weights {free / 2**30:.1f} GiB: "
          f"{free // (kv_per_token * 128 * -(-(1024 + 128 + 9) // 128))} requests of 1024+128 tokens in 128-token "
          f"blocks", flush=True)
    assert ms["full"] <= 1.1 * ms["eager"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n, nh", [(1, 32), (7, 32), (300, 32), (7, 0)])
def test_rope_write_triton_equals_rope_write(n, nh, dtype):
    """Kernels(compiled=True)'s rope_write on CUDA, the Triton kernel, == layer_ops.rope_write at the
    8B shape (nh 32, kvh 8, hd 128) into a layer of a bigger cache; nh 0: the draft's keep-warm
    K/V write (no query heads)."""
    from dynspec.runtime.engines.reference.layer_ops import Kernels
    from dynspec.runtime.engines.reference.rope_kernel import rope_write_triton

    assert Kernels(compiled=True).rope_write is rope_write_triton
    assert_rope_write_matches(rope_write_triton, "cuda", dtype, n, nh=nh)


def test_pack_inputs_on_cuda_follow_the_rule():
    """pack_kernel.py compiled, on tests/test_pack_kernel.py's random layouts (b=64 at T=4 and a chunk)."""
    from tests.test_pack_kernel import test_random_layouts_follow_the_rule
    from dynspec.runtime.engines.reference.pack_kernel import pack_inputs

    test_random_layouts_follow_the_rule(pack_inputs, 64, 4, 130, device="cuda")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("R, T", [(1, 1), (3, 4), (64, 1)])
def test_ragged_uniform_equals_sdpa(R, T, dtype):
    """ragged.py's kernel on uniform rows == gathered SDPA at the 8B shape (nh 32, kvh 8, hd 128, blocks of
    128) over a layer of a bigger cache, eagerly and replayed from a CUDA graph twice (the second
    replay finds the merge counters reset by the first)."""
    from dynspec.runtime.engines.reference.ragged import ragged_attention
    from tests.helpers_paged import assert_paged_matches

    q, k, v, batch, out = assert_paged_matches(ragged_attention, "cuda", dtype, R, T, 32, 8, 128, 128, 9)
    assert_replays_equal(lambda: ragged_attention(q, k, v, batch, 128), out)


def assert_replays_equal(fn, out) -> None:
    """fn() captured in a CUDA graph (after an eager warm-up) and replayed twice, each replay's
    output equal to `out` (the second finds the merge counters reset by the first)."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = fn()
    for _ in range(2):
        o.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(o, out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("R, T, starts", [(1, 1, None), (3, 4, None), (64, 1, None), (3, 4, [190, 383, 700])])
def test_ragged_rope_equals_rope_write_and_sdpa(R, T, starts, dtype):
    """The fused form (RoPE and the K/V write inside the kernel) == layer_ops.rope_write then gathered
    SDPA at the 8B shape, eagerly and replayed from a CUDA graph twice, each replay on the pool as it
    was before the eager call (so a key read before it is written shows). [190, 383, 700]: 3 rows and the
    padding row x 8 KV heads get 6 programs of 3 tiles each on 132 SMs (keys 0..191 | 192..383 | ...),
    and windows 190..193 and 383..386 cross two programs' keys."""
    from dynspec.runtime.engines.reference.ragged import splits_for
    from tests.helpers_paged import assert_rope_paged_matches, rope_attention

    assert starts is None or splits_for((R + 1) * 8, 18, 132) == 8         # 18 tiles -> 3 a program, 6 programs

    qkv, cos, sin, k, v, batch, out, (k0, v0) = assert_rope_paged_matches("cuda", dtype, R, T, 32, 8, 128, 128, 9,
                                                                           starts=starts)
    k1, v1 = k.clone(), v.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = rope_attention(qkv, cos, sin, k, v, batch, 128, 32)
    for _ in range(2):
        o.zero_()
        k.copy_(k0)
        v.copy_(v0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(o, out) and torch.equal(k, k1) and torch.equal(v, v1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("lens", [(1,), (1, 128), (64 * (4,) + (128,)), (3, 17, 300, 1, 40)])
def test_ragged_items_equal_sdpa(lens, dtype):
    """ragged.py's kernel on ragged rows (work items) == gathered SDPA at the 8B shape, eagerly and
    replayed from a CUDA graph: a length-1 row, b=1 and b=64 rows at K=3 beside a 128-token chunk,
    and rows across item and block edges."""
    from dynspec.runtime.engines.reference.ragged import ragged_attention
    from tests.helpers_paged import assert_ragged_matches

    q, k, v, batch, out = assert_ragged_matches("cuda", dtype, lens, 32, 8, 128, 128, 9)
    assert_replays_equal(lambda: ragged_attention(q, k, v, batch, 128), out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows, n", [(1, 4096), (300, 4096), (5, 64)])
def test_norm_triton_equals_eager(rows, n, dtype):
    """Kernels(compiled=True)'s add_rms_norm / rms_norm on CUDA, norm_kernel's, == layer_ops' eager ones:
    the 8B's row at b=1 and at a prompt chunk's 300 rows, and a tiny model's."""
    from dynspec.runtime.engines.reference.layer_ops import Kernels
    from dynspec.runtime.engines.reference.norm_kernel import add_rms_norm_triton, rms_norm_triton
    from tests.helpers_norm import assert_norm_matches

    assert Kernels(compiled=True).add_rms_norm is add_rms_norm_triton
    assert_norm_matches(add_rms_norm_triton, rms_norm_triton, "cuda", dtype, rows, n)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows, n", [(1, 14336), (576, 14336), (5, 80)])
def test_silu_mul_triton_equals_eager(rows, n, dtype):
    """Kernels(compiled=True)'s silu_mul on CUDA, swiglu_kernel's, == layer_ops' eager one: the 8B's
    [gate | up] at b=1 and at a 64:0:512 step's 576 rows, and a tiny model's."""
    from dynspec.runtime.engines.reference.layer_ops import Kernels
    from dynspec.runtime.engines.reference.swiglu_kernel import silu_mul_triton
    from tests.helpers_swiglu import assert_swiglu_matches

    assert Kernels(compiled=True).silu_mul is silu_mul_triton
    assert_swiglu_matches(silu_mul_triton, "cuda", dtype, rows, n)


@pytest.mark.parametrize("rows", [1, 4, 300])
def test_first_max_equals_argmax_on_cuda(rows):
    """layer_ops.first_max == torch.argmax on CUDA at the 8B's vocabulary, ties included (small integers,
    and one row whose two maxima sit in different pieces)."""
    from dynspec.runtime.engines.reference.layer_ops import first_max

    g = torch.Generator().manual_seed(rows)
    x = torch.randint(0, 6, (rows, 128256), generator=g).to("cuda", torch.bfloat16)
    x[0] = 0
    x[0, 128255], x[0, 70000] = 1, 1
    assert torch.equal(first_max(x)[1], x.argmax(dim=-1))
    assert first_max(x)[1][0] == 70000


def test_per_row_k_through_captured_whole_graphs_equals_transformers(pair, monkeypatch):
    """Each row's K drawn afresh every iteration (tests/test_per_request.py's FlipRows): the rows
    packed unpadded at K_i + 1 tokens in the captured whole graphs (a step below its row shape's
    least bucket padded up to it), every mixed iteration replayed from a graph, per-row steps
    without chunks from the whole or the decode graphs, none eager, and transformers' tokens."""
    from tests.test_per_request import FlipRows

    runs = _spy_whole(monkeypatch)
    policy = FlipRows(4, seed=2)
    eng = load_reference_engine(*pair, device="cuda", dtype="float32", max_batch_size=16, max_seq_len=128,
                                max_draft_len=4, max_num_tokens=64)
    capture(eng, reachable_graphs([policy], 16, "lazy", 64))
    runs.clear()
    rng = random.Random(4)
    prompts = [tuple(rng.randrange(256) for _ in range(rng.randint(4, 40))) for _ in range(16)]
    lens = [4 + 3 * i for i in range(16)]
    ex = Executor(eng, policy, loop=Loop.OVERLAPPED)
    handles = [ex.submit(p, n) for p, n in zip(prompts, lens)]
    ex.run_until_idle()
    per_row = [s for s in ex.stats if s.drafted not in (0, s.batch_size * s.k)]
    assert per_row and runs and all(replayed for _, _, replayed in runs)
    assert len(runs) >= sum(1 for s in ex.stats if s.prefill_tokens) and eng.eager_fallbacks == 0
    assert_transformers_greedy(pair, prompts, lens, [h.result().output_ids for h in handles])


def test_a_step_without_rows_stores_through_its_captured_graph(pair, monkeypatch):
    """Lazy sync under "1:4" (K=4 at one row, 0 above): 3 prompts reach an idle engine and end in
    its first step, whose rows would run at K=0, so that step stores them (Executor._drafts_next)
    through the captured chunk-only STORE graph; the rows end one by one and the last drafts after
    catching up its prompt. Every mixed step replays a graph, nothing compiles, and the tokens are
    transformers'."""
    from dynspec.runtime.engines.reference.mixed_layout import STORE

    runs = _spy_whole(monkeypatch)
    policy = DraftSchedule.parse("1:4")
    eng = load_reference_engine(*pair, device="cuda", dtype="float32", max_batch_size=16, max_seq_len=128,
                                max_draft_len=4, max_num_tokens=64)
    capture(eng, reachable_graphs([policy], 16, "lazy", 64))
    runs.clear()
    before = _compiled()
    rng = random.Random(6)
    prompts = [tuple(rng.randrange(256) for _ in range(rng.randint(4, 20))) for _ in range(3)]
    lens = [8, 16, 40]
    ex = Executor(eng, policy, draft_sync="lazy")
    handles = [ex.submit(p, n) for p, n in zip(prompts, lens)]
    ex.run_until_idle()
    first = ex.stats[0]
    assert first.batch_size == 0 and first.stored_prompt_tokens == sum(map(len, prompts))
    assert runs[0][0][1:] == (0, 1, STORE) and all(replayed for _, _, replayed in runs)
    assert any(s.k == 4 and s.catch_up_tokens for s in ex.stats) and eng.eager_fallbacks == 0
    assert _compiled() == before
    assert_transformers_greedy(pair, prompts, lens, [h.result().output_ids for h in handles])
