"""The user-facing commands under tensor parallelism (docs/tensor_parallel.md): real `mpirun`,
gloo, float64, one OpenMP thread per rank, a tiny random Llama + EAGLE-3 pair (4 heads, 2 KV
heads). Oracles: `dynspec generate --tp 1` in this process and transformers greedy.

    mpirun -n 2 dynspec generate --tp 2 ...   one replica of 2 ranks  == TP=1 == transformers
    mpirun -n 4 dynspec generate --tp 2 ...   2 replicas, prompts r::2 each; rank 0 writes all
    mpirun -n 2 dynspec sweep --tp 2 ...      one JSON from the leader
Plus, in process: the argmax hook the engine calls, float64 refused on CUDA, open_executor's
stats_limit.
"""
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dynspec.cli import main as dynspec_main
from dynspec.errors import DynspecError
from tests.helpers_models import make_tiny_draft, make_tiny_target
from tests.helpers_mpi import ONE_THREAD, mpirun

SCHEDULE = "2:4"           # K=4 up to batch 2, plain decode above: concurrency 3 flips K both ways
MAX_NEW = 12


def dynspec_exe() -> str:
    here = Path(sys.executable).parent / "dynspec"
    return str(here) if here.exists() else shutil.which("dynspec")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp_cli")
    target = make_tiny_target(d / "target", heads=4, kv_heads=2, vocab=161, layers=4)
    draft = make_tiny_draft(d / "draft", target, kv_heads=2, embed=True)
    g = torch.Generator().manual_seed(1)
    prompts = d / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(5):
            f.write(json.dumps({"id": f"p{i}", "input_ids": torch.randint(2, 160, (3 + i,), generator=g).tolist()}) + "\n")
    return str(target), str(draft), str(prompts)


def generate_args(pair, out, *extra) -> list[str]:
    return ["generate", "--target", pair[0], "--draft", pair[1], "--prompts", pair[2], "--out", str(out),
            "--dtype", "float64", "--schedule", SCHEDULE, "--concurrency", "3", "--max-new-tokens", str(MAX_NEW),
            "--max-seq-len", "64", *extra]


