"""The reference model under a real `tritonserver` (the nvidia-pytriton wheel's), sent what a
careless or hostile client sends: one reply shape for every stream event, bodies over the size
that kills tritonserver, integers its JSON reader would wrap, huge prompts, refused and abandoned
requests (and what /metrics counts of them), and clients killed with streams open.

One server for the module (tiny pair, CPU, loopback only); every request loop is bounded and the
server is stopped at the end, also when a test fails.
"""
import http.client
import json
import os
import queue
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from dynspec.config import EngineConfig, ReferenceSettings
from dynspec.runtime.policy import DraftSchedule
from tests.helpers_metrics import metric, metrics, settle

MODEL = "dynspec"
MAX_SEQ_LEN = 1024


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from dynspec.runtime.generate.session import tiny_pair_dirs

    target, draft = tiny_pair_dirs()
    root = tmp_path_factory.mktemp("engine")
    EngineConfig(target_dir=str(target), draft_dir=str(draft), tp=1,
                 schedule=DraftSchedule.threshold(max_draft_len=4, disable_above=4),
                 reference=ReferenceSettings(max_batch_size=24, max_seq_len=MAX_SEQ_LEN)).write(root)
    return root


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    from dynspec.triton_repo.generate import generate_repo
    from dynspec.triton_repo.server_process import launch

    root = tmp_path_factory.mktemp("triton")
    srv = launch(generate_repo(engine, root / "repo"), log_path=root / "tritonserver.log", ready_timeout_s=120,
                 env={"OMP_NUM_THREADS": "1"})
    try:
        yield srv
    finally:
        srv.stop()


def post(server, path, body: bytes, headers=None, timeout=60.0):
    """One HTTP request to the server's public port -> (status, body bytes)."""
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def generate(server, body: dict, stream=False):
    status, raw = post(server, f"/v2/models/{MODEL}/generate" + ("_stream" if stream else ""),
                       json.dumps(body).encode())
    if not stream or status != 200:
        return status, json.loads(raw)
    return status, [json.loads(e[len("data: "):]) for e in raw.decode().split("\n\n") if e.startswith("data: ")]


def ready(server) -> bool:
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/v2/health/ready")
        return conn.getresponse().status == 200
    finally:
        conn.close()


