"""`python -m dynspec.triton_repo.server` as a process: signals stop the whole server, and a port
that another process already answers on is a failure, not "ready".

The repository comes from the embedded tiny pair through the commands a newcomer runs, the ones
docs/serving_with_triton.md shows:

    TINY=$(python -c "import dynspec, pathlib; print(pathlib.Path(dynspec.__file__).parent / 'assets/tiny')")
    dynspec convert target --hf $TINY/target --out tiny/target --tp 1
    dynspec convert eagle3 --draft $TINY/draft --target tiny/target --out tiny/draft --tp 1
    dynspec build --target tiny/target --draft tiny/draft --out tiny/engine --tp 1 --schedule 4:4 --max-batch-size 8
    dynspec triton --engine-dir tiny/engine --out tiny/triton
    python -m dynspec.triton_repo.server tiny/triton

Each test runs the real launcher CLI and checks, after it exits, that no process of the server's
group is left, the port is free again and no /dev/shm region of the launch remains."""
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dynspec.config import EngineConfig
from dynspec.triton_repo.ports import Ports, free_ports, owns_listener, parent_pids
from dynspec.triton_repo.server_process import error_lines, exit_reason


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The serving guide's chain, run through the CLI: -> the tiny pair's engine dir and Triton repository."""
    import dynspec
    from dynspec.cli import main

    tiny = Path(dynspec.__file__).parent / "assets/tiny"
    out = tmp_path_factory.mktemp("chain") / "tiny"
    steps = [
        ["convert", "target", "--hf", f"{tiny}/target", "--out", f"{out}/target", "--tp", "1"],
        ["convert", "eagle3", "--draft", f"{tiny}/draft", "--target", f"{out}/target", "--out", f"{out}/draft",
         "--tp", "1"],
        ["build", "--target", f"{out}/target", "--draft", f"{out}/draft", "--out", f"{out}/engine", "--tp", "1",
         "--schedule", "4:4", "--max-batch-size", "8"],
        ["triton", "--engine-dir", f"{out}/engine", "--out", f"{out}/triton"],
    ]
    for argv in steps:
        assert main(argv) in (0, None), argv
    return out / "engine", out / "triton"


@pytest.fixture(scope="module")
def repo(chain):
    return chain[1]


@pytest.fixture(scope="module")
def expected(chain):
    """The prompt's greedy continuation from the same engine dir, run offline (the oracle)."""
    import torch

    from dynspec.runtime.generate.session import open_executor
    from dynspec.triton_repo.serving import load_model_info

    cfg = EngineConfig.load(chain[0])
    info = load_model_info(cfg.target_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ex = open_executor(cfg)
        h = ex.submit(tuple(info.tokenizer.encode(PROMPT)), 12, info.eos_ids)
        ex.run_until_idle()
    finally:
        torch.set_num_threads(threads)
    return list(h.result().output_ids), info.decode(h.result().output_ids)


PROMPT = "import os\n\ndef main():"


def start(repo, ports, *extra, ready_timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "dynspec.triton_repo.server", str(repo), "--http-port", str(ports.http),
         "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics), "--ready-timeout",
         str(ready_timeout), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def children(pid):
    """pid -> every descendant pid."""
    parent = parent_pids()
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found.update(kids)
        todo += kids
    return found


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def shm_regions(launcher_pid):
    return sorted(p.name for p in Path("/dev/shm").glob(f"dynspec_{launcher_pid}_*"))


def read_until(stream, text, timeout):
    """Lines of `stream` up to the one containing `text` (the stream is read in a thread)."""
    lines, hit = [], threading.Event()

    def read():
        for raw in stream:
            line = raw.decode(errors="replace")
            lines.append(line)
            if text in line:
                hit.set()
                return

    threading.Thread(target=read, daemon=True).start()
    hit.wait(timeout)
    return hit.is_set(), lines


def test_error_lines_strip_the_glog_prefix():
    log = ("I1130 21:59:35.9 1 server.cc:1] started\n"
           "E1130 22:01:02.345678 12465 main.cc:307] failed to start HTTP service: Socket '127.0.0.1:8000' in use\n")
    assert error_lines(log) == ["failed to start HTTP service: Socket '127.0.0.1:8000' in use"]


def test_free_ports_lie_outside_the_ephemeral_range_and_bind(monkeypatch, tmp_path):
    """Ports the kernel never hands to an outgoing connection or a bind(0); with none of those
    left (a range file that claims them all), the kernel's own choice."""
    from dynspec.triton_repo import ports as ports_mod

    low, high = ports_mod.ephemeral_range()
    for _ in range(20):
        got = free_ports()
        assert len({got.http, got.grpc, got.metrics}) == 3
        for port in (got.http, got.grpc, got.metrics):
            assert not low <= port <= high and port >= ports_mod.LOWEST, (port, low, high)
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
    from dynspec.errors import DynspecError

    with pytest.raises(DynspecError, match="'nosuch.invalid' does not resolve"):
        free_ports("nosuch.invalid")
    with pytest.raises(DynspecError, match="10.254.254.254 is not an address of this machine"):
        free_ports("10.254.254.254")
    claims_all = tmp_path / "ip_local_port_range"
    claims_all.write_text(f"{ports_mod.LOWEST}\t65535\n")
    monkeypatch.setattr(ports_mod, "EPHEMERAL", claims_all)
    assert ports_mod.ephemeral_range() == (ports_mod.LOWEST, 65535)
    got = free_ports()
    assert len({got.http, got.grpc, got.metrics}) == 3 and min(got.http, got.grpc, got.metrics) > 0


def test_a_workdir_is_stale_once_no_process_holds_its_lock(tmp_path, monkeypatch):
    """A launcher that exits without cleaning up, whose server (a child given the lock's fd)
    lives on: the folder stays while the child lives and goes at the first sweep after. A link,
    another folder without a lock file, and this process's own live folder are left alone."""
    import tempfile

    from dynspec.triton_repo import workdir as wd

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine, fd = wd.make_workdir()
    assert mine.parent == tmp_path and (mine / wd.LOCK).is_file() and not (mine / f"{wd.LOCK}.new").exists()
    code = ("import os, subprocess, sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
            "from dynspec.triton_repo.workdir import make_workdir\n"
            "d, fd = make_workdir()\n"
            "child = subprocess.Popen(['sleep', '30'], pass_fds=(fd,), start_new_session=True,\n"
            "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(d, child.pid, flush=True)\n"
            "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    orphan, child = Path(out.split()[0]), int(out.split()[1])
    (tmp_path / f"{wd.WORKDIR_PREFIX}nolock").mkdir()
    (tmp_path / f"{wd.WORKDIR_PREFIX}link").symlink_to(orphan)
    try:
        assert wd.remove_stale_workdirs(tmp_path) == [] and orphan.is_dir()     # its server lives
    finally:
        os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wd.remove_stale_workdirs(tmp_path) == [orphan]
    assert mine.is_dir() and (tmp_path / f"{wd.WORKDIR_PREFIX}nolock").is_dir()
    os.close(fd)                                       # the launcher's hold ends, its folder left
    assert wd.remove_stale_workdirs(tmp_path) == [mine]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{wd.WORKDIR_PREFIX}link", f"{wd.WORKDIR_PREFIX}nolock"]


def test_owns_listener_tells_this_process_from_another():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert owns_listener(os.getpid(), port)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not owns_listener(child.pid, port)
        finally:
            child.kill()
            child.wait()
    assert not owns_listener(os.getpid(), port)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_tritonserver_and_its_stub(repo, expected, signum):
    import json
    import urllib.request

    ports = free_ports()
    proc = start(repo, ports)
    try:
        ready, lines = read_until(proc.stdout, "tritonserver ready", 150)
        assert ready, "".join(lines[-30:])
        body = json.dumps({"text_input": PROMPT, "max_tokens": 12}).encode()
        with urllib.request.urlopen(f"http://127.0.0.1:{ports.http}/v2/models/dynspec/generate", body, 120) as r:
            reply = json.loads(r.read())
        assert (reply["output_ids"], reply["text_output"]) == expected
        group = children(proc.pid)
        names = {Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].rsplit(b"/", 1)[-1] for p in group}
        assert {b"tritonserver", b"triton_python_backend_stub"} <= names, names
        assert shm_regions(proc.pid)
        proc.send_signal(signum)
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 10
        while any(alive(p) for p in group) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in group if alive(p)]
        assert port_free(ports.http) and port_free(ports.grpc) and port_free(ports.metrics)
        assert shm_regions(proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_port_answered_by_another_server_is_a_failure(repo):
    ports = free_ports()
    other = http.server.HTTPServer(("127.0.0.1", ports.http), _Ready)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        proc = start(repo, ports)
        out, err = proc.communicate(timeout=150)
    finally:
        other.shutdown()
        other.server_close()
    err_lines = err.decode().strip().splitlines()
    assert proc.returncode == 2, (out.decode()[-2000:], err.decode())
    assert len(err_lines) == 1 and "already in use" in err_lines[0] and f"127.0.0.1:{ports.http}" in err_lines[0]
    assert b"tritonserver ready" not in out
    assert children(proc.pid) == set()
    assert shm_regions(proc.pid) == []
    assert port_free(ports.grpc) and port_free(ports.metrics)


@pytest.mark.slow
def test_sigkill_of_the_launcher_still_stops_the_server(repo):
    """SIGKILL cannot be handled: the kernel's parent-death signal stops tritonserver instead."""
    ports = free_ports()
    proc = start(repo, ports)
    try:
        ready, lines = read_until(proc.stdout, "tritonserver ready", 150)
        assert ready, "".join(lines[-30:])
        group = children(proc.pid)
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in group) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in group if alive(p)]
        assert port_free(ports.http) and port_free(ports.grpc)
        assert shm_regions(proc.pid) == []          # tritonserver's own shutdown unlinks it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _refusal(repo, ports, *extra):
    """The launcher CLI on flags it must refuse: (exit status, its stderr lines, seconds taken)."""
    t0 = time.monotonic()
    proc = start(repo, ports, *extra, ready_timeout=30)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:                 # SIGTERM: the launcher stops its server too
            proc.terminate()
            proc.communicate(timeout=30)
    assert b"tritonserver ready" not in out
    return proc.returncode, err.decode().strip().splitlines(), time.monotonic() - t0


