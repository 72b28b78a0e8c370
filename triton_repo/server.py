"""Run the `tritonserver` that the nvidia-pytriton wheel ships (CPU works) on a model repository.

What the wheel needs, worked out once here:
  - binary   pytriton/tritonserver/bin/tritonserver; its libraries lie in nvidia_pytriton.libs
  - python backend  pytriton/tritonserver/backends/python/{libtriton_python.so, *_utils.py}; the
    stub is per Python version (python_backend_stubs/3.X/) and must sit next to the backend, so
    each launch assembles a private --backend-directory
  - the stub embeds libpython: LD_LIBRARY_PATH gets this interpreter's LIBDIR so the same
    CPython build is loaded, and PATH starts with this environment's bin/ so the embedded
    interpreter finds the venv (pyvenv.cfg) and its site-packages, where dynspec is installed.

    python -m dynspec.triton_repo.server REPO [--http-port 8000 --grpc-port 8001 --metrics-port 8002]
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import glob
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from dynspec.errors import DynspecError


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    libs: Path                 # bundled shared libraries (nvidia_pytriton.libs)
    python_backend: Path       # folder with libtriton_python.so + triton_python_backend_utils.py
    stub: Path                 # triton_python_backend_stub for this Python version


def find_tritonserver() -> TritonInstall:
    """Locate the tritonserver binary and python backend inside the installed nvidia-pytriton."""
    try:
        import pytriton
    except ImportError as e:
        raise DynspecError("nvidia-pytriton is not installed; `pip install nvidia-pytriton` ships tritonserver") from e
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    install = TritonInstall(
        binary=root / "bin" / "tritonserver",
        libs=root.parent.parent / "nvidia_pytriton.libs",
        python_backend=root / "backends" / "python",
        stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
    )
    for name, path in (("binary", install.binary), ("python backend", install.python_backend / "libtriton_python.so"),
                       (f"python {version} backend stub", install.stub)):
        if not path.exists():
            raise DynspecError(f"tritonserver {name} not found at {path} (nvidia-pytriton {root})")
    return install


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int


def free_ports(host: str = "127.0.0.1") -> Ports:
    """Three ports the OS reports free right now (held together, so they are distinct)."""
    socks = []
    try:
        for _ in range(3):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return Ports(*(s.getsockname()[1] for s in socks))
    finally:
        for s in socks:
            s.close()


PORT_FLAGS = ("--http-port", "--grpc-port", "--metrics-port")


def check_addresses(host: str, ports: Ports) -> None:
    """Refuse, before tritonserver starts, what it would wrap, merge or misreport: a port outside
    1..65535 (tritonserver takes --http-port 99999 as 34463), two services on one port, an address
    that is not one of this machine's (tritonserver calls that "already in use"), a port in use.
    Each check binds and releases a socket, as tritonserver will (SO_REUSEADDR)."""
    named = list(zip(PORT_FLAGS, (ports.http, ports.grpc, ports.metrics)))
    for flag, port in named:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise DynspecError(f"{flag} {port} is not a TCP port: give one in 1..65535")
    for i, (flag, port) in enumerate(named):
        for other, theirs in named[i + 1:]:
            if port == theirs:
                raise DynspecError(f"{flag} and {other} are both {port}: each service needs its own port")
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise DynspecError(f"--host {host!r} does not resolve: {e.strerror}") from None
    for flag, port in [("--host", 0), *named]:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((addr[0], port, *addr[2:]))
            except OSError as e:
                if flag == "--host":
                    raise DynspecError(f"--host {host} is not an address of this machine: cannot bind it "
                                       f"({e.strerror}); give a local address, e.g. 127.0.0.1 or 0.0.0.0") from None
                raise DynspecError(f"{flag} {port}: {host}:{port} is already in use ({e.strerror})") from None


def check_repo(repo: str | os.PathLike) -> None:
    """Refuse, before tritonserver starts, a reference repository whose model load would fail
    inside tritonserver with a Python traceback: its engine dir missing or moved (or its
    target / draft checkpoint gone), or its device absent from this machine (device cuda on a
    build of torch without CUDA, or with no GPU; cuda:N beyond the GPUs there are). The engine dir
    and device are dynspec_repo.json's, which `dynspec triton` wrote with config.pbtxt's."""
    from dynspec.artifacts import read_json
    from dynspec.triton_repo.generate import REPO_MANIFEST, open_engine

    path = Path(repo) / REPO_MANIFEST
    if not path.is_file():
        return                              # a repository of one's own: tritonserver reports its load
    manifest = read_json(path, "repository manifest")
    if manifest.get("variant") != "reference":
        return
    engine_dir, device = manifest.get("engine_dir"), manifest.get("device")
    if not isinstance(engine_dir, str) or not isinstance(device, str):
        raise DynspecError(f"{path}: fields 'engine_dir' and 'device' must be strings, not {engine_dir!r} and "
                           f"{device!r}; regenerate the repository with `dynspec triton`")
    try:
        open_engine(engine_dir)
    except DynspecError as e:
        raise DynspecError(f"{path}: the engine dir cannot be served: {str(e).splitlines()[0]}; rebuild it there "
                           "or regenerate the repository with `dynspec triton --engine-dir`") from None
    if device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or 0)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            have = "no CUDA device" if count == 0 else f"{count} CUDA device(s)"
            build = "without CUDA" if torch.version.cuda is None else f"with CUDA {torch.version.cuda}"
            raise DynspecError(f"{path}: device {device} for engine dir {engine_dir}, but this machine has {have} "
                               f"(torch {torch.__version__}, built {build}); serve it on a machine with that GPU, "
                               f"or regenerate the repository with `dynspec triton --device cpu`")


def integer_inputs(repo: str | os.PathLike) -> dict[str, str]:
    """Input name -> Triton datatype of every integer input declared in the repository's
    config.pbtxt files, e.g. {"max_tokens": "INT32", "seed": "UINT64"} (what the HTTP front checks)."""
    out = {}
    for config in sorted(Path(repo).glob("*/config.pbtxt")):
        text = config.read_text(errors="replace")
        for name, kind in re.findall(r'name:\s*"([^"]+)"\s*data_type:\s*TYPE_((?:U?INT)\d+)', text):
            out[name] = kind
    return out


def exit_reason(log: str) -> str:
    """Why tritonserver stopped, from its log: its last error line (glog severity E), else its
    last line (an argument error is printed after the usage text), else a note that the log is empty."""
    errors = error_lines(log)
    if errors:
        return errors[-1].strip('" ')
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return lines[-1] if lines else "its log is empty"


def backend_dir(install: TritonInstall, dst: str | os.PathLike) -> Path:
    """A --backend-directory with the python backend and this Python's stub side by side."""
    py = Path(dst) / "python"
    py.mkdir(parents=True, exist_ok=True)
    for f in install.python_backend.iterdir():
        if f.is_file():
            shutil.copy2(f, py / f.name)
    shutil.copy2(install.stub, py / "triton_python_backend_stub")
    return Path(dst)


