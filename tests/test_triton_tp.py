"""The reference Triton variant under tensor parallelism, launched the way TRT-LLM launches its
Triton model (triton_repo/launch.py; docs/serving_with_triton.md, "Tensor parallel"):

    mpirun -n 2 python -m dynspec.triton_repo.launch REPO --tp 2

A real `mpirun`: MPI rank 0 is the launcher and its real `tritonserver`, whose python stub is TP
rank 0; MPI rank 1 is the worker. gloo, float64, a tiny random Llama + EAGLE-3 pair that splits
2 ways (4 heads / 2 KV heads), taken through `dynspec convert / build / triton` as a user would.
Oracle: the TP=1 executor on the same engine dir (equal to transformers greedy in float64:
tests/test_tp_cli.py, tests/test_inflight.py). After every launch: no process of the job is
left and the ports are free.
"""
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynspec.errors import DynspecError
from dynspec.triton_repo.launch import TpLaunch
from dynspec.triton_repo.ports import free_ports
from dynspec.triton_repo.workdir import WORKDIR_PREFIX, remove_stale_workdirs
from tests.helpers_models import make_tiny_draft, make_tiny_target
from tests.helpers_mpi import ONE_THREAD, mpirun
from tests.test_triton_launcher import alive, port_free
from tests.test_triton_launcher import children as descendants
from tests.test_triton_server import call, request

SCHEDULE = "2:4"                   # K=4 up to batch 2, plain decode above
# (prompt, max_tokens): long enough to overlap on the server (b up to 4, K=0) and to end apart (K=4 again)
JOBS = [((5, 6, 7), 20), ((9, 8, 7, 6, 5), 26), ((40, 41), 32), ((3, 100, 150, 20), 38)]


@dataclass(frozen=True)
class Chain:
    engine: Path
    repo: Path


def dynspec(*argv):
    from dynspec.cli import main

    assert main([str(a) for a in argv]) in (0, None), argv


def chain_for(d: Path, heads: int, kv_heads: int, tp: int) -> Chain:
    """HF pair -> `dynspec convert` at tp -> `dynspec build` (float64 reference engine) -> `dynspec triton`."""
    target = make_tiny_target(d / "hf_target", heads=heads, kv_heads=kv_heads, vocab=161, layers=4,
                              hidden=16 * heads)
    make_tiny_draft(d / "hf_draft", target, kv_heads=kv_heads, embed=True)
    dynspec("convert", "target", "--hf", d / "hf_target", "--out", d / "target", "--tp", tp, "--dtype", "float32")
    dynspec("convert", "eagle3", "--draft", d / "hf_draft", "--target", d / "target", "--out", d / "draft", "--tp", tp)
    dynspec("build", "--target", d / "target", "--draft", d / "draft", "--out", d / "engine", "--tp", tp,
            "--schedule", SCHEDULE, "--max-batch-size", 8, "--reference-dtype", "float64",
            "--reference-max-seq-len", 64)
    dynspec("triton", "--engine-dir", d / "engine", "--out", d / "repo")
    return Chain(d / "engine", d / "repo")


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    return chain_for(tmp_path_factory.mktemp("triton_tp"), heads=4, kv_heads=2, tp=2)


@pytest.fixture(scope="module")
def expected(chain):
    """JOBS run together on the TP=1 executor of the same engine dir."""
    import torch

    from dynspec.config import EngineConfig
    from dynspec.runtime.generate.session import open_executor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ex = open_executor(EngineConfig.load(chain.engine))
        handles = [ex.submit(p, n) for p, n in JOBS]
        ex.run_until_idle()
    finally:
        torch.set_num_threads(threads)
    return [list(h.result().output_ids) for h in handles]


# ----------------------------------------------------------------------------- the job

@dataclass
class Job:
    proc: subprocess.Popen
    out: Path
    err: Path
    ports: object

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


def launch(repo, tmp_path, n: int, tp: int, *, timeout_s: float = 30.0, hard_exit: bool = False) -> Job:
    """hard_exit: the workers leave as CUDA ranks do (tp_lifecycle.shutdown's hard_exit, which
    needs the launcher to hand its status to exit_status, or the clean stop ends in MPI Abort)."""
    ports = free_ports()
    out, err = tmp_path / f"mpirun{n}.out", tmp_path / f"mpirun{n}.err"
    cmd = [mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", str(n), *ONE_THREAD,
           "-x", f"DYNSPEC_TP_TIMEOUT_S={timeout_s:g}", "-x", f"DYNSPEC_TP_HARD_EXIT={int(hard_exit)}",
           sys.executable, "-m", "dynspec.triton_repo.launch",
           str(repo), "--tp", str(tp), "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
           "--metrics-port", str(ports.metrics), "--ready-timeout", "90"]
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, stdin=subprocess.DEVNULL, cwd=tmp_path)
    return Job(proc, out, err, ports)


