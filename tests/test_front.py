"""The HTTP front (triton_repo/front.py, http_rules.py) as a hostile client meets it: request framing
it must refuse (two Content-Length headers, `Content-Length: 3_4`), JSON it must refuse (not JSON,
nested 100,000 deep), tritonserver's admin APIs closed on the public ports (open on HTTP with the key), bounds on stop words,
on open connections, on the time a request head may take and on descriptors, and the launcher's
restart of a front that stopped.

The checks that need no server come first; the others share one real `tritonserver` (tiny pair,
CPU, loopback only), stopped at the end also when a test fails. Every socket read has a timeout."""
import gzip
import http.client
import json
import socket
import subprocess
import sys
import time

import pytest

from dynspec.triton_repo.http_rules import MAX_JSON_DEPTH, Refusal, check_body, decoded, json_depth
from dynspec.triton_repo.words import MAX_WORDS, MAX_WORDS_BYTES, WordMatcher, check_word_bounds

MODEL = "dynspec"
GEN = f"/v2/models/{MODEL}/generate"
INFER = f"/v2/models/{MODEL}/infer"


# ----------------------------------------------------------------------------- no server

def test_json_depth_counts_brackets_outside_strings_only():
    assert json_depth(b'{"a": [[1], "]]"], "b": "[[[[{{"}') == 3
    assert json_depth(b'"\\"[[["') == 0 and json_depth(b"7") == 0
    assert json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000