def server_env(install: TritonInstall, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, str(install.libs), env.get("LD_LIBRARY_PATH")) if p)
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.prefix) / "bin"), env.get("PATH")) if p)
    return env


def shm_prefix() -> str:
    """A python-backend shm-region-prefix-name unique to one launch: dynspec_<pid>_<8 hex>_"""
    return f"dynspec_{os.getpid()}_{uuid.uuid4().hex[:8]}_"


ADMIN_APIS = "model-repository,trace,logging"    # tritonserver's APIs that need the admin key
ADMIN_HEADER = "dynspec-admin-key"              # its header over HTTP; gRPC: triton-grpc-protocol-<this>


def admin_key() -> str:
    """A fresh admin key (256 bits, URL-safe): one per launcher, kept over restarts."""
    return secrets.token_urlsafe(32)


def server_command(install: TritonInstall, repo: str | os.PathLike, ports: Ports, backends: str | os.PathLike,
                   host: str = "127.0.0.1", exit_timeout_s: int = 5, shm_prefix: str = "dynspec_",
                   http_host: str | None = None, key: str | None = None) -> list[str]:
    """http_host: where tritonserver's own HTTP service listens (127.0.0.1 behind the HTTP front).
    key: ADMIN_APIS answer only requests that carry it (HTTP header ADMIN_HEADER, gRPC metadata
    triton-grpc-protocol-ADMIN_HEADER), through tritonserver's --http-restricted-api and
    --grpc-restricted-protocol; without it they are open."""
    restricted = [f"--http-restricted-api={ADMIN_APIS}:{ADMIN_HEADER}={key}",
                  f"--grpc-restricted-protocol={ADMIN_APIS}:{ADMIN_HEADER}={key}"] if key else []
    return [
        str(install.binary),
        f"--model-repository={Path(repo).resolve()}",
        f"--backend-directory={backends}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        f"--http-address={http_host or host}", f"--http-port={ports.http}",
        f"--grpc-address={host}", f"--grpc-port={ports.grpc}",
        f"--metrics-address={host}", f"--metrics-port={ports.metrics}",
        "--allow-metrics=true", "--allow-gpu-metrics=false",
        f"--exit-timeout-secs={exit_timeout_s}",
        *restricted,
    ]