def ready(job: Job, timeout: float = 90.0) -> int:
    """Wait for the ready line; the launcher's pid from it ('stop: kill -TERM PID')."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in job.stdout().splitlines():
            if line.startswith("tritonserver ready") and "stop: kill -TERM " in line:
                return int(line.rsplit("kill -TERM ", 1)[1].rstrip(")"))
        assert job.proc.poll() is None, f"mpirun exited with {job.proc.returncode}:\n{job.stderr()[-3000:]}"
        time.sleep(0.2)
    pytest.fail(f"no ready line after {timeout:.0f} s:\n{job.stdout()[-3000:]}\n{job.stderr()[-3000:]}")


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)


def name(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].rsplit(b"/", 1)[-1].decode()


def worker_pid(job: Job) -> int:
    found = [p for p in descendants(job.proc.pid)
             if "dynspec.triton_repo.launch" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
             and environ(p).get("OMPI_COMM_WORLD_RANK") == "1"]
    assert len(found) == 1, found
    return found[0]


def end(job: Job) -> None:
    """Whatever a failed test left: SIGTERM to mpirun first (it ends its ranks, and the launcher
    its server; a SIGKILLed mpirun would orphan them), then SIGKILL to what is left."""
    if job.proc.poll() is None:
        tree = descendants(job.proc.pid)
        job.proc.terminate()
        try:
            job.proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
        for pid in [job.proc.pid, *tree]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        job.proc.wait()


def all_gone(pids, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def dynspec_metrics(url: str) -> dict[str, float]:
    """{'dynspec_iterations_total{k="4"}': n, ...} without the model/version labels."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("dynspec_") and "{" in line:
            head, value = line.rsplit(" ", 1)
            fam, labels = head.split("{", 1)
            keep = ",".join(x for x in labels.rstrip("}").split(",") if not x.startswith(("model=", "version=")))
            out[f"{fam}{{{keep}}}"] = float(value)
    return out


# ----------------------------------------------------------------------------- tests

def test_tp_launch_travels_through_the_environment_and_bad_values_are_named():
    launch_ = TpLaunch("127.0.0.1:29500", 2, "/e", "cpu", 0, 3.0, 90.0)
    assert TpLaunch.from_env(launch_.env()) == launch_
    assert TpLaunch.from_env({}) is None                        # a plain server.py launch
    with pytest.raises(DynspecError, match="DYNSPEC_TP_SIZE='two' must be a number >= 1"):
        TpLaunch.from_env({**launch_.env(), "DYNSPEC_TP_SIZE": "two"})
    with pytest.raises(DynspecError, match=r"TP endpoint '127.0.0.1' is not HOST:PORT"):
        TpLaunch.from_env({**launch_.env(), "DYNSPEC_TP_ENDPOINT": "127.0.0.1"})
    with pytest.raises(DynspecError, match="DYNSPEC_TP_JOIN_TIMEOUT_S is not"):
        TpLaunch.from_env({k: v for k, v in launch_.env().items() if k != "DYNSPEC_TP_JOIN_TIMEOUT_S"})
    with pytest.raises(DynspecError, match=r"config.pbtxt parameter device='cuda', but the launcher's workers "
                                           r"load device='cpu'"):
        launch_.check_model("/e", "cuda")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tp2_server_gives_the_tp1_tokens_and_stops_cleanly(chain, expected, tmp_path):
    job = launch(chain.repo, tmp_path, 2, 2, hard_exit=True)
    try:
        launcher = ready(job)
        tree = descendants(job.proc.pid)
        stub = next(p for p in tree if name(p) == "triton_python_backend_stub")
        env = environ(stub)
        assert env["DYNSPEC_TP_SIZE"] == "2" and env["DYNSPEC_TP_ENDPOINT"].startswith("127.0.0.1:")
        assert not [k for k in env if k.startswith(("OMPI_", "PMIX_"))]          # TP rank 0 is no MPI rank
        worker = worker_pid(job)
        with ThreadPoolExecutor(len(JOBS)) as pool:                             # one dynamic batch
            replies = list(pool.map(lambda i: call(job, request(prompt_ids=list(JOBS[i][0]), max_tokens=JOBS[i][1],
                                                                end_id=-1, stream=i % 2 == 0), timeout=60),
                                    range(len(JOBS))))
        assert [r.error for r in replies] == [None] * len(JOBS)
        assert [r.ids for r in replies] == expected
        deadline = time.monotonic() + 10                     # the model publishes every 50 ms
        while True:
            m = dynspec_metrics(job.metrics_url)
            k4, k0 = m.get('dynspec_iterations_total{k="4"}', 0), m.get('dynspec_iterations_total{k="0"}', 0)
            if (k4 and k0) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert k4 > 0 and k0 > 0, m                          # K followed the batch both ways, over 2 ranks
        t0 = time.monotonic()
        os.kill(launcher, signal.SIGTERM)
        assert job.proc.wait(30) == 0, job.stderr()[-3000:]
        assert time.monotonic() - t0 < 20
        assert "[dynspec rank 1] STOP from the leader after" in job.stderr()
        assert all_gone(tree | {worker}) == []
        assert all(port_free(p) for p in (job.ports.http, job.ports.grpc, job.ports.metrics))
    finally:
        end(job)


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("n, tp, message", [
    (2, 3, "error: mpirun -n 2 is not a multiple of --tp 3 (2 % 3 = 2); launch -n R*3 for R replicas of 3 ranks"),
    (4, 2, "error: mpirun -n 4 with --tp 2 would make 2 replicas; one Triton server serves one replica: launch -n 2 "
           "(and another launcher, on other ports, for another replica)"),
    (2, 2, "num_attention_heads=3 is not divisible by tp=2 (3 % 2 = 1)"),
])
def test_a_launch_that_cannot_work_is_refused_before_the_server_starts(chain, tmp_path, n, tp, message):
    repo = chain.repo if message.startswith("error: mpirun") else chain_for(tmp_path / "odd", 3, 3, 1).repo
    job = launch(repo, tmp_path, n, tp)
    try:
        assert job.proc.wait(60) == 2, job.stderr()[-3000:]
    finally:
        end(job)
    err = job.stderr()
    assert err.count(message) == 1, err[-3000:]                     # rank 0 alone says it
    if not message.startswith("error: mpirun"):
        assert f"error: TP=2 is infeasible for {(repo.parent / 'target').resolve() / 'config.json'}" in err
    assert "tritonserver" not in job.stdout()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_hung_worker_fails_the_request_within_the_timeout_and_ends_the_job(chain, tmp_path):
    job = launch(chain.repo, tmp_path, 2, 2, timeout_s=5)
    try:
        ready(job)
        tree = descendants(job.proc.pid)
        os.kill(worker_pid(job), signal.SIGSTOP)
        t0 = time.monotonic()
        reply = call(job, request(prompt_ids=[5, 6, 7], max_tokens=12, end_id=-1), timeout=30)
        took = time.monotonic() - t0
        assert reply.error is not None and reply.error.startswith("tensor-parallel group failed: TP rank 0"), reply
        assert "(timeout 5 s)" in reply.error and took < 5 + 5, (reply.error, took)
        assert job.proc.wait(30) != 0                          # the launcher aborts the MPI job
        err = job.stderr()
        assert "error: TP rank 0 (the python stub) reported a fault: " in err
        assert "error: tritonserver is stopped; aborting the 2 MPI ranks (exit status 1)" in err
        assert all_gone(tree) == []                            # the stopped worker included (mpirun: SIGCONT, SIGTERM)
    finally:
        end(job)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", ["worker", "tritonserver", "launcher"])
def test_a_killed_process_ends_the_job_and_leaves_no_server(chain, tmp_path, victim):
    """SIGKILL, which nothing can handle: the worker (mpirun ends the job), tritonserver (the
    launcher sees it gone, cleans up and aborts the job), the launcher (tritonserver gets its
    parent-death signal). Nothing of the job is left, /dev/shm regions included."""
    job = launch(chain.repo, tmp_path, 2, 2)
    try:
        launcher = ready(job)
        tree = descendants(job.proc.pid)
        assert {"tritonserver", "triton_python_backend_stub"} <= {name(p) for p in tree}
        pid = {"worker": lambda: worker_pid(job), "launcher": lambda: launcher,
               "tritonserver": lambda: next(p for p in tree if name(p) == "tritonserver")}[victim]()
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        assert job.proc.wait(30) != 0
        assert all_gone(tree) == [], [(p, name(p)) for p in tree if alive(p)]
        assert time.monotonic() - t0 < 20
        assert list(Path("/dev/shm").glob(f"dynspec_{launcher}_*")) == []
        if victim == "tritonserver":
            assert "error: tritonserver exited with signal 9" in job.stderr()
        # the launcher's private folder: removed by the launcher where it outlived its server
        # (a killed worker: mpirun's SIGKILL may come before), else by the next launch's sweep
        mine = f"{WORKDIR_PREFIX}{launcher}-"
        left = [d for d in remove_stale_workdirs() if d.name.startswith(mine)]
        if victim == "tritonserver":
            assert left == []
        elif victim == "launcher":
            assert len(left) == 1, left
        else:
            assert len(left) <= 1, left
        assert not list(Path(tempfile.gettempdir()).glob(mine + "*"))
    finally:
        end(job)


@pytest.mark.timeout(60)
def test_a_rendezvous_port_that_cannot_be_bound_is_refused_on_every_rank(chain, tmp_path):
    """DYNSPEC_TP_PORT names the store's port; a taken one ends the launch with exit status 2 and
    one message naming it, on every rank (none waits for the endpoint). MASTER_PORT is ignored."""
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", "2", *ONE_THREAD,
               "-x", f"DYNSPEC_TP_PORT={port}", "-x", "MASTER_PORT=1", sys.executable, "-m",
               "dynspec.triton_repo.launch", str(chain.repo), "--tp", "2"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count(f"error: cannot host the TP rendezvous on port {port} (DYNSPEC_TP_PORT)") == 1
