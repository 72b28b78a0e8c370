"""ragged.py's kernel == gathered SDPA, on CPU under Triton's interpreter (float32: the
interpreter's bf16 dot is wrong): uniform decode rows (with and without RoPE inside the launch)
and ragged rows (length-1 rows, chunks across items and blocks), plus the pure item and split
rules. test_gpu.py runs it compiled."""
import importlib.util

import numpy as np
import pytest
import torch

from dynspec.runtime.engines.reference import ragged
from tests.interpreted import interpreted

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def test_splits_for():
    assert ragged.splits_for(8, 17, 132) == 17          # b=1, 8 KV heads: one tile a program
    assert ragged.splits_for(8, 100, 132) == 33         # two waves over 132 SMs
    assert ragged.splits_for(2048, 17, 132) == 1


def test_plan_items_worked_example():
    """The module docstring's example: decode rows of slots 4 and 9 at K=2, a 40-token chunk of slot 2."""
    items = ragged.plan_items([4, 9, 2], [3, 3, 40], 16)
    assert items.tolist() == [[4, 9, 2, 2, 2], [0, 3, 6, 22, 38], [3, 3, 16, 16, 8]]
    assert ragged.item_count([3, 3, 40], 16) == 5 and ragged.item_count([3, 3, 40], 4) == 12
    padded = ragged.plan_items([4, 9, 2], [3, 3, 40], 16, pad_to=7)
    assert padded[:, 5:].tolist() == [[0, 0]] * 3 and np.array_equal(padded[:, :5], items)
    with pytest.raises(ValueError, match="5 work items do not fit a launch of 4"):
        ragged.plan_items([4, 9, 2], [3, 3, 40], 16, pad_to=4)


