"""The prompt chunks' FlexAttention compiles once per pool layout (target, draft) in warm_chunks,
and every chunk shape served afterwards reuses those versions: a compile inside a served step
stalled it for 1-2 s on the H200. Dynamo's guards (sizes, strides, storage offsets) are the same
on CPU, so this runs there with the aot_eager backend: the CPU engine takes its mixed iterations
through the whole-forward function uncaptured, whose chunk attention is the GPU's packed one.
Inductor's own guards on CUDA are tests/test_gpu.py's."""
import random

import pytest
import torch
from torch._dynamo.utils import counters

from dynspec.runtime.engines.reference.engine import load_reference_engine, reachable_graphs
from dynspec.runtime.executor import Executor
from dynspec.runtime.policy import DraftSchedule
from tests.test_executor import pair  # noqa: F401  (fixture)


@pytest.fixture
def compiled_flex(monkeypatch):
    """attention._flex() compiled as on CUDA (fullgraph, the raised recompile limit), on aot_eager."""
    from torch import _dynamo
    from torch.nn.attention.flex_attention import flex_attention

    from dynspec.runtime.engines.reference import attention

    _dynamo.reset()
    cfg = _dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    monkeypatch.setattr(cfg, name, attention.FLEX_RECOMPILE_LIMIT)
    monkeypatch.setattr(attention, "_compiled_flex", torch.compile(flex_attention, fullgraph=True, backend="aot_eager"))
    yield
    _dynamo.reset()


def test_served_chunks_reuse_the_versions_warm_chunks_compiled(pair, compiled_flex):  # noqa: F811
    """Prompts of 1, 2, 127, 128, 129, 255, 256 and 300 tokens and random ones, arriving one every
    two iterations, at K=0 and then at K = 3 and 1: chunk-only iterations (the chunks at packed
    index 0), chunks beside one decode row at K=0 (index 1) and beside several rows (index >= 2),
    in one q block and in several."""
    eng = load_reference_engine(*pair, max_batch_size=8, max_seq_len=424, max_draft_len=3, max_num_tokens=512)
    policies = [DraftSchedule.parse(""), DraftSchedule.parse("2:3,8:1")]
    eng.capture_whole_graphs(reachable_graphs(policies, 8, True, 512))
    eng.warm_chunks()
    warm = counters["stats"]["unique_graphs"]
    assert warm >= 2                                   # target and draft
    rng = random.Random(3)
    lens = [1, 2, 127, 128, 129, 255, 256, 300] + [rng.randint(5, 300) for _ in range(8)]
    mixed = []
    for policy in policies:
        ex = Executor(eng, policy)
        for n in lens:
            ex.submit(tuple(rng.randrange(96) for _ in range(n)), rng.randint(2, 12))
            ex.step()
            ex.step()
        ex.run_until_idle()
        mixed += [s for s in ex.stats if s.prefill_tokens]
    assert any(not s.decode_rows for s in mixed) and any(s.decode_rows == 1 and s.k == 0 for s in mixed)
    assert any(s.decode_rows > 1 for s in mixed) and {s.k for s in mixed if s.decode_rows} >= {0, 1, 3}
    assert counters["stats"]["unique_graphs"] == warm
