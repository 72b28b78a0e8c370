"""The two H200 calls, run on CPU at toy sizes (benchmarks/scripts/cpu_smoke_h200.sh): the very
scripts the lead runs on the H200, end to end - prepare a random 'tiny' pair, profile --floor,
tune, 3-trial sweeps with matched Poisson, the fixed-length baseline, tarballs, summary version 2."""
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def members(tgz: Path) -> dict[str, bytes]:
    with tarfile.open(tgz) as t:
        return {Path(m.name).name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_h200_calls_cpu_smoke(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"), PYTHON=sys.executable)
    proc = subprocess.run(["bash", "benchmarks/scripts/cpu_smoke_h200.sh"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=380)
    logs = [tmp_path / "work" / d / f"h200_call{n}.log" for n, d in (("1", "results1"), ("2", "results2"))]
    tail = "\n".join(p.read_text()[-3000:] for p in logs if p.exists())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + tail
    # what the device tool brings back: one tarball per call under $OUT
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["h200_call1.tar.gz", "h200_call2.tar.gz"]

    one = members(tmp_path / "out" / "h200_call1.tar.gz")
    for name in ("h200_A.json", "h200_A.md", "h200_A.png", "h200_A_profile.json", "h200_A_schedule.txt",
                 "h200_A_tune.json", "h200_call1.log"):
        assert name in one, name
    prof = json.loads(one["h200_A_profile.json"])
    assert prof["gemm_floor_ms"] > 0 and prof["floor"]["context_len"] == 1024
    assert prof["floor"]["method"].startswith("cpu eager (no CUDA graph)")
    assert prof["floor"]["decode_graph_ms"] is None                  # no graphs on CPU
    a = json.loads(one["h200_A.json"])
    assert a["env"]["complete"] is True and a["env"]["trials"] == 3
    assert {r["concurrency"] for r in a["rows"]} == {1, 2}
    assert all(r["trials"] == 3 and r["tok_per_s_min"] <= r["output_tok_per_s"] <= r["tok_per_s_max"]
               for r in a["rows"])

    two = members(tmp_path / "out" / "h200_call2.tar.gz")
    for name in ("h200_B.json", "h200_B_fixed.json", "h200_B_profile.json", "h200_summary.json", "h200_call2.log"):
        assert name in two, name
    b = json.loads(two["h200_B.json"])
    assert {r["matched_concurrency"] for r in b["rows"] if r["concurrency"] is None} == {2}
    s = json.loads(two["h200_summary.json"])
    assert s["version"] == 2
    for key in ("decode_bandwidth_fraction", "dynamic_ratio_by_concurrency", "crossover_concurrency",
                "max_dynamic_gain", "c1_speedup", "host_overhead_fraction", "acceptance_model", "commands"):
        assert key in s, key
    assert s["decode_vs_gemm_floor"] == pytest.approx(prof["floor"]["decode_ms"] / prof["gemm_floor_ms"])
    assert set(s["varied_vs_fixed_baseline"]) == {"1", "2"} and all(v > 0 for v in s["varied_vs_fixed_baseline"].values())
    assert set(s["ttft_ms"]) == {"A", "B"}
    for regime in ("A", "B"):
        for mode in ("baseline", "static", "dynamic"):
            t = s["ttft_ms"][regime][mode]["2"]
            assert 0 < t["p50"] <= t["p99"]
            assert s["trial_spread"][regime][mode]["1"]["trials"] == 3
    assert s["figure_commands"]["decode_vs_gemm_floor"][0].startswith("dynspec profile ")
    assert "--floor" in s["figure_commands"]["decode_vs_gemm_floor"][0]


@pytest.mark.parametrize("script,summary,floor", [("h200_summary_c44.sh", "h200_summary.json", 1.1811),
                                                   ("h200_summary_c40.sh", "h200_summary_c40.json", 1.2185),
                                                   ("h200_summary_c34.sh", "h200_summary_c34.json", 1.1875),
                                                   ("h200_summary_c29.sh", "h200_summary_c29.json", 1.1806)])
def test_published_h200_summary_is_what_its_script_writes(tmp_path, script, summary, floor):
    """Each committed summary == what its script writes from the committed sweep, profile and tune
    files (the README's figures can be re-derived, on CPU): calls 41-44 (the current one), 36-40, 31-34,
    26-29."""
    import shutil

    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    (tmp_path / "benchmarks" / "results" / summary).unlink()
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/scripts" / script)], cwd=tmp_path,
                          env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads((tmp_path / "benchmarks" / "results" / summary).read_text())
    want = json.loads((ROOT / "benchmarks" / "results" / summary).read_text())
    assert got == want
    assert want["version"] == 2 and want["decode_vs_gemm_floor"] == pytest.approx(floor, abs=1e-4)
