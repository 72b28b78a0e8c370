"""A 20-second version of the Triton soak (benchmarks/triton_soak.py): the tiny pair's server
under mixed good, malformed, cancelled and disconnected loopback load. Every good request must
succeed, every malformed one must be refused with its own message, the server must still be up
at the end, and nothing of it may be left after it stops (no process of its group, no /dev/shm
region). The 10-minute run with RSS slopes is benchmarks/scripts/triton_soak.sh."""
import pytest

from dynspec.benchmarks.triton_soak import ROTATION, slope_kb_per_min, soak


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
