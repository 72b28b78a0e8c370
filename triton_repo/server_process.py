"""One tritonserver process: launch() starts it in its own process group (behind the HTTP front,
with its log and /dev/shm prefix), TritonServer waits until it is ready and stops it.

Behind the front, tritonserver's own HTTP service listens on a Unix socket in the launch's private
folder (mode 0700): other users of the machine cannot connect to it, so the front, with its body
bound and its checks, is the only HTTP way in. tritonserver copies a request body onto the stack of
the thread that reads it and dies with signal 11 on one over about half its stack: it is started
with a 64 MiB stack (STACK_BYTES), 8 times what the front forwards."""
from __future__ import annotations

import atexit
import contextlib
import glob
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping

from dynspec.errors import DynspecError
from dynspec.triton_repo.ports import Ports, check_addresses, free_ports, owns_listener, owns_unix_listener, \
    unix_status
from dynspec.triton_repo.repo_check import check_repo, integer_inputs
from dynspec.triton_repo.triton_install import (STACK_BYTES, admin_key, backend_dir, find_tritonserver,
                                                server_command, server_env, shm_prefix)

HTTP_SOCKET = "http.sock"               # tritonserver's own HTTP service, in the launch's private folder
MAX_SOCKET_PATH = 107                   # bytes of a Unix socket's path (sun_path holds 108, NUL included)


