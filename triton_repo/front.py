"""A bounded HTTP front for tritonserver's HTTP service: what a client can send there is checked
before it reaches tritonserver, and the generate endpoints' replies get one shape.

    client --HTTP--> HttpFront (the public --http-port) --HTTP--> tritonserver (127.0.0.1, a private port)

Why, for the tritonserver of the nvidia-pytriton wheel (Triton 2.51):
  - an HTTP body over 4 MiB, on any endpoint, kills it with signal 11 (it has no flag that bounds
    request sizes): a body over max_body bytes is answered 413 here and never forwarded; a body
    without Content-Length (chunked) is answered 411, since its size is not known in advance;
  - its JSON reader wraps integers into the declared type (max_tokens 4294967297 is taken as 1):
    an integer outside the declared type of a known input is answered 400, naming the input;
  - its generate endpoints write a one-element output as a scalar (`"output_ids": 7`) and a
    longer one as a list: `output_ids` is always written as a list here.

One request per connection: the front reads a request, forwards it with `Connection: close`,
relays the reply with `Connection: close`, and closes. gRPC and metrics do not pass through here.
Every wait is bounded (IO_TIMEOUT_S per read or write).
"""
from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

HEAD_MAX = 64 << 10                    # request or response head, bytes
MAX_BODY = 4_000_000                   # the largest request body forwarded (tritonserver dies above 4 MiB)
IO_TIMEOUT_S = 300.0                   # one read or write of a client or of tritonserver
GENERATE = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/(generate|generate_stream)$")
INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
INT_RANGES = {"INT8": 8, "INT16": 16, "INT32": 32, "INT64": 64, "UINT8": -8, "UINT16": -16, "UINT32": -32,
              "UINT64": -64}           # bits; negative: unsigned


class Refusal(Exception):
    """A request answered by the front itself: HTTP status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Head:
    start: str                         # the request or status line
    headers: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    def encode(self, drop: tuple[str, ...] = (), add: tuple[tuple[str, str], ...] = ()) -> bytes:
        kept = [(k, v) for k, v in self.headers if k.lower() not in drop] + list(add)
        return (self.start + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept) + "\r\n").encode("latin-1")


def int_range(datatype: str) -> tuple[int, int]:
    bits = INT_RANGES[datatype]
    return (0, (1 << -bits) - 1) if bits < 0 else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


def check_integers(name: str, value, datatype: str) -> None:
    """Every integer in `value` (a number or nested lists) must fit `datatype`, else Refusal naming it.
    Example: check_integers("max_tokens", [4294967297], "INT32") -> 400, "... outside INT32 ...". """
    low, high = int_range(datatype)
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, list):
            todo.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool) and not low <= v <= high:
            raise Refusal(400, f"input {name!r} holds {v}, which is outside {datatype} ({low}..{high})")


def check_body(path: str, body: bytes, types: Mapping[str, str]) -> None:
    """The integer checks of a generate or infer JSON body; `types`: input name -> Triton datatype
    of the model's integer inputs (generate), infer bodies name their own datatypes."""
    if not (GENERATE.match(path) or INFER.match(path)) or not body:
        return
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return                          # tritonserver answers a body that is not JSON itself
    if not isinstance(doc, dict):
        return
    if GENERATE.match(path):
        for name, value in doc.items():
            if name in types:
                check_integers(name, value, types[name])
        return
    for tensor in doc.get("inputs") or []:
        if isinstance(tensor, dict) and tensor.get("datatype") in INT_RANGES:
            check_integers(str(tensor.get("name")), tensor.get("data"), tensor["datatype"])


