"""A served step runs at shapes the capture made: a compile inside one stalled it for 1-2 s on
the H200 (the `acceptance` mix/shift runs). Two sources, each checked on CPU:
- the prompt chunks' FlexAttention compiles once per pool layout (target, draft) in warm_chunks,
  and every chunk shape served afterwards reuses those versions. Dynamo's guards (sizes, strides,
  storage offsets) are the same on CPU, so this runs with the aot_eager backend: the CPU engine
  takes its mixed iterations through the whole-forward function uncaptured, whose chunk attention
  is the GPU's packed one. Inductor's own guards on CUDA are tests/test_gpu.py's;
- the paged decode kernel's launch constants follow the decode batch's table width, so eager
  decode rows read the whole table, as the graphs do."""
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
    prior = getattr(cfg, name)
    setattr(cfg, name, attention.FLEX_RECOMPILE_LIMIT)      # (monkeypatch's undo would delete the entry)
    monkeypatch.setattr(attention, "_compiled_flex", torch.compile(flex_attention, fullgraph=True, backend="aot_eager"))
    yield
    setattr(cfg, name, prior)
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


def test_eager_decode_rows_read_the_graphs_table_width_where_triton_runs(pair, monkeypatch):  # noqa: F811
    """A CPU engine on the Triton branch (PackedChunks for the chunks, SplitRows for mixed
    iterations) with a recorder in the paged kernel's place, SDPA underneath: arrivals beside
    decode rows at K = 3 and 1 (the eager draft chain, refresh and decode rows of a mixed
    iteration) and pure decode steps. Every decode batch has the whole table's width, where the
    step's own `read` blocks would give a new (PER, SPLITS) and so a new kernel; the tokens equal
    the plain CPU engine's."""
    from dynspec.runtime.driver import closed_loop
    from dynspec.runtime.engines.reference.attention import sdpa_attention

    widths = []

    def recorder(q, k, v, batch):
        widths.append(batch.tables.shape[1])
        return sdpa_attention(q, k, v, batch)

    rng = random.Random(4)
    jobs = [(tuple(rng.randrange(96) for _ in range(rng.randint(3, 40))), rng.randint(2, 16)) for _ in range(12)]
    policy = DraftSchedule.parse("2:3,8:1")
    outs = []
    for triton in (False, True):
        eng = load_reference_engine(*pair, dtype="float64", max_batch_size=4, max_seq_len=128, max_draft_len=3,
                                    max_num_tokens=64)
        if triton:
            eng.triton = True
            monkeypatch.setattr(eng, "decode_attention", lambda: recorder)
        ex = Executor(eng, policy)
        outs.append([h.result().output_ids for h in closed_loop(ex, jobs, 4)])
    assert any(s.decode_rows and s.prefill_tokens and s.k for s in ex.stats)
    assert widths and set(widths) == {eng.max_blocks_per_seq}
    assert outs[0] == outs[1]