def grpc_stream(server, inputs, timeout=60.0):
    """One request on its own gRPC stream -> every response's output_ids array, or the error text."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    q = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    arrays = []
    try:
        client.async_stream_infer(MODEL, inputs)
        deadline = time.monotonic() + timeout
        while True:
            result, error = q.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                return error.message()
            arrays.append(result.as_numpy("output_ids"))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return arrays
    finally:
        client.stop_stream()
        client.close()


def tensor(name, value, dtype, kind):
    import tritonclient.grpc as grpcclient

    arr = np.asarray(value, dtype=dtype)
    t = grpcclient.InferInput(name, list(arr.shape), kind)
    t.set_data_from_numpy(arr)
    return t


def id_request(prompt, max_tokens, stream=True):
    return [tensor("input_ids", prompt, np.int32, "INT32"), tensor("max_tokens", [max_tokens], np.int32, "INT32"),
            tensor("stream", [stream], np.bool_, "BOOL")]


PROMPT = [5, 6, 7, 8]


def test_output_ids_is_a_list_in_every_event(server):
    """tensorrtllm_backend clients read output_ids as a list; tritonserver's generate endpoints
    write a one-element tensor as a scalar, so a one-token event must still come as a list."""
    status, whole = generate(server, {"input_ids": PROMPT, "max_tokens": 6})
    assert status == 200 and isinstance(whole["output_ids"], list) and len(whole["output_ids"]) == 6, whole
    for n in (1, 6):
        status, events = generate(server, {"input_ids": PROMPT, "max_tokens": n, "stream": True}, stream=True)
        assert status == 200 and events, events
        assert all(isinstance(e["output_ids"], list) for e in events), events
        assert sum((e["output_ids"] for e in events), []) == whole["output_ids"][:n]
    status, one = generate(server, {"input_ids": PROMPT, "max_tokens": 1})
    assert status == 200 and one["output_ids"] == whole["output_ids"][:1], one
    arrays = grpc_stream(server, id_request(PROMPT, 6))
    assert isinstance(arrays, list) and all(a.ndim == 1 for a in arrays), arrays
    assert np.concatenate(arrays).tolist() == whole["output_ids"]


def test_a_body_over_the_limit_is_refused_and_the_server_keeps_serving(server):
    """tritonserver 2.51 takes signal 11 on any HTTP body over 4 MiB (even /v2/health/ready)."""
    from dynspec.triton_repo.front import MAX_BODY

    status, raw = post(server, "/v2/health/ready", b"a" * (4 << 20 | 100_000))
    assert status == 413 and f"limit of {MAX_BODY} bytes" in json.loads(raw)["error"], raw
    assert server.proc.poll() is None and ready(server)
    status, _ = post(server, "/v2/health/ready", b"a" * 3_900_000)     # under the limit: tritonserver answers
    assert status != 413 and server.proc.poll() is None and ready(server)
    status, raw = post(server, "/v2/health/ready", b"4\r\nabcd\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"})
    assert status == 411 and "Content-Length" in json.loads(raw)["error"]
    status, whole = generate(server, {"input_ids": PROMPT, "max_tokens": 2})
    assert status == 200 and len(whole["output_ids"]) == 2


@pytest.mark.parametrize("body,name", [
    ({"input_ids": PROMPT, "max_tokens": 4294967297}, "max_tokens"),
    ({"input_ids": [4294967297], "max_tokens": 4}, "input_ids"),
    ({"input_ids": PROMPT, "max_tokens": 4, "end_id": 4294967560}, "end_id"),
    ({"input_ids": PROMPT, "max_tokens": 4, "seed": -1}, "seed"),
])
def test_integers_outside_their_type_are_refused_by_name(server, body, name):
    """tritonserver's JSON reader wraps them (max_tokens 4294967297 becomes 1)."""
    status, reply = generate(server, body)
    assert status == 400 and f"input {name!r} holds" in reply["error"] and "outside" in reply["error"], reply
    infer = {"inputs": [{"name": "input_ids", "datatype": "INT32", "shape": [1], "data": [4294967297]},
                        {"name": "max_tokens", "datatype": "INT32", "shape": [1], "data": [4]}]}
    status, raw = post(server, f"/v2/models/{MODEL}/infer", json.dumps(infer).encode())
    assert status == 400 and "'input_ids' holds 4294967297" in json.loads(raw)["error"]
    status, whole = generate(server, {"input_ids": PROMPT, "max_tokens": 3})
    assert status == 200 and len(whole["output_ids"]) == 3


def test_a_huge_text_input_is_refused_before_tokenizing_and_holds_up_no_one(server):
    """10 MB of text over gRPC: refused by its length (tokenizing it would take many seconds), and
    a valid request sent meanwhile is served at once."""
    from concurrent.futures import ThreadPoolExecutor

    huge = [tensor("text_input", [b"the draft model " * (10 << 16)], np.object_, "BYTES"),
            tensor("max_tokens", [4], np.int32, "INT32"), tensor("stream", [False], np.bool_, "BOOL")]
    with ThreadPoolExecutor(2) as pool:
        t0 = time.monotonic()
        refused = pool.submit(grpc_stream, server, huge, 60.0)
        time.sleep(0.3)
        t1 = time.monotonic()
        small = grpc_stream(server, id_request(PROMPT, 4, stream=False))
        small_s = time.monotonic() - t1
        message = refused.result()
        huge_s = time.monotonic() - t0
    assert isinstance(message, str) and "refused before tokenizing" in message, message
    assert isinstance(small, list) and len(np.concatenate(small)) == 4
    assert huge_s < 20 and small_s < 3, (huge_s, small_s)      # 10 MB over gRPC on a busy host: seconds


def test_refused_and_cancelled_requests_are_counted(server):
    import tritonclient.grpc as grpcclient

    before = metrics(server)
    for _ in range(3):
        message = grpc_stream(server, id_request(PROMPT, 0))
        assert isinstance(message, str) and "max_tokens=0 must be at least 1" in message
    client = grpcclient.InferenceServerClient(server.grpc_url)
    q = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer(MODEL, id_request(PROMPT, MAX_SEQ_LEN - len(PROMPT) - 8))
    result, error = q.get(timeout=60)
    assert error is None
    client.stop_stream(cancel_requests=True)
    client.close()
    key = ("dynspec_requests_rejected_total", "dynspec_requests_cancelled_total")
    after = settle(server, lambda m: metric(m, key[1]) > metric(before, key[1]))
    assert metric(after, key[0], reason="invalid_argument") == metric(before, key[0], reason="invalid_argument") + 3
    assert metric(after, key[1]) == metric(before, key[1]) + 1


