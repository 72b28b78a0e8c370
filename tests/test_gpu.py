"""CUDA-graph engine == eager engine. Runs on the H200 (`pytest -m gpu`); skipped without CUDA.

Every (bucket, K) graph the schedule can reach is captured before the first request; the run
must then never fall back to eager, and its tokens must equal the eager engine's and
transformers' greedy output (float32, so graph vs eager kernels cannot flip an argmax)."""
import random

import pytest
import torch

from dynspec.runtime.engines.reference.engine import load_reference_engine, reachable_graphs
from dynspec.runtime.executor import Executor
from dynspec.runtime.policy import DraftSchedule
from tests.helpers_models import make_tiny_draft, make_tiny_target

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_pair")
    target = make_tiny_target(root / "target", vocab=256, hidden=128, layers=6, heads=8, kv_heads=2, seed=3)
    draft = make_tiny_draft(root / "draft", target, draft_vocab=128, seed=4)
    return str(target), str(draft)


def _run(pair, policy, keep_warm, graphs, prompts, lens):
    """All requests at once, of different lengths: the batch drains 16 -> 1 and K climbs."""
    eng = load_reference_engine(*pair, device="cuda", dtype="float32", max_batch_size=16, max_seq_len=128,
                                max_draft_len=policy.max_draft_len or 1)
    if graphs:
        assert eng.capture_graphs(reachable_graphs([policy], 16, keep_warm)) > 0
    ex = Executor(eng, policy, keep_warm=keep_warm)
    handles = [ex.submit(p, n) for p, n in zip(prompts, lens)]
    ex.run_until_idle()
    return [h.result().output_ids for h in handles], eng, ex


@pytest.mark.parametrize("keep_warm", [True, False])
def test_graphs_equal_eager_and_greedy(pair, keep_warm):
    from transformers import LlamaForCausalLM

    rng = random.Random(0)
    prompts = [tuple(rng.randrange(256) for _ in range(rng.randint(4, 40))) for _ in range(16)]
    lens = [4 + 4 * i for i in range(16)]
    policy = DraftSchedule.parse("2:5,4:3,8:1")
    graph_out, eng, ex = _run(pair, policy, keep_warm, True, prompts, lens)
    eager_out, _, _ = _run(pair, policy, keep_warm, False, prompts, lens)
    assert eng.eager_fallbacks == 0
    assert {s.k for s in ex.stats} >= {0, 1, 3, 5}
    assert graph_out == eager_out
    hf = LlamaForCausalLM.from_pretrained(pair[0], dtype=torch.float32).cuda().eval()
    for p, n, out in list(zip(prompts, lens, graph_out))[-6:]:
        ids = torch.tensor([list(p)], device="cuda")
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0, eos_token_id=None)[0, len(p):].tolist()
        assert list(out) == ref