@pytest.mark.parametrize("body,status,words", [
    (b'{"input_ids": [5, 6', 400, "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, 400, f"nests 100000 levels deep; at most {MAX_JSON_DEPTH}"),
    (b"[1, 2]", 400, "a JSON list; it must be a JSON object"),
    (b'{"max_tokens": 4294967297, "input_ids": [1]}', 400, "input 'max_tokens' holds 4294967297"),
    (b'{"max_tokens": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),
])
def test_bodies_tritonserver_would_misread_are_refused_with_their_reason(body, status, words):
    with pytest.raises(Refusal) as e:
        check_body(GEN, body, {}, {"max_tokens": "INT32"})
    assert e.value.status == status and words in str(e.value), str(e.value)


def test_infer_bodies_are_checked_up_to_their_binary_part():
    doc = json.dumps({"inputs": [{"name": "max_tokens", "datatype": "INT32", "shape": [1], "data": [4]}]}).encode()
    assert check_body(INFER, doc + b"\x00[[[[", {"inference-header-content-length": str(len(doc))}, {})
    with pytest.raises(Refusal, match="Inference-Header-Content-Length is '99999'"):
        check_body(INFER, doc, {"inference-header-content-length": "99999"}, {})


def test_a_compressed_body_is_checked_at_its_decompressed_size():
    bomb = gzip.compress(b" " * 5_000_000)
    with pytest.raises(Refusal) as e:
        decoded(bomb, "gzip", 4_000_000)
    assert e.value.status == 413 and "decompresses to over" in str(e.value)
    assert decoded(gzip.compress(b'{"a": 1}'), "gzip", 100) == b'{"a": 1}'


def test_words_are_bounded_by_count_and_by_bytes_naming_the_input():
    check_word_bounds("stop_words", [b"x"] * MAX_WORDS)
    with pytest.raises(ValueError, match=f"'stop_words' holds {MAX_WORDS + 1} words; at most {MAX_WORDS}"):
        check_word_bounds("stop_words", [b"x"] * (MAX_WORDS + 1))
    with pytest.raises(ValueError, match=f"'bad_words' holds over {MAX_WORDS_BYTES} bytes of words"):
        check_word_bounds("bad_words", [b"y" * 1000] * 100)


def test_word_matcher_finds_what_a_scan_of_every_word_finds():
    import random

    rng = random.Random(7)
    for _ in range(200):
        words = [tuple(rng.randrange(4) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 6))]
        text = [rng.randrange(4) for _ in range(30)]
        m = WordMatcher(words)
        for i, t in enumerate(text):
            ended = [w for w in words if tuple(text[max(0, i + 1 - len(w)):i + 1]) == w]
            hit = m.push(t)
            assert (hit is None) == (not ended), (words, text, i)
            if hit is not None:
                assert len(words[hit]) == min(map(len, ended))


def test_word_matching_costs_the_same_for_many_words_as_for_one():
    """480k stop words made generation take 20 s when each token was checked against each word."""
    many = [(7, i, j) for i in range(700) for j in range(700)]            # 490,000 words
    text = [7, 1, 2] * 20_000
    t0 = time.perf_counter()
    m = WordMatcher(many[:1])
    for t in text:
        m.push(t)
    one = time.perf_counter() - t0
    m = WordMatcher(many)
    t0 = time.perf_counter()
    for t in text:
        m.push(t)
    assert time.perf_counter() - t0 < 10 * one + 0.2


# ----------------------------------------------------------------------------- a real tritonserver

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from dynspec.config import EngineConfig, ReferenceSettings
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.generate.session import tiny_pair_dirs
    from dynspec.triton_repo.generate import generate_repo
    from dynspec.triton_repo.server_process import launch

    target, draft = tiny_pair_dirs()
    root = tmp_path_factory.mktemp("front")
    EngineConfig(target_dir=str(target), draft_dir=str(draft), tp=1,
                 schedule=DraftSchedule.threshold(max_draft_len=4, disable_above=4),
                 reference=ReferenceSettings(max_batch_size=8, max_seq_len=512)).write(root / "engine")
    srv = launch(generate_repo(root / "engine", root / "repo"), log_path=root / "tritonserver.log",
                 ready_timeout_s=120, env={"OMP_NUM_THREADS": "1"})
    try:
        yield srv
    finally:
        srv.stop()


def address(server):
    host, port = server.http_url.rsplit(":", 1)
    return host, int(port)


def request(addr, method, path, body=None, headers=None, timeout=30.0):
    """-> (status, body bytes)."""
    conn = http.client.HTTPConnection(*addr, timeout=timeout)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def raw(addr, data: bytes, timeout=10.0) -> bytes:
    """Bytes sent as they are; what comes back until the server closes (or `timeout`: TimeoutError)."""
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def served(addr) -> bool:
    status, reply = request(addr, "POST", GEN, json.dumps({"input_ids": [5, 6, 7], "max_tokens": 2}).encode())
    return status == 200 and len(json.loads(reply)["output_ids"]) == 2


@pytest.mark.parametrize("lengths,named", [
    (("2", "5000"), "Duplicate Content-Length"),
    (("2", "2"), "Duplicate Content-Length"),
    (("3_4",), "Invalid character in Content-Length"),
])
def test_conflicting_or_malformed_framing_is_answered_400_at_once(server, lengths, named):
    head = "".join(f"Content-Length: {n}\r\n" for n in lengths)
    t0 = time.monotonic()
    reply = raw(address(server), f"POST {GEN} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + b'{"')
    status, _, body = reply.partition(b"\r\n\r\n")
    assert b" 400 " in status.split(b"\r\n")[0], reply
    assert named in json.loads(body)["error"] and time.monotonic() - t0 < 5, reply
    assert served(address(server))


def test_json_nested_100000_deep_gets_400_and_the_server_keeps_serving(server):
    status, reply = request(address(server), "POST", GEN, b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nests 100000 levels deep" in json.loads(reply)["error"], reply
    status, reply = request(address(server), "POST", INFER, b'{"inputs": [{"name": "input_ids", "data": [5, 6')
    assert status == 400 and "not valid JSON" in json.loads(reply)["error"], reply
    assert served(address(server)) and server.proc.poll() is None


def test_admin_apis_are_closed_on_the_public_ports_and_open_with_the_launch_key(server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from dynspec.triton_repo.triton_install import ADMIN_HEADER

    addr = address(server)
    for method, path, body in (("POST", "/v2/logging", b'{"log_verbose_level": 9}'), ("GET", "/v2/logging", None),
                               ("POST", "/v2/repository/index", b"{}"), ("GET", "/v2/trace/setting", None),
                               ("POST", f"/v2/repository/models/{MODEL}/unload", b"{}")):
        status, reply = request(addr, method, path, body)
        assert status == 403 and ADMIN_HEADER in json.loads(reply)["error"], (path, reply)
    status, reply = request(addr, "GET", "/v2/logging", headers={ADMIN_HEADER: server.admin_key})
    assert status == 200 and json.loads(reply)["log_verbose_level"] == 0, reply
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_log_settings()
        with pytest.raises(InferenceServerException, match="restricted"):    # over gRPC: closed, key or not
            client.get_log_settings(headers={f"triton-grpc-protocol-{ADMIN_HEADER}": server.admin_key})
    finally:
        client.close()
    assert served(addr)


def test_stop_words_are_bounded_and_matched_in_time_linear_in_the_output(server):
    """The 480k words (3.8 MB) that took 20 s are refused at once, naming the input; a list at
    the bound runs as fast as a request without stop words."""
    addr = address(server)
    base = {"input_ids": [5, 6, 7, 8], "max_tokens": 200, "end_id": -1}
    words = [base36(i) for i in range(480_000)]
    body = json.dumps({**base, "stop_words": words}, separators=(",", ":")).encode()
    assert len(body) < 4_000_000
    t0 = time.monotonic()
    status, reply = request(addr, "POST", GEN, body, timeout=60)
    assert status == 400 and f"'stop_words' holds 480000 words; at most {MAX_WORDS}" in json.loads(reply)["error"]
    assert time.monotonic() - t0 < 10
    status, plain = request(addr, "POST", GEN, json.dumps(base).encode())
    t0 = time.monotonic()
    rare = ["\u2603" + w for w in words[:MAX_WORDS]]          # words the greedy output never contains
    status, reply = request(addr, "POST", GEN, json.dumps({**base, "stop_words": rare}).encode())
    assert status == 200 and json.loads(reply)["output_ids"] == json.loads(plain)["output_ids"], reply
    assert time.monotonic() - t0 < 5


def base36(i: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        i, r = divmod(i, 36)
        out = digits[r] + out
        if not i:
            return out


def test_a_request_head_or_body_that_does_not_complete_in_time_is_cut_off(server):
    from dynspec.triton_repo.front import HttpFront

    front = HttpFront("127.0.0.1", 0, server.upstream_http, head_timeout_s=0.5, body_timeout_s=0.5)
    front.start()
    addr = ("127.0.0.1", front.port)
    try:
        t0 = time.monotonic()
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")      # and never the blank line
            assert s.recv(100) == b""
        assert time.monotonic() - t0 < 3
        t0 = time.monotonic()
        reply = raw(addr, f"POST {GEN} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{".encode())
        assert b" 408 " in reply.split(b"\r\n")[0] and b"did not arrive within 0.5 s" in reply, reply
        assert time.monotonic() - t0 < 3
        assert request(addr, "GET", "/v2/health/ready")[0] == 200
    finally:
        front.stop()


def test_connections_over_the_bound_get_503_until_others_close(server):
    from dynspec.triton_repo.front import HttpFront

    front = HttpFront("127.0.0.1", 0, server.upstream_http, max_connections=4)
    front.start()
    addr = ("127.0.0.1", front.port)
    try:
        idle = [socket.create_connection(addr, timeout=10) for _ in range(4)]
        time.sleep(0.2)
        status, reply = request(addr, "GET", "/v2/health/ready")
        assert status == 503 and "too many open connections" in json.loads(reply)["error"]
        for s in idle:
            s.close()
        deadline = time.monotonic() + 5
        while request(addr, "GET", "/v2/health/ready")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        front.stop()


FRONT_UNDER_ULIMIT = r"""
import json, resource, sys
from dynspec.triton_repo.front import HttpFront
from dynspec.triton_repo.ports import free_ports

upstream, nofile, bound = sys.argv[1], int(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
port = free_ports().http
front = HttpFront("127.0.0.1", port, upstream, **({} if bound == "default" else {"max_connections": int(bound)}))
front.start()
print(port, getattr(front, "max_connections", 0), flush=True)
sys.stdin.read()
print(json.dumps(front.refused), flush=True)
"""


@pytest.mark.parametrize("bound", ["default", "10000"])
def test_more_connections_than_descriptors_leave_the_port_serving(server, bound):
    """Under RLIMIT_NOFILE 160, 400 idle connections: with the front's own bound (from the limit)
    the extra ones are answered 503; with a bound above the limit accept() runs out of descriptors.
    Either way, once the clients close, /v2/health/ready answers 200 within 15 s."""
    proc = subprocess.Popen([sys.executable, "-c", FRONT_UNDER_ULIMIT, str(server.upstream_http), "160", bound],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port, limit = map(int, proc.stdout.readline().split())
        assert limit == (48 if bound == "default" else 10000)
        idle = []
        for _ in range(400):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break                               # the listen backlog is full
        assert len(idle) > 160
        time.sleep(1.5)
        for s in idle:
            s.close()
        t0, status = time.monotonic(), None
        while time.monotonic() - t0 < 15 and status != 200:
            try:
                status = request(("127.0.0.1", port), "GET", "/v2/health/ready", timeout=2)[0]
            except OSError:
                time.sleep(0.1)
        assert status == 200, f"no 200 within 15 s (last: {status})"
        out, _ = proc.communicate("", timeout=30)
        refused = json.loads(out)
        key = "connections_over_limit" if bound == "default" else "accept_error"
        assert refused.get(key, 0) > 0, refused
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_front_that_stopped_is_restarted_by_the_launcher(server, capsys):
    from dynspec.triton_repo.server import front_watch

    assert front_watch(server) is None and capsys.readouterr().err == ""
    server.front._loop.call_soon_threadsafe(server.front._loop.stop)        # its loop dies under it
    deadline = time.monotonic() + 5
    while server.front.alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert front_watch(server) is None
    assert capsys.readouterr().err.strip() == f"error: the HTTP front on {server.http_url} stopped; restarting it"
    assert server.front.alive() and served(address(server))