CLIENT = r"""
import sys, time
import numpy as np
import tritonclient.grpc as grpcclient

url, n, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
clients = []
for i in range(n):
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: None)
    inputs = []
    for name, value, dtype, kind in (("input_ids", [5, 6, 7, 8 + i], np.int32, "INT32"),
                                     ("max_tokens", [tokens], np.int32, "INT32"),
                                     ("stream", [True], np.bool_, "BOOL"), ("end_id", [-1], np.int32, "INT32")):
        t = grpcclient.InferInput(name, [len(value)], kind)
        t.set_data_from_numpy(np.asarray(value, dtype=dtype))
        inputs.append(t)
    c.async_stream_infer("dynspec", inputs)
    clients.append(c)
print("open", flush=True)
time.sleep(120)
"""


def test_a_client_killed_with_open_streams_leaves_the_server_serving(server):
    """A gRPC client holding 10 open streams dies by SIGKILL, a few rounds: tritonserver stays up,
    the abandoned rows are cancelled (the batch drains long before their tokens would end), and
    a new request is served. (A server that crashes anyway is restarted by the launcher CLI.)"""
    before = settle(server, lambda m: metric(m, "dynspec_batch_size") == 0, timeout=20)   # no earlier rows
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", CLIENT, server.grpc_url, "10", str(MAX_SEQ_LEN - 20)],
                                stdout=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            assert proc.stdout.readline().strip() == b"open"
            settle(server, lambda m: metric(m, "dynspec_batch_size") >= 10, timeout=30)   # every stream in
        finally:
            proc.kill()
            proc.wait(10)
        m = settle(server, lambda m: metric(m, "dynspec_batch_size") == 0, timeout=20)
        assert metric(m, "dynspec_batch_size") == 0 and server.proc.poll() is None
        arrays = grpc_stream(server, id_request(PROMPT, 3))
        assert isinstance(arrays, list) and len(np.concatenate(arrays)) == 3
    after = metrics(server)
    assert metric(after, "dynspec_requests_cancelled_total") >= metric(before, "dynspec_requests_cancelled_total") + 30


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_abandoned_http_requests_are_cancelled(server, endpoint):
    """16 requests of 1000 tokens whose clients hang up: each is cancelled within moments, and a
    16-token request sent after them is served at once instead of waiting behind them."""
    before = settle(server, lambda m: metric(m, "dynspec_batch_size") == 0, timeout=20)   # a fresh gauge
    host, port = server.http_url.rsplit(":", 1)
    socks = []
    try:
        for i in range(16):
            s = socket.create_connection((host, int(port)), timeout=10)
            body = json.dumps({"input_ids": PROMPT + [i + 9], "max_tokens": 1000, "end_id": -1,
                               "stream": endpoint == "generate_stream"}).encode()
            s.sendall(f"POST /v2/models/{MODEL}/{endpoint} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            socks.append(s)
        settle(server, lambda m: metric(m, "dynspec_batch_size") >= 8, timeout=30)
    finally:
        for s in socks:
            s.close()
    t0 = time.monotonic()
    status, reply = generate(server, {"input_ids": PROMPT, "max_tokens": 16})
    took = time.monotonic() - t0
    assert status == 200 and len(reply["output_ids"]) == 16
    # the counters move once the rows retire, which can be just after the reply went out
    m = settle(server, lambda m: metric(m, "dynspec_requests_cancelled_total")
               >= metric(before, "dynspec_requests_cancelled_total") + 16
               and metric(m, "dynspec_requests_finished_total", reason="length")
               > metric(before, "dynspec_requests_finished_total", reason="length"), timeout=20)
    assert metric(m, "dynspec_requests_cancelled_total") == metric(before, "dynspec_requests_cancelled_total") + 16
    assert metric(m, "dynspec_requests_finished_total", reason="length") == \
        metric(before, "dynspec_requests_finished_total", reason="length") + 1
    assert took < 5, took