def parent_pids() -> dict[int, int]:
    """pid -> parent pid of every live process, from /proc/PID/stat (the field after the name)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parent


def listening_inodes(port: int) -> set[int]:
    """Socket inodes in LISTEN state on `port` (any address), from /proc/net/tcp and tcp6.
    A line there: `sl local_address rem_address st ... inode`, e.g. `0: 0100007F:1F40 00000000:0000 0A ... 41234`
    is 127.0.0.1:8000 listening (state 0A) on socket inode 41234."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(f[9]))
    return inodes


def owns_listener(pid: int, port: int) -> bool:
    """True when process `pid` holds a socket listening on `port` (so it, not another server, answers there)."""
    inodes = listening_inodes(port)
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", link)
        if m and int(m.group(1)) in inodes:
            return True
    return False


def error_lines(log: str) -> list[str]:
    """tritonserver's own error lines (glog severity E), without the glog prefix:
    'E1130 21:59:01.123 77 main.cc:300] failed to start HTTP service: ...' -> 'failed to start HTTP service: ...'"""
    return [re.sub(r"^E\d{4} [\d:.]+ +\d+ [^\]]*\] ", "", line).strip()
            for line in log.splitlines() if re.match(r"^E\d{4} ", line)]


class _Tee(threading.Thread):
    """Copies the server's log file to this process's stdout as it grows (the launcher CLI's log
    goes to the terminal and still lies in a file that error messages quote)."""

    def __init__(self, path: Path):
        super().__init__(name="dynspec-triton-log", daemon=True)
        self.path, self.done = path, threading.Event()

    def run(self) -> None:
        with open(self.path, "rb") as f:
            while True:
                chunk = f.read(65536)
                if chunk:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                elif self.done.is_set():
                    return
                else:
                    time.sleep(0.1)