@pytest.mark.parametrize("change,message", [
    (dict(http=99999), "--http-port 99999 is not a TCP port: give one in 1..65535"),
    (dict(metrics=0), "--metrics-port 0 is not a TCP port"),
    (dict(grpc="http"), "--http-port and --grpc-port are both"),
    (dict(host="8.8.8.8"), "--host 8.8.8.8 is not an address of this machine"),
])
def test_ports_and_address_are_checked_before_tritonserver_starts(repo, change, message):
    """tritonserver wraps --http-port 99999 into 34463, stops on one port for HTTP and gRPC with
    its usage text, and calls an address of another machine "already in use": each is refused by
    the launcher in one line, within seconds, with no server started."""
    free = free_ports()
    ports = {"http": free.http, "grpc": free.grpc, "metrics": free.metrics}
    host = change.pop("host", "127.0.0.1")
    ports.update({k: ports[v] if isinstance(v, str) else v for k, v in change.items()})
    code, err, took = _refusal(repo, Ports(**ports), "--host", host)
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert took < 20, took


def test_exit_reason_is_tritonserver_s_last_line_without_an_error_line():
    usage = "Usage: tritonserver [options]\n  --http-port <integer>\n\nThe server cannot listen to HTTP\n"
    assert exit_reason(usage) == "The server cannot listen to HTTP"
    assert exit_reason("I1 x] a\nE1130 22:01:02.3 1 main.cc:1] \"failed to start\"\n") == "failed to start"
    assert exit_reason("") == "its log is empty"


