"""A 20-second version of the Triton soak (benchmarks/triton_soak.py): the tiny pair's server
under mixed good, malformed, cancelled and disconnected loopback load. Every good request must
succeed, every malformed one must be refused with its own message, the server must still be up
at the end, and nothing of it may be left after it stops (no process of its group, no /dev/shm
region). The 10-minute run with RSS slopes is benchmarks/scripts/triton_soak.sh. A served
executor keeps a bounded iteration-stats log, so that log cannot make a long-running server creep."""
import tracemalloc

import pytest

from dynspec.benchmarks.triton_soak import ROTATION, slope_kb_per_min, soak
from dynspec.runtime.serving.executor import Executor, IterationStats
from dynspec.runtime.policy import DraftSchedule


def test_slope_is_least_squares_after_the_warm_up():
    samples = [(0, 100, 900), (60, 200, 1000), (120, 300, 1000), (180, 300, 1060)]
    assert slope_kb_per_min(samples, 1, warmup_s=0) == pytest.approx(70.0)
    assert slope_kb_per_min(samples, 2, warmup_s=60) == pytest.approx(30.0)
    assert slope_kb_per_min(samples, 2, warmup_s=150) is None


@pytest.mark.slow
def test_short_soak_mixed_load(tmp_path):
    result = soak(minutes=1 / 3, clients=2, sample_s=5.0, workdir=tmp_path)
    assert result["failures"] == []
    assert set(result["counts"]) == set(ROTATION) and min(result["counts"].values()) >= 2, result["counts"]
    assert result["server_alive_at_end"]
    assert result["left_behind"] == {"processes": False, "shm_regions": []}
    assert all(s[2] > 0 for s in result["samples"]), "the python stub was not found"


def test_default_stats_log_stays_small():
    """A full default log must fit in 32 MiB: measured per-entry cost x the default bound."""
    ex = Executor(None, DraftSchedule.static(2, 4))      # the engine is not touched before submit
    n = 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = [IterationStats(i, 64, 3, 192, 100 + i % 7, 150 + i, 0.01 * i + 1e-3, 1e-4 * i + 1e-5, 64, i % 300)
                for i in range(n)]
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert len(held) == n and 100 < per_entry < 1000
    assert ex._stats.maxlen is not None
    assert ex._stats.maxlen * per_entry < 32 << 20
    assert ex._stats.maxlen >= 4096                      # the served monitor's window (model_metrics.STATS_KEPT)
