"""profile --floor's overlapped decode (benchmarks/profile.py overlap_decode_ms): plain decode at b=1
served by Executor(loop=Loop.OVERLAPPED), timed as the wall time between its step results, beside the same
step through engine.step (decode_ms) and the GEMM floor, on one engine. On CPU there are no CUDA
graphs, so decode_graph_ms and every ratio to it are None; the reference engine's launch runs the
step before it returns there (a CPU time ratio to decode_ms says little on a shared machine)."""
import pytest

from dynspec.benchmarks import summary
from dynspec.benchmarks.engines import open_sized
from dynspec.benchmarks.gemm_floor import measure_floor, overlap_decode_ms
from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.generate.session import engine_config_for, tiny_pair_dirs


@pytest.fixture(scope="module")
def engine():
    cfg = engine_config_for(*tiny_pair_dirs(), DraftSchedule.parse("4:4"))
    return open_sized(cfg, device="cpu", max_batch_size=1, max_seq_len=256, max_draft_len=1)


def test_floor_records_the_overlapped_decode_step(engine):
    fl = measure_floor(engine, warmup=2, repeats=8, context_len=200)
    ov = fl["decode_overlap"]
    assert (ov["steps"], ov["first_position"], ov["last_position"]) == (8, 200 - 12, 199)
    assert fl["decode_overlap_ms"] == ov["ms"] > 0
    assert fl["decode_overlap_vs_gemm_floor"] == pytest.approx(fl["decode_overlap_ms"] / fl["gemm_floor_ms"])
    assert fl["decode_graph_ms"] is None and fl["decode_overlap_vs_graph"] is None       # CPU: no graphs
    assert ov["mean_ms"] >= fl["decode_overlap_ms"] / 2 and fl["decode_ms"] > 0


def test_overlapped_decode_needs_the_loops_cache_slack(engine):
    assert overlap_decode_ms(engine, 252, warmup=1, repeats=2)["last_position"] == 251   # 252 + 2 x (K 1 + 1) = 256
    with pytest.raises(DynspecError, match=r"it needs max_seq_len 257 \(the engine has 256\)"):
        overlap_decode_ms(engine, 253, warmup=1, repeats=2)


def test_floor_figures_carry_the_overlapped_step_over_three_runs():
    runs = [{"command": f"profile --floor #{i}", "floor": {"gemm_floor_ms": 4.0, "decode_ms": d, "context_len": 1024,
                                                         "decode_graph_ms": g, "decode_overlap_ms": o}}
            for i, (d, g, o) in enumerate(((4.9, 4.6, 4.65), (4.8, 4.6, 4.70), (4.85, 4.5, 4.60)))]
    fig = summary.floor_figures(runs)
    assert fig["overlap_ms"]["median"] == pytest.approx(4.65)
    assert fig["overlap_vs_graph"]["median"] == pytest.approx(4.70 / 4.6)     # of 1.011, 1.022, 1.022
    assert fig["overlap_ratio"]["max"] == pytest.approx(4.70 / 4.0)
    assert "overlap_vs_graph" in [r[0] for r in summary.floor_table(fig)["rows"]]
    cpu = [{"floor": dict(r["floor"], decode_graph_ms=None)} for r in runs]
    assert "overlap_vs_graph" not in summary.floor_figures(cpu) and "overlap_ms" in summary.floor_figures(cpu)


def test_the_floor_of_a_short_model_takes_the_context_it_has(tmp_path):
    """`dynspec profile --floor` on the embedded pair (1024 positions): the floor's decode runs at the
    context its positions leave beside the overlapped loop's slack, where 1024 + slack was refused."""
    import json
    import subprocess
    import sys

    out = tmp_path / "floor.json"
    r = subprocess.run([sys.executable, "-m", "dynspec.cli", "profile", "--floor", "--batch-sizes", "1",
                        "--draft-lens", "0,1", "--context-lens", "32", "--repeats", "2", "--warmup", "1",
                        "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    floor = json.loads(out.read_text())["floor"]
    assert 1000 <= floor["context_len"] < 1024 and floor["decode_ms"] > 0


def test_the_graph_replay_reads_the_decode_key_the_engine_routes(engine):
    """graph_replay_ms (CUDA) replays engine.graph_chains[key] for the key engine.route gives a
    plain decode plan: both exist on the reference engine and the key is its pure-decode one, so
    the floor's graph_ms is not silently None on a GPU."""
    from dynspec.benchmarks.step_timing import Shape, reserved_rows, synthetic_plan
    from dynspec.runtime.engines.reference.graph_keys import GraphKey, Route

    assert isinstance(engine.graph_chains, dict)
    with reserved_rows(engine, 1, 201) as slots:
        route, keys = engine.route(synthetic_plan(engine, Shape(1, 0, False), 200, slots))
    assert route is Route.DECODE_EAGER and keys == (GraphKey("decode", 1, sync="off"),)     # CPU: eager