class ServerExited(DynspecError):
    """tritonserver exited before it was ready; returncode: its exit status (negative: a signal)."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode
from dynspec.triton_repo.workdir import discard, make_workdir


def error_lines(log: str) -> list[str]:
    """tritonserver's own error lines (glog severity E), without the glog prefix:
    'E1130 21:59:01.123 77 main.cc:300] failed to start HTTP service: ...' -> 'failed to start HTTP service: ...'"""
    return [re.sub(r"^E\d{4} [\d:.]+ +\d+ [^\]]*\] ", "", line).strip()
            for line in log.splitlines() if re.match(r"^E\d{4} ", line) and not CPU_NOISE.match(line.encode())]


def exit_reason(log: str) -> str:
    """Why tritonserver stopped, from its log: its last error line (glog severity E), else its
    last line (an argument error is printed after the usage text), else a note that the log is empty."""
    errors = error_lines(log)
    if errors:
        return errors[-1].strip('" ')
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return lines[-1] if lines else "its log is empty"


# what tritonserver (a CUDA build) logs as an error on a machine without a CUDA driver, though it
# serves on CPU without one: left out of the launcher's log on stdout and of exit reasons
CPU_NOISE = re.compile(rb'^E\d{4} [\d:.]+ +\d+ server\.cc:\d+\] "CudaDriverHelper has not been initialized\."$')


class _Tee(threading.Thread):
    """Copies the server's log file to this process's stdout as it grows, line by line, without
    the CPU_NOISE lines (the launcher CLI's log goes to the terminal and still lies, whole, in a
    file that error messages quote)."""

    def __init__(self, path: Path):
        super().__init__(name="dynspec-triton-log", daemon=True)
        self.path, self.done = path, threading.Event()

    def run(self) -> None:
        rest = b""
        with open(self.path, "rb") as f:
            while True:
                chunk = f.read(65536)
                if chunk or (self.done.is_set() and rest):
                    lines = (rest + chunk).split(b"\n")
                    rest = lines.pop() if chunk else b""
                    out = b"".join(line + b"\n" for line in lines if not CPU_NOISE.match(line))
                    sys.stdout.buffer.write(out)
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
                 shm_prefix: str = "", tee: _Tee | None = None, front=None, upstream_http: str | None = None,
                 admin_key: str | None = None, lock_fd: int | None = None):
        self.proc, self.ports, self.host, self.workdir, self.log_path = proc, ports, host, workdir, log_path
        self._lock_fd = lock_fd                     # the workdir's lock (triton_repo/workdir.py)
        self.admin_key = admin_key                  # what ADMIN_APIS need in header ADMIN_HEADER
        self.shm_prefix, self._tee = shm_prefix, tee
        self.front = front                          # the HttpFront on ports.http, or None
        self.upstream_http = upstream_http          # tritonserver's own HTTP: its Unix socket (None: ports.http)

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
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._wait_log()
                log = self.log()
                why = exit_reason(log)
                raise ServerExited(f"tritonserver exited with code {self.proc.returncode}: {why}\n{log[-4000:]}",
                                   self.proc.returncode)
            try:
                if self._ready() and owns_listener(self.proc.pid, self.ports.grpc):
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise DynspecError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.log()[-4000:]}")

    def _ready(self) -> bool:
        """/v2/health/ready answers 200 on tritonserver's own HTTP service, and this server holds it."""
        if self.upstream_http is not None:
            return unix_status(self.upstream_http, "/v2/health/ready") == 200 and \
                owns_unix_listener(self.proc.pid, self.upstream_http)
        with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=1) as r:
            return r.status == 200 and owns_listener(self.proc.pid, self.ports.http)

    @property
    def protection(self) -> str:
        """One line: how tritonserver's own HTTP service is kept from other users of the machine."""
        if self.upstream_http is None:
            return f"tritonserver's HTTP service listens on {self.http_url} itself, open to every local user"
        st = os.stat(Path(self.upstream_http).parent)
        return (f"tritonserver's own HTTP service listens on the Unix socket {self.upstream_http}, in a folder of "
                f"uid {st.st_uid} with mode {st.st_mode & 0o777:o}: other local users cannot connect to it; "
                f"HTTP goes through the front on {self.http_url}; admin key: in this process only")

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
            discard(self.workdir, self._lock_fd)
            self._lock_fd = None

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


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def _signals_blocked():
    """Hold SIGTERM/SIGINT/SIGHUP while a child is started and recorded, so a signal cannot land
    between the fork and the bookkeeping that stops it (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _unblock_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _child_setup(die_with_parent: bool):
    """preexec_fn: unblock the stop signals (the mask is inherited), raise the stack limit to
    STACK_BYTES (the hard limit allowing), and with die_with_parent ask the kernel to SIGTERM the
    server when the thread that started it dies (even by SIGKILL)."""
    def setup() -> None:
        _unblock_stop_signals()
        _, hard = resource.getrlimit(resource.RLIMIT_STACK)
        stack = STACK_BYTES if hard == resource.RLIM_INFINITY else min(STACK_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_STACK, (stack, hard))
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
    list, the admin APIs opened by `key`); tritonserver's own HTTP service listens on a Unix socket
    in the launch's private folder. Without the front (front=False) tritonserver's HTTP service is
    on host:ports.http, admin APIs open.
    key: the admin key the front asks of the admin APIs (ADMIN_HEADER); default: a fresh one."""
    repo = Path(repo)
    if not repo.is_dir():
        raise DynspecError(f"model repository {repo} does not exist")
    check_repo(repo)
    install = find_tritonserver()
    ports = ports or free_ports(host)
    check_addresses(host, ports)
    workdir, lock_fd = make_workdir()
    upstream = str(workdir / HTTP_SOCKET) if front else None
    if upstream is not None and len(upstream.encode()) > MAX_SOCKET_PATH:
        discard(workdir, lock_fd)
        raise DynspecError(f"the temp dir {workdir.parent} is too deep for a Unix socket ({upstream} is over "
                           f"{MAX_SOCKET_PATH} bytes); set TMPDIR to a shorter path")
    to_stdout = str(log_path) == "-"
    log_path = workdir / "tritonserver.log" if log_path is None or to_stdout else Path(log_path)
    backends = backend_dir(install, workdir / "backends")
    prefix = shm_prefix()
    key = key or admin_key()
    cmd = server_command(install, repo, ports, backends, host, shm_prefix=prefix, http_socket=upstream) + \
        list(extra_args)
    server = http_front = None
    try:
        if front:
            from dynspec.triton_repo.front import MAX_BODY, HttpFront

            http_front = HttpFront(host, ports.http, upstream, integer_inputs(repo),
                                   MAX_BODY if max_body is None else max_body, admin_key=key)
            http_front.start()
        with _signals_blocked():
            with open(log_path, "ab") as log:
                full = {k: v for k, v in {**server_env(install), **(env or {})}.items() if v is not None}
                proc = subprocess.Popen(cmd, env=full, stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                        pass_fds=(lock_fd,), preexec_fn=_child_setup(die_with_parent))
            tee = _Tee(log_path) if to_stdout else None
            server = TritonServer(proc, ports, host, workdir, log_path, prefix, tee, http_front, upstream, key,
                                  lock_fd)
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
            discard(workdir, lock_fd)
        raise
    return server
