"""tritonserver behind the launcher, seen from another user of the machine and from hostile
clients: its own HTTP service is a Unix socket only the launcher's user can enter, a 5 MB body
on that socket does not kill it, the admin key is on no command line, the front routes on one
spelling of each path, words must be strings of valid Unicode, `--host ::1` serves, a crash
during the start check is restarted, and a CPU server's log has no CUDA driver error lines.

One real tritonserver for the module (tiny pair, CPU). Tests that act as another user run as
uid 65534 in a child process, which needs root; elsewhere they are skipped.
"""
import http.client
import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest

from tests.test_triton_hostile import engine, generate, post, ready, server  # noqa: F401  (module fixtures)

MODEL = "dynspec"
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user (uid 65534) needs root")


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


def as_nobody(fn) -> str:
    """Call fn() in a forked child that has dropped to uid/gid 65534 -> "ok", or the exception it
    raised as "Name: message"."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                fn()
                out = "ok"
            except BaseException as e:
                out = f"{type(e).__name__}: {e}"
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def connect_unix(path: str) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)


def read_files(*paths: str) -> None:
    for path in paths:
        Path(path).read_bytes()


def tcp_listeners(pid: int) -> set[int]:
    """Ports of the TCP sockets process `pid` listens on."""
    from dynspec.triton_repo.ports import listening_inodes, socket_inodes

    mine = socket_inodes(pid)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return {p for p in ports if listening_inodes(p) & mine}


def unix_post(path: str, url: str, body: bytes, timeout: float = 60.0) -> int:
    from dynspec.triton_repo.ports import UnixHTTPConnection

    conn = UnixHTTPConnection(path, timeout)
    try:
        conn.request("POST", url, body, {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


@as_root
def test_tritonservers_own_http_service_is_out_of_other_users_reach(server):
    """The only TCP ports tritonserver listens on are the public gRPC and metrics ports; its HTTP
    service is the Unix socket named on its command line, in a folder uid 65534 cannot enter."""
    assert tcp_listeners(server.proc.pid) == {server.ports.grpc, server.ports.metrics}
    address = [a.split("=", 1)[1] for a in cmdline(server.proc.pid) if a.startswith("--http-address=")]
    assert address == [f"unix:{server.upstream_http}"]
    assert as_nobody(lambda: connect_unix(server.upstream_http)).startswith("PermissionError")
    assert as_nobody(lambda: connect_unix("/nonexistent")).startswith("FileNotFoundError")   # the probe works
    assert "Unix socket" in server.protection and "mode 700" in server.protection


def test_a_5mb_body_on_tritonservers_own_socket_does_not_kill_it(server):
    """The body the front refuses (413), sent past the front to tritonserver's own socket: the
    server answers and keeps serving (it died with signal 11 on a 5 MB body at the default stack)."""
    body = json.dumps({"text_input": "a" * 5_000_000, "max_tokens": 1}).encode()
    assert post(server, f"/v2/models/{MODEL}/generate", body)[0] == 413
    for url in (f"/v2/models/{MODEL}/generate", "/v2/repository/index"):
        unix_post(server.upstream_http, url, body)
        assert server.proc.poll() is None, server.log()[-3000:]
    assert generate(server, {"input_ids": [5, 6, 7], "max_tokens": 2})[0] == 200


@as_root
def test_the_admin_key_is_on_no_command_line_and_other_users_cannot_read_it(server):
    """No process's command line holds the key; uid 65534 cannot read the environment of the
    launcher or of tritonserver; the public HTTP port opens the admin APIs with the key only; gRPC
    keeps them closed even with every value of tritonserver's command line."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from dynspec.triton_repo.triton_install import ADMIN_HEADER

    key = server.admin_key
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            assert key not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"), pid
        except OSError:
            continue
    for pid in (server.proc.pid, os.getpid()):
        assert as_nobody(lambda: read_files(f"/proc/{pid}/environ")).startswith("PermissionError"), pid
    assert as_nobody(lambda: read_files(f"/proc/{server.proc.pid}/cmdline")) == "ok"      # the probe works
    assert post(server, "/v2/repository/index", b"{}")[0] == 403
    assert post(server, "/v2/repository/index", b"{}", {ADMIN_HEADER: key})[0] == 200
    values = [a.split(":", 1)[1] for a in cmdline(server.proc.pid) if a.startswith("--grpc-restricted-protocol=")]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for header in [f"triton-grpc-protocol-{ADMIN_HEADER}={key}", *values]:
            name, value = header.split("=", 1)
            with pytest.raises(InferenceServerException):
                client.get_log_settings(headers={name.lower(): value})
    finally:
        client.close()


