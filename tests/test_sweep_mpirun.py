"""CI smoke test of the benchmark sweep: a real `mpirun -n 2` over the tiny trained pair on CPU,
C in {1, 4}, baseline/static/dynamic, checked end to end (JSON, PNG, MD, sane values).
Plus the world-of-one path and the `--engine trtllm` error without TensorRT-LLM."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dynspec.benchmarks import sweep, sweep_modes
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.generate.session import tiny_pair_dirs
from tests.helpers_mpi import mpirun

SCHEDULE = "2:3"          # dynamic: K=3 for batches 1..2, K=0 above (so C=4 crosses the threshold)
STATIC_K = 3
OUTPUT_LEN = 12


@pytest.fixture(scope="module")
def tiny_pair():
    target, draft = tiny_pair_dirs()
    if not (Path(target) / "config.json").is_file():
        pytest.fail(f"the embedded tiny pair is missing at {target}; build it with"
                    " `python -m dynspec.pairs.tiny_pair --out dynspec/assets/tiny`")
    return target, draft


def check_rows(doc, replicas, requests_per_replica):
    rows = doc["rows"]
    assert {(r["mode"], r["concurrency"]) for r in rows} == {(m, c) for m in sweep_modes.MODES for c in (1, 4)}
    dyn = DraftSchedule.parse(SCHEDULE)
    for r in rows:
        where = f"{r['mode']} C={r['concurrency']}"
        assert r["acceptance_model"] == "real", where
        assert r["output_tok_per_s"] > 0 and r["duration_s"] > 0, where
        assert r["replicas"] == replicas and len(r["per_replica_tok_per_s"]) == replicas, where
        assert r["num_requests"] == replicas * requests_per_replica, where
        assert r["output_tokens"] == r["num_requests"] * OUTPUT_LEN, where     # no stop ids: full length
        assert 0 < r["p50_latency_s"] <= r["p99_latency_s"], where
        assert r["ttft_s"] > 0 and r["tpot_s"] > 0, where
        assert max(b for b, _, _ in r["k_by_batch"]) <= r["concurrency"], where
        ks = {(b, k) for b, k, _ in r["k_by_batch"]}
        if r["mode"] == "baseline":
            assert r["mean_k"] == 0 and all(k == 0 for _, k in ks), where
            assert r["mean_accepted_len"] == 1.0 and r["acceptance_rate"] is None, where
            assert r["draft_sync"] == "off", where
        elif r["mode"] == "static":
            assert r["mean_k"] == STATIC_K and all(k == STATIC_K for _, k in ks), where
        else:
            assert all(k == dyn.draft_len(b) for b, k in ks), (where, ks)
        if r["mean_k"] > 0:
            # the tiny pair is trained, so greedy verification accepts real drafts
            assert r["acceptance_rate"] > 0 and r["mean_accepted_len"] > 1.0, where
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    assert by[("dynamic", 1)]["mean_k"] == 3
    assert by[("dynamic", 4)]["mean_k"] < 3           # b=4 > 2 runs plain decode


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mpirun_two_replicas_tiny_pair(tmp_path, tiny_pair):
    target, draft = tiny_pair
    out = tmp_path / "results" / "smoke"
    cmd = [mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "NCCL_NVLS_ENABLE=0",
           sys.executable, "-m", "dynspec.benchmarks.sweep", "--engine", "reference",
           "--target", target, "--draft", draft, "--schedule", SCHEDULE, "--static-k", str(STATIC_K),
           "--concurrency", "1,4", "--modes", "baseline,static,dynamic", "--acceptance", "real",
           "--prompts", "stdlib", "--input-len", "24", "--output-len", str(OUTPUT_LEN), "--num-requests", "4",
           "--device", "cpu", "--out", str(out)]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert wall < 120, f"smoke sweep took {wall:.0f} s"

    doc = json.loads((out.parent / "smoke.json").read_text())
    env_block = doc["env"]
    assert env_block["world_size"] == 2 and env_block["replicas"] == 2
    assert env_block["acceptance_model"] == "real" and env_block["acceptance_lossless"] is True
    assert env_block["command"].startswith("mpirun -n 2 python -m dynspec.benchmarks.sweep ")
    assert env_block["versions"]["torch"] and env_block["device"].startswith("cpu")
    assert env_block["schedules"] == {"baseline": "", "static": "4:3", "dynamic": SCHEDULE}
    assert env_block["nccl_env"] == {"NCCL_NVLS_ENABLE": "0"}
    check_rows(doc, replicas=2, requests_per_replica=4)

    png = (out.parent / "smoke.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    md = (out.parent / "smoke.md").read_text()
    for m in sweep_modes.MODES:
        assert f"| {m} | C=1 |" in md and f"| {m} | C=4 |" in md
    assert "acceptance model: **real**" in md
    # only rank 0 logs
    assert proc.stderr.count("sweep: 2 load points") == 1


def test_world_of_one_without_mpirun(tmp_path, capsys):
    from tests.helpers_models import make_tiny_draft, make_tiny_target

    target = make_tiny_target(tmp_path / "target", vocab=96, hidden=32, layers=4, heads=4, kv_heads=2)
    draft = make_tiny_draft(tmp_path / "draft", target)
    out = tmp_path / "one"
    rc = sweep.main(["--target", str(target), "--draft", str(draft), "--schedule", "1:2", "--concurrency", "1,2",
                     "--modes", "baseline,dynamic", "--acceptance", "bernoulli:0.7", "--input-len", "4:8",
                     "--output-len", "6", "--num-requests", "3", "--no-progress", "--warmup-requests", "0", "--trials", "2",
                     "--save-workload", str(tmp_path / "w.jsonl"), "--out", str(out)])
    assert rc == 0
    doc = json.loads((tmp_path / "one.json").read_text())
    assert doc["env"]["world_size"] == 1 and doc["env"]["acceptance_model"] == "bernoulli:0.7"
    assert doc["env"]["acceptance_lossless"] is False
    rows = {(r["mode"], r["concurrency"]): r for r in doc["rows"]}
    assert set(rows) == {("baseline", 1), ("baseline", 2), ("dynamic", 1), ("dynamic", 2)}
    assert all(r["acceptance_model"] == "bernoulli:0.7" for r in rows.values())
    assert rows[("dynamic", 1)]["mean_k"] == 2
    assert all(r["trials"] == 2 and len(r["trial_tok_per_s"]) == 2 for r in rows.values())
    assert doc["env"]["trials"] == 2
    # Bernoulli(0.7) on random weights: about 0.7 of drafts accepted, not the ~0 of real acceptance
    assert 0.3 < rows[("dynamic", 1)]["acceptance_rate"] < 0.95
    assert all(k == (2 if b == 1 else 0) for b, k, _ in rows[("dynamic", 2)]["k_by_batch"])
    assert len((tmp_path / "w.jsonl").read_text().splitlines()) == 3
    # the same workload replays through --dataset
    rc = sweep.main(["--target", str(target), "--draft", str(draft), "--schedule", "1:2", "--concurrency", "1",
                     "--modes", "static", "--dataset", str(tmp_path / "w.jsonl"), "--num-requests", "3",
                     "--no-progress", "--out", str(tmp_path / "two")])
    assert rc == 0
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["rows"][0]["output_tokens"] == 18 and two["rows"][0]["mean_k"] == 2


def test_trtllm_engine_fails_clearly_without_tensorrt_llm(tmp_path, capsys):
    pytest.importorskip("torch")
    try:
        import tensorrt_llm  # noqa: F401
        pytest.skip("tensorrt_llm is installed here")
    except ImportError:
        pass
    rc = sweep.main(["--engine", "trtllm", "--engine-dir", str(tmp_path), "--out", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--engine trtllm needs TensorRT-LLM" in err and "trtllm-llmapi-launch" in err
    assert "tensorrt_llm" not in sys.modules


def test_bad_flags_name_the_value(tmp_path, capsys):
    rc = sweep.main(["--concurrency", "1,x", "--out", str(tmp_path / "x")])
    assert rc == 2
    assert "--concurrency '1,x'" in capsys.readouterr().err


def test_trtllm_mode_options_are_rendered_from_one_schedule():
    from dynspec.benchmarks.trtllm_driver import mode_options, steps_from_stats
    from dynspec.runtime.engines.trtllm import draft_lengths

    base = {"model": "/m", "backend": "pytorch", "tensor_parallel_size": 8, "max_batch_size": 256,
            "enable_iter_perf_stats": True,
            "speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model_dir": "/d",
                                   "eagle3_one_model": False, "draft_len_schedule": {1: 4, 5: 0}}}
    sched = DraftSchedule.parse("4:4,8:2")
    b = mode_options(base, "baseline", DraftSchedule(), 0, "1.2.1")
    assert "speculative_config" not in b and "model" not in b and "backend" not in b
    assert b["enable_iter_perf_stats"] is True and b["tensor_parallel_size"] == 8
    s = mode_options(base, "static", DraftSchedule.static(3, 256), 3, "1.2.1")["speculative_config"]
    assert s["max_draft_len"] == 3 and "draft_len_schedule" not in s
    d = mode_options(base, "dynamic", sched, 4, "1.2.1")["speculative_config"]
    assert d["draft_len_schedule"] == {1: 4, 5: 2, 9: 0} and d["max_draft_len"] == 4     # 1.2.x: lower bounds
    d13 = mode_options(base, "dynamic", sched, 4, "1.3.0")["speculative_config"]
    assert d13["draft_len_schedule"] == {4: 4, 8: 2}                                       # 1.3: upper bounds
    assert base["speculative_config"]["draft_len_schedule"] == {1: 4, 5: 0}                # input untouched
    steps = steps_from_stats([
        json.dumps({"numActiveRequests": 4, "iterLatencyMS": 12.0,
                    "specDecodingStats": {"numDraftTokens": 16, "numAcceptedTokens": 9, "numRequestsWithDraftTokens": 4}}),
        {"numActiveRequests": 9, "iterLatencyMS": 10.0},
        {"numActiveRequests": 0},
    ], draft_lengths(base, "1.2.1"))
    assert [(s.batch_size, s.k, s.drafted, s.accepted) for s in steps] == [(4, 4, 16, 9), (9, 0, 0, 0)]
    assert steps[0].seconds == pytest.approx(0.012)