def run_mpi(n: int, args: list[str], cwd, timeout: float = 60):
    cmd = [mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", str(n), *ONE_THREAD, dynspec_exe(), *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return proc, time.monotonic() - t0


def read_out(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def tp1(pair, tmp_path_factory):
    """`dynspec generate --tp 1` in this process, checked against transformers greedy."""
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("tp1") / "tp1.jsonl"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert dynspec_main(generate_args(pair, out, "--tp", "1")) == 0
    finally:
        torch.set_num_threads(threads)
    got = read_out(out)
    hf = LlamaForCausalLM.from_pretrained(pair[0], dtype=torch.float64).eval()
    for row in got:
        p = next(json.loads(x)["input_ids"] for x in Path(pair[2]).read_text().splitlines()
                 if json.loads(x)["id"] == row["id"])
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
        assert row["output_ids"] == ref[0, len(p):].tolist(), f"TP=1 differs from transformers greedy on {row['id']}"
    return got


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mpirun_generate_tp2_equals_tp1_and_transformers(tmp_path, pair, tp1):
    out = tmp_path / "tp2.jsonl"
    proc, wall = run_mpi(2, generate_args(pair, out, "--tp", "2"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_out(out) == tp1
    assert proc.stdout.count("schedule 2:4  concurrency 3") == 1          # only rank 0 prints
    assert wall < 40, f"mpirun -n 2 generate took {wall:.1f} s"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mpirun_generate_two_replicas_of_tp2(tmp_path, pair, tp1):
    out, stats = tmp_path / "r2.jsonl", tmp_path / "r2_stats.jsonl"
    proc, wall = run_mpi(4, generate_args(pair, out, "--tp", "2", "--stats", str(stats)), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_out(out) == tp1                                         # prompts back in file order
    rows = read_out(stats)
    assert {r["replica"] for r in rows} == {0, 1}
    emitted = {r: sum(s["emitted"] for s in rows if s["replica"] == r) for r in (0, 1)}
    assert emitted == {0: 3 * MAX_NEW, 1: 2 * MAX_NEW}                  # replica 0: p0, p2, p4; 1: p1, p3
    assert all(s["k"] == (4 if s["batch_size"] <= 2 else 0) for s in rows if s["batch_size"] > 0)
    assert proc.stdout.count("schedule 2:4") == 1
    assert wall < 40, f"mpirun -n 4 generate took {wall:.1f} s"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mpirun_sweep_tp2_writes_one_json(tmp_path, pair):
    out = tmp_path / "res" / "tp2"
    args = ["sweep", "--tp", "2", "--target", pair[0], "--draft", pair[1], "--schedule", SCHEDULE,
            "--concurrency", "1,3", "--modes", "baseline,dynamic", "--acceptance", "real", "--input-len", "4:8",
            "--output-len", "6", "--num-requests", "3", "--trials", "1", "--warmup-requests", "1", "--no-progress",
            "--out", str(out)]
    proc, wall = run_mpi(2, args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.parent.iterdir()) == ["tp2.json", "tp2.md", "tp2.png"]
    doc = json.loads((out.parent / "tp2.json").read_text())
    assert doc["env"]["complete"] and (doc["env"]["world_size"], doc["env"]["replicas"], doc["env"]["tp"]) == (2, 1, 2)
    rows = {(r["mode"], r["concurrency"]): r for r in doc["rows"]}
    assert set(rows) == {(m, c) for m in ("baseline", "dynamic") for c in (1, 3)}
    assert all(r["num_requests"] == 3 and r["output_tokens"] == 18 and r["replicas"] == 1 for r in rows.values())
    assert rows[("dynamic", 1)]["mean_k"] == 4 and rows[("baseline", 3)]["mean_k"] == 0
    assert proc.stderr.count("sweep: 2 load points") == 1                # only rank 0 logs
    assert wall < 40, f"mpirun -n 2 sweep took {wall:.1f} s"


# ----------------------------------------------------------------------------- in process

def test_engine_takes_every_argmax_through_the_collectives(pair):
    """The engine asks Collectives.argmax for every greedy id (so a TP engine can use the
    vocabulary-parallel argmax); the tokens stay those of the plain argmax."""
    from dynspec.runtime.serving.driver import run_closed_loop
    from dynspec.runtime.engines.reference.load import load_reference_engine
    from dynspec.runtime.engines.reference.model import Collectives
    from dynspec.runtime.serving.executor import Executor
    from dynspec.runtime.policy import DraftSchedule

    class Counting(Collectives):
        def __init__(self):
            self.rows = 0

        def argmax(self, logits):
            self.rows += logits.shape[0]
            return super().argmax(logits)

    engine = load_reference_engine(pair[0], pair[1], dtype="float64", max_batch_size=3, max_seq_len=64,
                                   max_draft_len=4)
    tc, dc = Counting(), Counting()
    engine.target.collectives, engine.draft.collectives = tc, dc
    prompts = [json.loads(x)["input_ids"] for x in Path(pair[2]).read_text().splitlines()]
    res = run_closed_loop(Executor(engine, DraftSchedule.parse(SCHEDULE)), prompts, MAX_NEW, 3)
    assert tc.rows >= len(prompts) * MAX_NEW / 5 and dc.rows > 0     # every verify row, every draft row
    plain = load_reference_engine(pair[0], pair[1], dtype="float64", max_batch_size=3, max_seq_len=64,
                                  max_draft_len=4)
    ref = run_closed_loop(Executor(plain, DraftSchedule.parse(SCHEDULE)), prompts, MAX_NEW, 3)
    assert [r.output_ids for r in res] == [r.output_ids for r in ref]


def test_float64_is_refused_on_cuda(pair, capsys):
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.generate.session import engine_config_for, open_reference_engine
    from dynspec.config import ReferenceSettings

    cfg = engine_config_for(pair[0], pair[1], DraftSchedule.parse(SCHEDULE), ReferenceSettings(dtype="float64"))
    with pytest.raises(DynspecError, match="dtype float64 is for CPU exactness tests; device cuda takes"):
        open_reference_engine(cfg, device="cuda")
    assert dynspec_main(["generate", "--dtype", "float64", "--device", "cuda"]) == 2
    assert "--dtype float64 is for CPU exactness tests; --device cuda takes float32, bfloat16 or float16" \
        in capsys.readouterr().err


def test_open_executor_bounds_its_stats_log(pair):
    from dynspec.runtime.serving.driver import run_closed_loop
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.generate.session import engine_config_for, open_executor

    cfg = engine_config_for(pair[0], pair[1], DraftSchedule.parse(SCHEDULE))
    ex = open_executor(cfg, stats_limit=3, max_batch_size=2, max_seq_len=64)
    run_closed_loop(ex, [[5, 6, 7]], 8, 1)
    assert [s.iteration for s in ex.stats] == [5, 6, 7]          # 8 iterations, the newest 3 kept


def test_interleave_puts_replica_shares_back_in_prompt_order():
    from dynspec.runtime.generate.generate_report import interleave

    assert interleave([["a0", "a2", "a4"], ["a1", "a3"]], 5) == ["a0", "a1", "a2", "a3", "a4"]
    assert interleave([["a0"]], 1) == ["a0"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mpirun_profile_tp2_leader_writes_the_profile(tmp_path, pair):
    out = tmp_path / "prof.json"
    args = ["profile", "--tp", "2", "--target", pair[0], "--draft", pair[1],
            "--batch-sizes", "1,2", "--draft-lens", "0,2", "--context-lens", "16", "--warmup", "1", "--repeats", "3",
            "--no-progress", "--out", str(out)]
    proc, wall = run_mpi(2, args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    prof = json.loads(out.read_text())
    assert (prof["tp"], prof["replicas"]) == (2, 1)
    (table,) = prof["tables"]
    assert table["context_len"] == 16
    assert set(table["iteration_ms"]) == {"1", "2"} and all(set(r) == {"0", "2"} for r in table["iteration_ms"].values())
    assert all(ms > 0 for r in table["iteration_ms"].values() for ms in r.values())
    assert prof["replica_decode_ms"] == [[table["decode_ms"]]]
    assert proc.stderr.count("wrote ") == 1 and proc.stdout.count("K=2 ms") == 1   # the leader alone reports
    assert wall < 40, f"mpirun -n 2 profile took {wall:.1f} s"