def list_output_ids(event: bytes) -> bytes:
    """One generate reply or one `data: {...}` event: a scalar `output_ids` becomes a list.
    b'data: {"output_ids":7}' -> b'data: {"output_ids":[7]}'; anything else is left as it is."""
    prefix = b"data: " if event.startswith(b"data: ") else b""
    try:
        doc = json.loads(event[len(prefix):])
    except (ValueError, UnicodeDecodeError):
        return event
    if not isinstance(doc, dict) or not isinstance(doc.get("output_ids"), int):
        return event
    doc["output_ids"] = [doc["output_ids"]]
    return prefix + json.dumps(doc, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------- reading HTTP

class ClientGone(ConnectionError):
    """The client closed its connection while its reply was being made."""


class Reader:
    """Buffered reads from one socket, each bounded by the socket's timeout. With `watch` (the
    client's socket, while tritonserver's reply is read), a client that hangs up ends the read."""

    def __init__(self, sock: socket.socket, watch: socket.socket | None = None):
        self.sock, self.buf, self.watch = sock, b"", watch

    def _more(self) -> bool:
        if self.watch is not None:
            ready, _, _ = select.select([self.sock, self.watch], [], [], IO_TIMEOUT_S)
            if self.watch in ready and not self.watch.recv(1, socket.MSG_PEEK):
                raise ClientGone("the client closed its connection")
            if self.sock not in ready:
                raise TimeoutError(f"no reply from tritonserver within {IO_TIMEOUT_S:g} s")
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def head(self, what: str) -> Head | None:
        """A request or response head; None when the peer closed before sending one."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > HEAD_MAX:
                raise Refusal(431, f"the {what} head is over {HEAD_MAX} bytes")
            if not self._more():
                if self.buf:
                    raise Refusal(400, f"the {what} head is incomplete")
                return None
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        headers = tuple((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
        return Head(lines[0], headers)

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._more():
                raise ConnectionError("the peer closed mid-body")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > HEAD_MAX or not self._more():
                raise ConnectionError("bad chunk framing")
        out, self.buf = self.buf.split(b"\r\n", 1)
        return out

    def chunks(self) -> Iterator[bytes]:
        """A chunked body's chunks, up to the last (empty) one."""
        while True:
            size = int(self.line().split(b";")[0], 16)
            if size == 0:
                while self.line():      # trailers, up to the empty line
                    pass
                return
            data = self.exactly(size)
            self.line()
            yield data

    def rest(self) -> Iterator[bytes]:
        if self.buf:
            yield self.buf
            self.buf = b""
        while self._more():
            yield self.buf
            self.buf = b""


def _status_reply(status: int, message: str) -> bytes:
    reasons = {400: "Bad Request", 411: "Length Required", 413: "Payload Too Large", 431: "Headers Too Large",
               502: "Bad Gateway"}
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


LINGER_S, LINGER_BYTES = 5.0, 64 << 20


def _linger(client: socket.socket) -> None:
    """After a refusal, read and drop what the client still sends (up to LINGER_BYTES or
    LINGER_S), so that it reads the refusal instead of a connection reset mid-upload."""
    try:
        client.shutdown(socket.SHUT_WR)
        client.settimeout(1.0)
        deadline, seen = time.monotonic() + LINGER_S, 0
        while time.monotonic() < deadline and seen < LINGER_BYTES:
            chunk = client.recv(1 << 20)
            if not chunk:
                return
            seen += len(chunk)
    except OSError:
        return


HOP = ("connection", "keep-alive", "expect", "proxy-connection", "te", "upgrade")


# ----------------------------------------------------------------------------- the front

class HttpFront:
    """Listens on (host, port) and relays each checked request to tritonserver at 127.0.0.1:upstream.

        front = HttpFront("127.0.0.1", 8000, upstream=41234, types={"max_tokens": "INT32"})
        front.start(); ...; front.stop()
        front.refused          # {"body_too_large": 1, ...}: requests the front answered itself
    """

    def __init__(self, host: str, port: int, upstream: int, types: Mapping[str, str] | None = None,
                 max_body: int = MAX_BODY, on_refusal: Callable[[str], None] | None = None):
        self.host, self.port, self.upstream, self.max_body = host, port, upstream, max_body
        self.types = dict(types or {})
        self.refused: dict[str, int] = {}
        self._on_refusal = on_refusal
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        family, _, _, _, addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(256)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept, name="dynspec-http-front", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._thread is not None:
            self._thread.join(5)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except (OSError, AttributeError):
                return
            threading.Thread(target=self._serve, args=(client,), name="dynspec-http-conn", daemon=True).start()

    def _count(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1
        if self._on_refusal is not None:
            self._on_refusal(reason)

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(IO_TIMEOUT_S)
        try:
            with client:
                reader = Reader(client)
                try:
                    request = self._read_request(client, reader)
                except Refusal as r:
                    self._count({411: "body_without_length", 413: "body_too_large", 431: "head_too_large"}.get(
                        r.status, "integer_out_of_range" if "outside" in str(r) else "malformed"))
                    client.sendall(_status_reply(r.status, str(r)))
                    _linger(client)
                    return
                if request is not None:
                    self._relay(client, *request)
        except (OSError, ConnectionError, ValueError):
            return                      # the client went away, or sent what is not HTTP

    def _read_request(self, client: socket.socket, reader: Reader) -> tuple[Head, bytes] | None:
        head = reader.head("request")
        if head is None:
            return None
        parts = head.start.split(" ")
        if len(parts) != 3:
            raise Refusal(400, f"bad request line {head.start[:80]!r}")
        if head.get("transfer-encoding") is not None:
            raise Refusal(411, "a request body must come with Content-Length (chunked bodies are not accepted)")
        try:
            length = int(head.get("content-length") or 0)
        except ValueError:
            raise Refusal(400, f"Content-Length {head.get('content-length')!r} is not a number") from None
        if length > self.max_body or length < 0:
            raise Refusal(413, f"request body of {length} bytes is over this server's limit of {self.max_body} "
                               "bytes")
        if length and (head.get("expect") or "").lower() == "100-continue":
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = reader.exactly(length)
        check_body(parts[1].split("?", 1)[0], body, self.types)
        return head, body

    def _connect(self, client: socket.socket) -> socket.socket | None:
        """A connection to tritonserver's private HTTP port, or None after a 502 to the client."""
        try:
            return socket.create_connection(("127.0.0.1", self.upstream), timeout=IO_TIMEOUT_S)
        except OSError as e:
            client.sendall(_status_reply(502, f"tritonserver does not answer: {e.strerror or e}"))
            return None

    def _relay(self, client: socket.socket, head: Head, body: bytes) -> None:
        path = head.start.split(" ")[1].split("?", 1)[0]
        if path.endswith("/generate") and GENERATE.match(path):
            doc = _json_dict(body)
            if doc is not None:         # as a stream, so that a client who leaves cancels it
                self._generate(client, head, path + "_stream", doc)
                return
        up = self._connect(client)
        if up is None:
            return
        with up:
            up.sendall(head.encode(drop=HOP, add=(("Connection", "close"),)) + body)
            reader = Reader(up)
            reply = reader.head("response")
            if reply is None:
                client.sendall(_status_reply(502, "tritonserver closed the connection without a reply"))
                return
            rewrite = bool(GENERATE.match(path)) and " 200 " in reply.start + " "
            self._relay_body(client, reader, reply, rewrite, head.start.startswith("HEAD "))

    def _relay_body(self, client: socket.socket, reader: Reader, reply: Head, rewrite: bool, no_body: bool) -> None:
        status = int(reply.start.split(" ")[1])
        chunked = (reply.get("transfer-encoding") or "").lower() == "chunked"
        length = reply.get("content-length")
        if no_body or status in (204, 304) or 100 <= status < 200:
            client.sendall(reply.encode(drop=HOP, add=(("Connection", "close"),)))
            return
        if chunked:
            client.sendall(reply.encode(drop=HOP, add=(("Connection", "close"),)))
            events = _Events(rewrite)
            for chunk in reader.chunks():
                out = events.push(chunk)
                if out:
                    client.sendall(b"%x\r\n%s\r\n" % (len(out), out))
            tail = events.flush()
            if tail:
                client.sendall(b"%x\r\n%s\r\n" % (len(tail), tail))
            client.sendall(b"0\r\n\r\n")
        elif length is not None:
            data = reader.exactly(int(length))
            data = list_output_ids(data) if rewrite else data
            client.sendall(reply.encode(drop=HOP + ("content-length",),
                                        add=(("Content-Length", str(len(data))), ("Connection", "close"))) + data)
        else:
            client.sendall(reply.encode(drop=HOP, add=(("Connection", "close"),)))
            for data in reader.rest():
                client.sendall(data)

    def _generate(self, client: socket.socket, head: Head, stream_path: str, doc: dict) -> None:
        """A non-streaming generate request, sent to tritonserver as generate_stream with
        stream true and answered as generate would: one JSON reply, output_ids and text_output
        joined over the events (the model's deltas join to its whole text), or 400 with the first
        error. tritonserver notices a closed connection only when a write to it fails, so a
        stream, written every iteration, is what lets a client who hangs up cancel its request."""
        body = json.dumps({**doc, "stream": True}).encode()
        start = f"POST {stream_path} HTTP/1.1"
        headers = tuple((k, v) for k, v in head.headers if k.lower() not in HOP + ("content-length",))
        up = self._connect(client)
        if up is None:
            return
        with up:
            up.sendall(Head(start, headers).encode(add=(("Content-Length", str(len(body))), ("Connection", "close")))
                       + body)
            reader = Reader(up, watch=client)
            try:
                reply = reader.head("response")
                status, events = _stream_events(reader, reply)
            except ClientGone:
                return                  # closing `up` makes the model's next write fail: it is cancelled
        merged = _merge(events)
        if "error" in merged:
            status = 400 if status == 200 else status
        data = json.dumps(merged, separators=(",", ":")).encode()
        reason = "OK" if status == 200 else "Bad Request"
        client.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: "
                       f"{len(data)}\r\nConnection: close\r\n\r\n".encode() + data)


def _json_dict(body: bytes) -> dict | None:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _stream_events(reader: Reader, reply: Head | None) -> tuple[int, list[dict]]:
    """tritonserver's generate_stream reply -> (status, its events' JSON objects)."""
    if reply is None:
        return 502, [{"error": "tritonserver closed the connection without a reply"}]
    status = int(reply.start.split(" ")[1])
    if (reply.get("transfer-encoding") or "").lower() == "chunked":
        raw = b"".join(reader.chunks())
    else:
        raw = reader.exactly(int(reply.get("content-length") or 0))
    events = [_json_dict(e[len(b"data: "):]) or {} for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    return status, events or [_json_dict(raw) or {"error": raw.decode(errors="replace")[:200]}]


def _merge(events: list[dict]) -> dict:
    """Events -> one generate reply: the first error, or the fields of the first event with
    output_ids and text_output joined.
    [{"output_ids": [5, 83], "text_output": "%s"}, {"output_ids": 14, "text_output": "."}]
      -> {"output_ids": [5, 83, 14], "text_output": "%s."}"""
    for e in events:
        if "error" in e:
            return {"error": e["error"]}
    out = dict(events[0])
    ids: list = []
    for e in events:
        v = e.get("output_ids", [])
        ids.extend(v if isinstance(v, list) else [v])
    out["output_ids"] = ids
    out["text_output"] = "".join(str(e.get("text_output", "")) for e in events)
    return out


class _Events:
    """Server-sent events split on their blank line, each rewritten by list_output_ids.
    push(b'data: {"output_ids":7}\\n\\nda') -> b'data: {"output_ids":[7]}\\n\\n' (b'da' waits)."""

    def __init__(self, rewrite: bool):
        self.rewrite, self.buf = rewrite, b""

    def push(self, data: bytes) -> bytes:
        if not self.rewrite:
            return data
        self.buf += data
        done, sep, rest = self.buf.rpartition(b"\n\n")
        if not sep:
            return b""
        self.buf = rest
        return b"".join(list_output_ids(e) + b"\n\n" for e in done.split(b"\n\n"))

    def flush(self) -> bytes:
        out, self.buf = self.buf, b""
        return list_output_ids(out) if out else b""