class TritonServer:
    """A running tritonserver in its own process group; stop() always ends the whole group and
    removes the group's /dev/shm regions (launch() also registers stop() with atexit, for
    interpreters that exit without calling it)."""

    def __init__(self, proc: subprocess.Popen, ports: Ports, host: str, workdir: Path, log_path: Path,
                 shm_prefix: str = "", tee: _Tee | None = None, front=None, upstream_http: int | None = None,
                 admin_key: str | None = None):
        self.proc, self.ports, self.host, self.workdir, self.log_path = proc, ports, host, workdir, log_path
        self.admin_key = admin_key                  # what ADMIN_APIS need in header ADMIN_HEADER
        self.shm_prefix, self._tee = shm_prefix, tee
        self.front = front                          # the HttpFront on ports.http, or None
        self.upstream_http = ports.http if upstream_http is None else upstream_http   # tritonserver's own

    def shm_regions(self) -> list[str]:
        """The python backend's shared-memory regions of this server still in /dev/shm."""
        return sorted(glob.glob(f"/dev/shm/{glob.escape(self.shm_prefix)}*")) if self.shm_prefix else []

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float) -> None:
        """Poll /v2/health/ready until it answers 200 from *this* server: the process must be alive
        and hold the listening HTTP and gRPC sockets (another server on the port does not count).
        Raise with tritonserver's own error lines if it exits, or with the log tail at the timeout."""
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.upstream_http}/v2/health/ready" if self.front else \
            f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._wait_log()
                log = self.log()
                why = exit_reason(log)
                raise DynspecError(f"tritonserver exited with code {self.proc.returncode}: {why}\n{log[-4000:]}")
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200 and owns_listener(self.proc.pid, self.upstream_http) \
                            and owns_listener(self.proc.pid, self.ports.grpc):
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise DynspecError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.log()[-4000:]}")

    def _wait_log(self) -> None:
        if self._tee is not None:
            self._tee.done.set()
            self._tee.join(5)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            return r.read().decode()

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the server (models finalize), then SIGKILL whatever is left of its group and
        remove its /dev/shm regions. Idempotent."""
        if self.proc.returncode is not None and not self.workdir.exists():
            return
        if self.front is not None:
            self.front.stop()
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait(5)
            deadline = time.monotonic() + 5.0       # the stub is a child: wait for the whole group
            while _group_alive(self.proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            for region in self.shm_regions():
                with contextlib.suppress(OSError):
                    os.unlink(region)
            self._wait_log()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "TritonServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def _signals_blocked():
    """Hold SIGTERM/SIGINT/SIGHUP while a child is started and recorded, so a signal cannot land
    between the fork and the bookkeeping that stops it (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _unblock_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def _child_setup(die_with_parent: bool):
    """preexec_fn: unblock the stop signals (the mask is inherited), and with die_with_parent ask
    the kernel to SIGTERM the server when the thread that started it dies (even by SIGKILL)."""
    def setup() -> None:
        _unblock_stop_signals()
        if die_with_parent:
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    return setup


def launch(repo: str | os.PathLike, ports: Ports | None = None, *, host: str = "127.0.0.1",
           log_path: str | os.PathLike | None = None, ready_timeout_s: float | None = 120.0,
           extra_args: tuple[str, ...] = (), env: Mapping[str, str | None] | None = None,
           die_with_parent: bool = False, front: bool = True, max_body: int | None = None,
           key: str | None = None) -> TritonServer:
    """Start tritonserver on `repo`; with ready_timeout_s, wait until it is ready (stopping it on failure).
    The log goes to log_path (default: a file in the launch's private folder; "-": this process's stdout).
    env: extra environment variables for the server and its python-backend stubs (e.g. OMP_NUM_THREADS);
    a None value removes the variable (the TP launcher drops its MPI rank's OMPI_* / PMIX_*).
    die_with_parent: the server gets SIGTERM when the calling thread dies (the CLI sets it; a
    library caller that launches from a short-lived thread must not).
    front: HTTP goes through triton_repo/front.py's HttpFront on ports.http (request bodies bounded
    by max_body, integers checked against their inputs' types, generate's output_ids always a
    list); tritonserver's own HTTP service listens on a private loopback port.
    key: the admin key of tritonserver's restricted APIs (server_command); default: a fresh one."""
    repo = Path(repo)
    if not repo.is_dir():
        raise DynspecError(f"model repository {repo} does not exist")
    check_repo(repo)
    install = find_tritonserver()
    ports = ports or free_ports(host)
    check_addresses(host, ports)
    upstream = free_ports("127.0.0.1").http if front else ports.http
    workdir = Path(tempfile.mkdtemp(prefix="dynspec-triton-"))
    to_stdout = str(log_path) == "-"
    log_path = workdir / "tritonserver.log" if log_path is None or to_stdout else Path(log_path)
    backends = backend_dir(install, workdir / "backends")
    prefix = shm_prefix()
    inner = Ports(upstream, ports.grpc, ports.metrics)
    key = key or admin_key()
    cmd = server_command(install, repo, inner, backends, host, shm_prefix=prefix,
                         http_host="127.0.0.1" if front else None, key=key) + list(extra_args)
    server = http_front = None
    try:
        if front:
            from dynspec.triton_repo.front import MAX_BODY, HttpFront

            http_front = HttpFront(host, ports.http, upstream, integer_inputs(repo),
                                   MAX_BODY if max_body is None else max_body)
            http_front.start()
        with _signals_blocked():
            with open(log_path, "ab") as log:
                full = {k: v for k, v in {**server_env(install), **(env or {})}.items() if v is not None}
                proc = subprocess.Popen(cmd, env=full, stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=_child_setup(die_with_parent))
            tee = _Tee(log_path) if to_stdout else None
            server = TritonServer(proc, ports, host, workdir, log_path, prefix, tee, http_front, upstream, key)
            atexit.register(server.stop, 5.0)
            if tee is not None:
                tee.start()
        if ready_timeout_s is not None:
            server.wait_ready(ready_timeout_s)
    except BaseException:
        if server is not None:
            server.stop()
        else:
            if http_front is not None:
                http_front.stop()
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    return server


def add_server_args(p: argparse.ArgumentParser) -> None:
    """The launcher's own flags (this CLI's and the TP launcher's, triton_repo/launch.py)."""
    p.add_argument("repo", help="model repository written by `dynspec triton`")
    p.add_argument("--host", default="127.0.0.1", help="address HTTP, gRPC and metrics listen on")
    p.add_argument("--http-port", type=int, default=8000, help="HTTP (through the bounded front)")
    p.add_argument("--grpc-port", type=int, default=8001, help="gRPC")
    p.add_argument("--metrics-port", type=int, default=8002, help="Prometheus /metrics")
    p.add_argument("--ready-timeout", type=float, default=300.0, metavar="S",
                   help="seconds to wait for /v2/health/ready (and, under --tp, for the ranks to join)")


WATCH_S = 0.5
RESTARTS_ENV = "DYNSPEC_SERVER_RESTARTS"   # how many times the launcher restarted tritonserver (a metric)
RESTART_LIMIT, RESTART_WINDOW_S = 5, 600.0  # more crashes than this within the window: give up (exit 1)


def serve(args: argparse.Namespace, *, env: Mapping[str, str | None] | None = None,
          watch: Callable[[], str | None] | None = None, note: str = "", restart: bool | None = None) -> int:
    """Launch on add_server_args' flags, print the ready line (+ note), wait until a stop signal
    (exit status 0), the server's own exit or a message from `watch` (polled every WATCH_S: the TP
    launcher's fault report; 1), and stop the server. A server that does not start: 2.
    restart (default: without `watch`, i.e. one process serves): a server that exits by itself
    (a crash: signal 11 on a hostile request, kill -9) is started again on the same ports, with a
    line on stderr and the count in the model's dynspec_server_restarts gauge; more than
    RESTART_LIMIT restarts within RESTART_WINDOW_S: exit 1. An HTTP front that stops serving is
    restarted the same way (front_watch). The admin key (server_command) is made once, printed
    with the first ready line, and kept over restarts."""
    restart = watch is None if restart is None else restart
    key = admin_key()
    _Stop.seen = _Stop.stopping = _Stop.key_shown = False
    previous = {s: signal.signal(s, _raise_stop) for s in _STOP_SIGNALS}
    crashes: list[float] = []
    try:
        while True:
            code = _serve_once(args, {**(env or {}), RESTARTS_ENV: str(len(crashes))}, watch, note, key)
            if code is None or code == "start":
                return 0 if code is None else 2
            if code == "watch":
                return 1
            if not restart:
                print(f"error: tritonserver exited with {code}", file=sys.stderr)
                return 1
            now = time.monotonic()
            crashes = [t for t in crashes if now - t < RESTART_WINDOW_S] + [now]
            if len(crashes) > RESTART_LIMIT:
                print(f"error: tritonserver crashed {len(crashes)} times within {RESTART_WINDOW_S:.0f} s; "
                      "not restarting it", file=sys.stderr, flush=True)
                return 1
            print(f"error: tritonserver exited with {code}; restarting it (restart {len(crashes)})",
                  file=sys.stderr, flush=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def front_watch(server: TritonServer) -> str | None:
    """None while the server's HTTP front serves (or it has none); after it stopped: restarted on
    its port, with a line on stderr. A front that cannot be restarted: why (the launcher stops)."""
    front = server.front
    if front is None or front.alive():
        return None
    print(f"error: the HTTP front on {server.http_url} stopped; restarting it", file=sys.stderr, flush=True)
    try:
        front.restart()
    except (OSError, RuntimeError) as e:
        return f"the HTTP front on {server.http_url} could not be restarted: {e}"
    return None


def _serve_once(args, env, watch, note, key):
    """One server's life: None (stopped by a signal, or exited 0), "start" (did not start),
    "watch" (stopped on watch's or front_watch's message), or why it ended by itself ("signal 11")."""
    ports = Ports(args.http_port, args.grpc_port, args.metrics_port)
    try:
        server = launch(args.repo, ports, host=args.host, log_path="-", ready_timeout_s=args.ready_timeout,
                        env=env, die_with_parent=True, key=key)
    except DynspecError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return "start"
    except _Stop:
        return None
    # one write, newline included: tritonserver logs to the same stdout, and print's separate
    # write of the newline (unbuffered output) let a log line land inside the ready line
    admin = "" if _Stop.key_shown else (f"admin APIs ({ADMIN_APIS}) need the header {ADMIN_HEADER}: {key} "
                                        f"(gRPC metadata triton-grpc-protocol-{ADMIN_HEADER})\n")
    _Stop.key_shown = True
    sys.stdout.write(f"tritonserver ready: http {server.http_url}  grpc {server.grpc_url}  "
                     f"metrics {server.metrics_url}{note}\n{admin}")
    sys.stdout.flush()
    failure, signalled = None, False
    try:
        while server.proc.poll() is None and failure is None:
            failure = (watch() if watch is not None else None) or front_watch(server)
            if failure is None:
                time.sleep(WATCH_S)
    except _Stop:
        signalled = True
    finally:
        _Stop.stopping = True               # a signal from here on must not cut the stop short
        if failure is not None:
            print(f"error: {failure}; stopping tritonserver", file=sys.stderr, flush=True)
        server.stop()
    if failure is not None:
        return "watch"
    code = server.proc.returncode
    if signalled or _Stop.seen or code == 0:
        return None
    _Stop.stopping = False                  # it ended by itself: killed (a crash, OOM, kill -9) or failed
    return f"signal {-code}" if code < 0 else f"code {code}"


def make_parser(prog: str = "python -m dynspec.triton_repo.server", description: str | None = None):
    """The launcher's parser: flags only as spelled in full, defaults in --help (dynspec.cli.Parser)."""
    from dynspec.cli import Parser

    p = Parser(prog=prog, description=description or __doc__.splitlines()[0])
    add_server_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return serve(make_parser().parse_args(argv))


class _Stop(BaseException):
    """Raised in the main thread by SIGTERM / SIGINT / SIGHUP: stop the server, then exit 0."""
    seen = False
    stopping = False                    # serve() is stopping the server already
    key_shown = False                   # the admin key went out with a ready line


def _raise_stop(signum, frame):
    if _Stop.seen or _Stop.stopping:    # a second signal, or one while stopping: stopping goes on
        _Stop.seen = True
        return
    _Stop.seen = True
    raise _Stop(signal.Signals(signum).name)


if __name__ == "__main__":
    sys.exit(main())