def test_a_server_that_stops_at_start_is_reported_with_its_own_reason(repo):
    """Flags after the launcher's reach tritonserver as given (the last one wins; no HTTP front, so
    tritonserver itself listens on ports.http); an argument
    error there has no error line, only usage text and then the reason: that reason is reported."""
    from dynspec.errors import DynspecError
    from dynspec.triton_repo.server_process import launch

    ports = free_ports()
    t0 = time.monotonic()
    with pytest.raises(DynspecError) as e:
        launch(repo, ports, ready_timeout_s=60, extra_args=(f"--grpc-port={ports.http}",), front=False)
    first = str(e.value).splitlines()[0]
    assert "cannot listen to HTTP requests and GRPC requests at the same address" in first, first
    assert time.monotonic() - t0 < 30


def _served(repo):
    """The launcher CLI on `repo` with free ports: (exit status, stderr lines, seconds taken)."""
    return _refusal(repo, free_ports())


def test_a_cuda_repository_on_a_machine_without_that_gpu_is_refused_before_tritonserver_starts(chain, tmp_path):
    """`dynspec triton --device cuda` on this machine, served here: one line naming the device and
    the engine dir (not the model load's traceback from inside tritonserver)."""
    import torch

    from dynspec.triton_repo.generate import generate_repo

    device = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    repo = generate_repo(chain[0], tmp_path / "repo", device=device)
    code, err, took = _served(repo)
    assert code == 2 and len(err) == 1, err
    assert f"device {device} for engine dir {chain[0].resolve()}" in err[0] and "CUDA device" in err[0], err
    assert took < 20, took


