"""TP=2 on two GPUs under a real mpirun (`pytest -m gpu`, nvidia-h200-x2); skipped with fewer GPUs.

tests/mpi/tp_run.py serves test_tp.py's jobs (schedule 5:15, concurrency 10: K flips between
15 and 0 both ways, prompts arrive while others decode) on the tiny 4-head / 2-KV-head pair:
    - CUDA graphs (decode graphs and the mixed iterations' whole-forward graphs, with their NCCL
      or one-shot all-reduces captured) give the eager engine's tokens;
    - the one-shot all-reduce (runtime/tp/allreduce.py) gives NCCL's tokens: at N=2 both compute
      a + b, one IEEE result, so the bits agree;
    - every rank ran the same (iteration, b, K, graph keys) sequence, and no decode iteration
      fell back to eager.
float32 (exact: graph and eager kernels cannot flip an argmax) and bf16, as served: graph and
eager steps run the same attention kernels, but inductor may fuse the glue differently inside a
capture, so a near-tied argmax could flip; the tiny pair's margins are wide enough for it not to."""
import shutil

import pytest
import torch

from tests.test_tp import pair, run_tp  # noqa: F401  (pair: test_tp's 4-head / 2-KV-head fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")]

SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _run(tmp_path, pair, dtype: str, graphs: bool, allreduce: str) -> dict:
    import json

    sub = tmp_path / f"{dtype}_{graphs}_{allreduce}"
    sub.mkdir()
    extra = ["--device", "cuda", "--dtype", dtype, "--allreduce", allreduce] + (["--graphs"] if graphs else [])
    proc, secs, out = run_tp(sub, pair, 2, None, *extra, env=SAFE, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    steps = list(doc["steps"].values())
    assert steps[0] == steps[1], "the two ranks ran different step sequences"
    assert {s[2] for s in steps[0]} >= {0, 15}
    assert doc["allreduce"] == allreduce
    if graphs:
        assert doc["graphs"] > 0 and doc["eager_fallbacks"] == 0
        assert doc["whole_runs"][0] == doc["whole_runs"][1] > 0      # mixed iterations replayed whole graphs
    return doc


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tp2_graphs_equal_eager_and_one_shot_equals_nccl(tmp_path, pair, dtype):
    eager = _run(tmp_path, pair, dtype, False, "nccl")
    graphs_nccl = _run(tmp_path, pair, dtype, True, "nccl")
    graphs_one_shot = _run(tmp_path, pair, dtype, True, "one-shot")
    assert graphs_nccl["outputs"] == eager["outputs"]
    assert graphs_one_shot["outputs"] == graphs_nccl["outputs"]
    assert all(r == "length" for r in eager["finish"])
