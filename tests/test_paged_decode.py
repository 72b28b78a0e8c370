"""paged_decode.py's kernel == gathered SDPA, on CPU under Triton's interpreter (float32: the
interpreter's bf16 dot is wrong), and the pure split rule. test_gpu.py runs it compiled."""
import importlib.util

import pytest
import torch

from dynspec.runtime.engines.reference import paged_decode
from tests.interpreted import interpreted

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def test_splits_for():
    assert paged_decode.splits_for(8, 17, 132) == 17          # b=1, 8 KV heads: one tile a program
    assert paged_decode.splits_for(8, 100, 132) == 33         # two waves over 132 SMs
    assert paged_decode.splits_for(2048, 17, 132) == 1
    assert paged_decode.tile_fits(64, 128) and paged_decode.tile_fits(16, 16)
    assert not paged_decode.tile_fits(48, 96) and not paged_decode.tile_fits(8, 64) and not paged_decode.tile_fits(128, 64)


def _interpreted(fn: str) -> str:
    return interpreted("helpers_paged", fn)


@needs_triton
def test_paged_decode_interpreted_equals_sdpa():
    """tests/helpers_paged.py's cases against gathered SDPA."""
    from tests.helpers_paged import INTERPRETED_CASES

    out = _interpreted("run_interpreted")
    assert out.count("ok rope") == len(INTERPRETED_CASES) and out.count("ok") == 2 * len(INTERPRETED_CASES) + 1, out
    assert "ok crossing" in out


@needs_triton
def test_target_decode_with_rope_inside_the_kernel_equals_rope_write_and_sdpa():
    """Block.forward through PagedDecode.rope_attend (the decode graphs' path on CUDA), interpreted:
    the same logits and caches as model.rope_write + SDPA (helpers_paged.run_target_interpreted)."""
    assert "ok target 12 launches" in _interpreted("run_target_interpreted")


@needs_triton
def test_whole_and_eager_mixed_iterations_with_the_triton_kernel_equal_transformers():
    """The CUDA path's attention (decode rows through the Triton kernel, chunks through
    PackedChunks), whole-forward mixed iterations and eager ones: interpreted, float64, token for
    token against transformers (helpers_paged.run_whole_interpreted)."""
    out = _interpreted("run_whole_interpreted")
    assert "ok whole" in out and "ok eager" in out, out


def test_supports_only_uniform_rows_of_few_queries():
    from dynspec.runtime.engines.reference.attention import ragged_batch, uniform_batch

    tables = torch.zeros(3, 4, dtype=torch.long)
    pools = torch.zeros(2, 256, 32)
    u = uniform_batch(tables, torch.arange(2), torch.tensor([[5], [9]]), 4, 64)
    assert paged_decode.supports(torch.zeros(2, 8, 32), pools, u, 64)
    assert not paged_decode.supports(torch.zeros(2, 8 * 17, 32), pools, u, 64)      # 68 queries a KV head
    r = ragged_batch(tables, [0, 1], [0, 0], [3, 1], 64)
    assert not paged_decode.supports(torch.zeros(4, 8, 32), pools, r, 64)
    with pytest.raises(ValueError, match="uniform decode rows"):
        paged_decode.paged_decode_attention(torch.zeros(4, 8, 32), pools, pools, r, 64)


def test_serving_capture_runs_mixed_iterations_eagerly_when_whole_graphs_fail(capsys):
    """session.capture under graphs "full": decode graphs, the chunks' attention warmed, then
    the whole graphs; strict (benchmarks) raises when those fail, strict=False (serving) warns
    and drops them (mixed iterations run eagerly). Under "eager" only the warm-up runs."""
    from dynspec.config import GraphMode, ReferenceSettings
    from dynspec.runtime.session import capture

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