def test_a_moved_engine_dir_is_refused_before_tritonserver_starts(chain, tmp_path):
    import shutil

    from dynspec.triton_repo.generate import generate_repo

    pair = tmp_path / "pair"
    shutil.copytree(chain[0].parent, pair, ignore=shutil.ignore_patterns("triton"))
    repo = generate_repo(pair / "engine", tmp_path / "repo")
    (pair / "engine").rename(pair / "engine.moved")
    code, err, took = _served(repo)
    assert code == 2 and len(err) == 1, err
    assert f"engine dir {pair / 'engine'} does not exist" in err[0] and "dynspec_repo.json" in err[0], err
    (pair / "engine.moved").rename(pair / "engine")
    shutil.rmtree(pair / "target")
    code, err, _ = _served(repo)
    assert code == 2 and len(err) == 1 and "target_dir" in err[0] and "no config.json" in err[0], err


def test_a_crashed_server_is_restarted_and_the_restart_is_counted(repo):
    """tritonserver dies by a signal (a hostile request's signal 11, kill -9): the launcher says
    so in one line, starts it again on the same ports and /metrics counts the restart. The admin
    key is printed once, with the first ready line, and still opens the admin APIs after the restart."""
    import re
    import urllib.error
    import urllib.request

    ports = free_ports()
    proc = start(repo, ports)
    try:
        ok, _ = read_until(proc.stdout, "tritonserver ready", 150)
        assert ok
        server_pids = [p for p in children(proc.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "tritonserver"]
        assert len(server_pids) == 1
        os.kill(server_pids[0], signal.SIGSEGV)
        ok, lines = read_until(proc.stdout, "tritonserver ready", 150)
        assert ok and proc.poll() is None
        keys = [m.group(1) for m in (re.search(r"need the header dynspec-admin-key: (\S+) ", line) for line in lines)
                if m]
        assert len(keys) == 1, lines
        logging = f"http://127.0.0.1:{ports.http}/v2/logging"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(logging, timeout=10)
        assert refused.value.code == 403
        with urllib.request.urlopen(urllib.request.Request(logging, headers={"dynspec-admin-key": keys[0]}),
                                    timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{ports.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert re.search(r'^dynspec_server_restarts\{[^}]*\} 1$', text, re.M), text[-2000:]
        body = json.dumps({"input_ids": [5, 6, 7], "max_tokens": 2}).encode()
        with urllib.request.urlopen(f"http://127.0.0.1:{ports.http}/v2/models/dynspec/generate", body, 60) as r:
            assert len(json.loads(r.read())["output_ids"]) == 2
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"dynspec-admin-key: " not in out            # not printed again with the second ready line
    lines = err.decode().strip().splitlines()
    assert lines == ["error: tritonserver exited with signal 11; restarting it (restart 1)"], lines
    assert proc.returncode == 0 and children(proc.pid) == set()