def test_plan_items_covers_every_token_once():
    """Random rows: the items tile the packed tokens in order, each within one row, none empty."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        lens = rng.integers(1, 70, size=rng.integers(1, 9))
        items = ragged.plan_items(np.arange(len(lens)) + 10, lens)
        starts = np.cumsum(lens) - lens
        covered = np.concatenate([np.arange(q0, q0 + n) for q0, n in zip(items[1], items[2])])
        assert np.array_equal(covered, np.arange(lens.sum())) and (items[2] >= 1).all()
        assert (items[2] <= ragged.ITEM_TOKENS).all()
        row = np.searchsorted(starts, items[1], side="right") - 1
        assert np.array_equal(items[0], row + 10) and (items[1] + items[2] <= starts[row] + lens[row]).all()


def _interpreted(fn: str) -> str:
    return interpreted("helpers_paged", fn)


@needs_triton
def test_ragged_attention_interpreted_equals_sdpa():
    """tests/helpers_paged.py's cases against gathered SDPA: uniform rows, their fused-RoPE form,
    and ragged rows as work items (length 1, 15 / 16 / 17 tokens over the item edge, chunks that
    start on a block edge, several splits and one)."""
    from tests.helpers_paged import INTERPRETED_CASES, RAGGED_CASES

    out = _interpreted("run_interpreted")
    assert out.count("ok rope") == len(INTERPRETED_CASES), out
    assert out.count("ok ragged") == len(RAGGED_CASES) and "ok crossing" in out, out


@needs_triton
def test_target_decode_with_rope_inside_the_kernel_equals_rope_write_and_sdpa():
    """Block.forward through RaggedAttention.rope_attend (the decode graphs' path on CUDA), interpreted:
    the same logits and caches as layer_ops.rope_write + SDPA (helpers_paged.run_target_interpreted)."""
    assert "ok target 12 launches" in _interpreted("run_target_interpreted")


@needs_triton
def test_whole_and_eager_mixed_iterations_with_the_triton_kernel_equal_transformers():
    """The CUDA path's attention (every row through the ragged kernel: decode rows and chunks in
    one launch), whole-forward mixed iterations and eager ones: interpreted, float64, token for
    token against transformers (helpers_paged.run_whole_interpreted)."""
    out = _interpreted("run_whole_interpreted")
    assert "ok whole" in out and "ok eager" in out and "ok per-row" in out, out


def test_rope_attend_refuses_what_the_kernel_cannot_take():
    """The fused-RoPE form takes uniform rows only: a batch with items (a chunk's items read keys
    that other programs bring), a qkv whose width is not (nh + 2 kvh) x hd, or a head size the
    kernel lacks, goes through rope_write and then the kernel or SDPA."""
    from dynspec.runtime.engines.reference.attention import ragged_batch

    tables = torch.zeros(3, 4, dtype=torch.long)
    pools = torch.zeros(2, 256, 32)
    r = ragged_batch(tables, [0, 1], [0, 0], [3, 1], 64)
    qkv, cos = torch.zeros(4, 15 * 32), torch.zeros(4, 1, 16)
    assert ragged.RaggedAttention(64).rope_attend(qkv, cos, cos, pools, pools, r, 12) is None   # 12 + 2 x 2 heads
    qkv = torch.zeros(4, 16 * 32)                                                                 # 12 + 2 x 2 heads
    assert ragged.RaggedAttention(64).rope_attend(qkv, cos, cos, pools, pools, r, 12) is None   # items
    with pytest.raises(ValueError, match="uniform rows only"):
        ragged._launch(None, pools, pools, r, 64, rope=(qkv, cos, cos, 12))
    with pytest.raises(ValueError, match="head sizes"):
        ragged.ragged_attention(torch.zeros(4, 8, 24), torch.zeros(2, 256, 24), torch.zeros(2, 256, 24), r, 64)


def test_serving_capture_runs_mixed_iterations_eagerly_when_whole_graphs_fail(capsys):
    """session.capture under graphs "full": decode graphs, the chunks' attention warmed, then
    the whole graphs; strict (benchmarks) raises when those fail, strict=False (serving) warns
    and drops them (mixed iterations run eagerly). Under "eager" only the warm-up runs."""
    from dynspec.config import GraphMode, ReferenceSettings
    from dynspec.runtime.generate.session import capture

    class Engine:
        def __init__(self):
            self.calls = []

        def capture_decode_graphs(self, keys):
            self.calls.append("decode")
            return 3

        def warm_chunks(self):
            self.calls.append("warm")

        def capture_whole_graphs(self, keys):
            self.calls.append("whole")
            raise RuntimeError("NoValidChoicesError")

        def drop_whole(self):
            self.calls.append("drop")

    ref = ReferenceSettings()
    with pytest.raises(RuntimeError, match="NoValidChoices"):
        capture(Engine(), (), ref)
    e = Engine()
    assert capture(e, (), ref, strict=False) == 3
    assert e.calls == ["decode", "warm", "whole", "drop"]
    assert "whole-forward mixed graphs not captured (RuntimeError: NoValidChoicesError)" in capsys.readouterr().err
    e = Engine()
    assert capture(e, (), ReferenceSettings(graphs=GraphMode.EAGER)) == 0 and e.calls == ["warm"]


def test_chain_cuts_start_with_a_one_layer_graph():
    from dynspec.runtime.engines.reference.graphs import GraphChain, chain_cuts

    assert chain_cuts(32) == {0, 8} and chain_cuts(6) == {0, 1} and chain_cuts(2) == {0, 1} and chain_cuts(1) == {0}
    seen = []

    class G:
        def __init__(self, n):
            self.n = n

        def replay(self):
            seen.append(self.n)

    GraphChain((G(0), G(1), G(2))).replay()
    assert seen == [0, 1, 2]


def test_the_caller_picks_the_attention(tmp_path):
    """engine attention: "auto" is SDPA on CPU, "sdpa" always, "triton" on CPU only under Triton's
    interpreter (a clear error otherwise), anything else refused."""
    import os

    from dynspec.errors import DynspecError
    from dynspec.runtime.engines.reference.load import load_reference_engine
    from tests.helpers_models import make_tiny_pair

    target, draft = make_tiny_pair(tmp_path, vocab=96, hidden=64, layers=3, heads=4, kv_heads=2, seed=1,
                                   draft_vocab=64, draft_seed=2)
    kw = dict(max_batch_size=2, max_seq_len=32, max_draft_len=2, max_num_tokens=16)
    assert not load_reference_engine(target, draft, **kw).triton
    assert not load_reference_engine(target, draft, attention="sdpa", **kw).triton
    with pytest.raises(DynspecError, match="attention 'flex': one of auto, triton, sdpa"):
        load_reference_engine(target, draft, attention="flex", **kw)
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(DynspecError, match="Triton's interpreter only"):
            load_reference_engine(target, draft, attention="triton", **kw)