@pytest.mark.parametrize("path", ["/v2/models/dynspec/%67enerate", "/v2/models/dynspec/./generate",
                                  "/v2/models/x/../dynspec/generate", "/v2/models//dynspec/generate",
                                  "/v2/%6Cogging", "/v2/./logging", "/v2/trace/../logging"])
def test_every_alias_of_a_path_is_refused(server, path):
    """tritonserver decodes %67 and resolves ./ and ../ before it routes: each such alias is
    answered 400 by the front (max_tokens 2^32+1 on the generate alias was served as 1 token)."""
    status, raw = post(server, path, json.dumps({"input_ids": [5, 6], "max_tokens": 2 ** 32 + 1}).encode())
    assert status == 400 and "request path" in json.loads(raw)["error"], (path, raw)
    assert ready(server)


@pytest.mark.parametrize("field,value,says", [
    ("stop_words", '["\\ud800"]', "lone surrogate"), ("stop_words", "[1, 2]", "(a number)"),
    ("bad_words", '"x\\udc00"', "lone surrogate"), ("bad_words", '[["a"]]', "(list)"),
    ("text_input", '"\\ud800"', "lone surrogate")])
def test_words_must_be_strings_of_valid_unicode(server, field, value, says):
    """A lone surrogate or a number among the words: 400 from the front naming the input (it was
    500 from tritonserver), and the server keeps serving."""
    prompt = "" if field == "text_input" else '"input_ids": [5, 6], '
    body = f'{{{prompt}"max_tokens": 2, "{field}": {value}}}'.encode()
    status, raw = post(server, f"/v2/models/{MODEL}/generate", body)
    error = json.loads(raw)["error"]
    assert status == 400 and repr(field) in error and says in error, raw
    assert generate(server, {"input_ids": [5, 6, 7], "max_tokens": 2})[0] == 200


def test_no_cuda_driver_error_line_on_cpu(server):
    """A CPU server's log has no 'CUDA driver version is insufficient' line, and its error lines
    (as the launcher reports them) name no CUDA driver."""
    from dynspec.triton_repo.server_process import error_lines

    log = server.log()
    assert "CUDA driver version is insufficient" not in log
    assert not [line for line in error_lines(log) if "Cuda" in line or "CUDA" in line], error_lines(log)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_host_ipv6_loopback_serves_http_grpc_and_metrics(server):
    """`--host ::1`: tritonserver is given [::1] for gRPC and ipv6:::1 for metrics, and all three
    services answer (gRPC was given ::1 unbracketed and reported the address in use)."""
    import urllib.request

    import tritonclient.grpc as grpcclient

    from dynspec.triton_repo.server_process import launch

    srv = launch(_repo_of(server), host="::1",
                 ready_timeout_s=120, env={"OMP_NUM_THREADS": "1"})
    try:
        assert generate(srv, {"input_ids": [5, 6, 7], "max_tokens": 2})[0] == 200
        client = grpcclient.InferenceServerClient(f"[::1]:{srv.ports.grpc}")
        try:
            assert client.is_server_ready()
        finally:
            client.close()
        with urllib.request.urlopen(f"http://[::1]:{srv.ports.metrics}/metrics", timeout=10) as r:
            assert b"dynspec_" in r.read()
    finally:
        srv.stop()


def _repo_of(server) -> str:
    return [a.split("=", 1)[1] for a in cmdline(server.proc.pid) if a.startswith("--model-repository=")][0]
