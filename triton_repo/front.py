"""A bounded HTTP front for tritonserver's HTTP service, on aiohttp: what a client can send there is
checked before it reaches tritonserver, and the generate endpoints' replies get one shape.

    client --HTTP--> HttpFront (the public --http-port) --HTTP--> tritonserver (a Unix socket in a 0700 folder)

For the tritonserver of the nvidia-pytriton wheel (Triton 2.51):
  - it copies a request body onto its thread's stack (any endpoint) and has no flag that bounds
    request sizes: a body over max_body bytes is answered 413 here and never forwarded (the
    launcher also gives tritonserver a stack 16 times that); a chunked body is answered 411,
    since its size is not known in advance;
  - its JSON reader wraps integers into the declared type (max_tokens 4294967297 is taken as 1), and
    answers a body that is not JSON with 500: both are answered 400 here, naming the input or the
    JSON error, as is JSON nested deeper than http_rules.MAX_JSON_DEPTH (http_rules.check_body);
  - its generate endpoints write a one-element output as a scalar (`"output_ids": 7`) and a
    longer one as a list: `output_ids` is always written as a list here.

A path that tritonserver would decode or resolve (percent-encoding, dot or empty segments) is
answered 400 (http_paths.check_target), and its admin APIs need the launch's admin key
(http_paths.check_admin). The request parser is aiohttp's (llhttp): two Content-Length headers, `Content-Length: 3_4`, or
Content-Length with Transfer-Encoding are answered 400. Every wait is bounded: a request head must
be complete within HEAD_TIMEOUT_S of the connection (or of the previous reply on a kept-alive one),
its body within BODY_TIMEOUT_S; tritonserver's reply may pause UPSTREAM_READ_S between reads. At most
max_connections client connections are open (from the descriptor limit); one more is answered 503
and closed. Out of descriptors, asyncio's accept loop pauses for a second and accepts again.
A client that hangs up cancels its request: its handler is cancelled and the connection to
tritonserver closed, and tritonserver's next write fails. gRPC and metrics do not pass through here.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Callable, Mapping

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from dynspec.triton_repo.front_limits import Busy, connection_bound
from dynspec.triton_repo.http_paths import check_admin, check_target
from dynspec.triton_repo.http_rules import GENERATE, Events, Refusal, check_body, decoded, list_output_ids, merge, \
    stream_events
from dynspec.triton_repo.triton_install import ADMIN_HEADER      # checked here, never forwarded

MAX_BODY = 4_000_000                   # the largest request body forwarded
HEAD_TIMEOUT_S = 30.0                  # connection (or previous reply) -> a complete request head
BODY_TIMEOUT_S = 60.0                  # request head -> its complete body
UPSTREAM_READ_S = 300.0                # the longest pause in tritonserver's reply
HEAD_LIMITS = {"max_line_size": 8190, "max_field_size": 8190, "max_headers": 100}
HOP = (ADMIN_HEADER, "connection", "keep-alive", "expect", "proxy-connection", "te", "upgrade", "transfer-encoding",
       "content-length", "host")


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=json.dumps({"error": message}).encode(), content_type="application/json")


def _parser_message(exc: BaseException | None, message: str | None) -> str:
    """aiohttp's parser error -> one line: 'Duplicate Content-Length: b'Content-Length: 5000''."""
    lines = [line.strip() for line in str(getattr(exc, "message", None) or message or exc or "").splitlines()]
    lines = [line for line in lines if line and line != "^"]
    return " ".join(lines[:2]) or "unreadable request"


def _close_reply(sent: asyncio.Future) -> None:
    """Done callback of an abandoned request to tritonserver: its reply, once it came, is closed."""
    if not sent.cancelled() and sent.exception() is None:
        sent.result().close()


class _Connection(RequestHandler):
    """One client connection: parser errors answered as JSON and counted, not logged."""
    front: "HttpFront"

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the reply was under way")
        if status == 500:
            self.front.count("error")
            text = f"internal error in the HTTP front: {type(exc).__name__}: {exc}"
        else:
            self.front.count("malformed")
            text = f"malformed HTTP request: {_parser_message(exc, message)}"
        resp = _error(status, text)
        resp.force_close()
        return resp

    def log_exception(self, *args, **kwargs) -> None:
        pass                            # each one is answered and counted by handle_error

    def connection_lost(self, exc: BaseException | None) -> None:
        self.front.open_connections -= 1
        super().connection_lost(exc)


class HttpFront:
    """Listens on (host, port) and relays each checked request to tritonserver at `upstream` (the
    path of its Unix socket, or a port on 127.0.0.1), from an asyncio loop on a thread of its own.
    admin_key: what the admin APIs need in header ADMIN_HEADER (None: they are open).

        front = HttpFront("127.0.0.1", 8000, upstream="/tmp/d/http.sock", types={"max_tokens": "INT32"})
        front.start(); ...; front.alive(); front.restart(); front.stop()
        front.refused          # {"body_too_large": 1, "accept_error": 2, ...}: what it answered itself or met
    """

    def __init__(self, host: str, port: int, upstream: int | str, types: Mapping[str, str] | None = None,
                 max_body: int = MAX_BODY, on_refusal: Callable[[str], None] | None = None,
                 max_connections: int | None = None, head_timeout_s: float = HEAD_TIMEOUT_S,
                 body_timeout_s: float = BODY_TIMEOUT_S, admin_key: str | None = None):
        self.host, self.port, self.upstream, self.max_body = host, port, upstream, max_body
        self.admin_key = admin_key
        self.head_timeout_s, self.body_timeout_s = head_timeout_s, body_timeout_s
        self.types = dict(types or {})
        self.max_connections = connection_bound() if max_connections is None else max_connections
        self.refused: dict[str, int] = {}
        self._on_refusal = on_refusal
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._client: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------------- life

    def start(self, timeout_s: float = 10.0) -> None:
        """Bind (an address in use raises OSError here) and serve on a new thread."""
        family, _, _, _, addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(512)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]      # port 0: the one the OS chose, kept over restarts
        ready, failed = threading.Event(), []
        self._thread = threading.Thread(target=self._run, args=(sock, ready, failed), name="dynspec-http-front",
                                        daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s) or failed:
            self.stop()
            raise RuntimeError(f"the HTTP front on {self.host}:{self.port} did not start: "
                               f"{failed[0] if failed else f'not serving after {timeout_s:g} s'}")

    def alive(self) -> bool:
        """True while the front's thread runs its loop (the launcher restarts a front that is not)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive() and self._stopping is not None:
            try:
                loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:        # the loop is closed already
                pass
            thread.join(timeout_s)
        self._thread = self._loop = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def count(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1
        if self._on_refusal is not None:
            self._on_refusal(reason)

    def _run(self, sock: socket.socket, ready: threading.Event, failed: list) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        # asyncio reports an accept() out of descriptors here, then pauses accepting for a second
        loop.set_exception_handler(lambda _loop, context: self.count(
            "accept_error" if str(context.get("message", "")).startswith("socket.accept()") else "loop_error"))
        try:
            loop.run_until_complete(self._serve(sock, ready))
        except Exception as e:          # reported to start(); later, alive() is False and the launcher restarts it
            failed.append(f"{type(e).__name__}: {e}")
            ready.set()
        finally:
            sock.close()
            loop.close()

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        # keepalive_timeout: aiohttp closes a connection that has not sent a complete request head
        # this long after it opened or after its previous reply (the head deadline)
        conn_args = dict(keepalive_timeout=self.head_timeout_s, lingering_time=5.0, auto_decompress=False,
                         access_log=None, **HEAD_LIMITS)
        handler = web.Server(self._handle, handler_cancellation=True, **conn_args)

        # counted from the protocol's making, not from connection_made: asyncio accepts a whole
        # backlog (up to 100 sockets) before any of them is made, and the bound must hold for those
        self.open_connections = 0

        def protocol():
            if self.open_connections >= self.max_connections:
                self.count("connections_over_limit")
                return Busy()
            self.open_connections += 1
            conn = _Connection(handler, loop=loop, **conn_args)
            conn.front = self
            return conn

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=UPSTREAM_READ_S)
        unix = isinstance(self.upstream, str)
        connector = aiohttp.UnixConnector(self.upstream, limit=self.max_connections, force_close=True) if unix \
            else aiohttp.TCPConnector(limit=self.max_connections, force_close=True)
        self._client = aiohttp.ClientSession("http://localhost" if unix else f"http://127.0.0.1:{self.upstream}",
                                              connector=connector,
                                              timeout=timeout, auto_decompress=False,
                                              skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"))
        server = await loop.create_server(protocol, sock=sock, backlog=512)
        ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            await handler.shutdown(2.0)
            await self._client.close()

    # ------------------------------------------------------------------------- one request

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            path = check_target(request.raw_path)
            headers = {k.lower(): v for k, v in request.headers.items()}
            check_admin(path, headers, self.admin_key, ADMIN_HEADER)
            body = await self._body(request)
            doc = check_body(path, decoded(body, headers.get("content-encoding"), self.max_body), headers,
                             self.types)
        except Refusal as r:
            self.count(r.reason)
            resp = _error(r.status, str(r))
            if r.status == 408 and request.transport is not None:
                await resp.prepare(request)
                await resp.write_eof()
                request.transport.close()       # at once: the rest of a late body is not waited for
            return resp
        if request.method == "POST" and path.endswith("/generate") and GENERATE.match(path) and doc is not None:
            return await self._generate(request, path + "_stream", doc)
        return await self._relay(request, body, rewrite=bool(GENERATE.match(path)))

    async def _body(self, request: web.BaseRequest) -> bytes:
        if "Transfer-Encoding" in request.headers:
            raise Refusal(411, "a request body must come with Content-Length (chunked bodies are not accepted)",
                          "body_without_length")
        length = request.content_length or 0
        if length > self.max_body:
            raise Refusal(413, f"request body of {length} bytes is over this server's limit of {self.max_body} "
                               "bytes", "body_too_large")
        if not length:
            return b""
        if request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            return await asyncio.wait_for(request.content.readexactly(length), self.body_timeout_s)
        except asyncio.TimeoutError:
            raise Refusal(408, f"the request body ({length} bytes) did not arrive within {self.body_timeout_s:g} s",
                          "timeout") from None
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the client closed its connection mid-body") from None

    def _headers(self, request: web.BaseRequest, drop: tuple[str, ...] = ()) -> dict[str, str]:
        out: dict[str, str] = {}
        for k, v in request.headers.items():
            if k.lower() not in HOP + drop:
                out[k] = f"{out[k]}, {v}" if k in out else v
        return out

    async def _upstream(self, method: str, url: str, headers: dict, body: bytes):
        """tritonserver's reply (a ClientResponse to read and release), or an error reply (502).
        A client that hangs up before tritonserver's reply head arrives closes the connection to
        tritonserver once it has: tritonserver sees a connection closed under a reply it has begun
        (its next write fails, which cancels the request), not one closed before any reply."""
        sent = asyncio.ensure_future(self._client.request(method, url, headers=headers, data=body,
                                                           allow_redirects=False))
        try:
            return await asyncio.shield(sent)
        except asyncio.CancelledError:
            sent.add_done_callback(_close_reply)
            raise
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            return _error(502, f"tritonserver does not answer: {e or type(e).__name__}")

    async def _relay(self, request: web.BaseRequest, body: bytes, rewrite: bool) -> web.StreamResponse:
        drop = ("accept-encoding",) if rewrite else ()
        # HEAD goes up as GET (tritonserver answers HEAD 405 with a body); aiohttp sends no body for HEAD
        method = "GET" if request.method == "HEAD" else request.method
        up = await self._upstream(method, request.raw_path, self._headers(request, drop), body)
        if isinstance(up, web.Response):
            return up
        async with up:
            rewrite = rewrite and up.status == 200
            headers = [(k, v) for k, v in up.headers.items() if k.lower() not in HOP]
            if request.method == "HEAD" or (rewrite and up.content_length is not None):
                data = await up.read()
                return web.Response(status=up.status, reason=up.reason, headers=headers,
                                    body=list_output_ids(data) if rewrite else data)
            resp = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
            if up.content_length is not None:
                resp.content_length = up.content_length
            await resp.prepare(request)
            events = Events(rewrite)            # server-sent events of generate_stream, rewritten
            async for chunk in up.content.iter_any():
                out = events.push(chunk)
                if out:
                    await resp.write(out)
            tail = events.flush()
            if tail:
                await resp.write(tail)
            await resp.write_eof()
            return resp

    async def _generate(self, request: web.BaseRequest, stream_path: str, doc: dict) -> web.StreamResponse:
        """A non-streaming generate request, sent to tritonserver as generate_stream with stream
        true and answered as generate would: one JSON reply, output_ids and text_output joined over
        the events (the model's deltas join to its whole text), or 400 with the first error.
        tritonserver notices a closed connection only when a write to it fails, so a stream,
        written every iteration, is what lets a client who hangs up cancel its request."""
        body = json.dumps({**doc, "stream": True}).encode()
        headers = {**self._headers(request, ("content-encoding", "accept-encoding")),
                   "Content-Type": "application/json"}
        up = await self._upstream("POST", stream_path, headers, body)
        if isinstance(up, web.Response):
            return up
        async with up:
            status, raw = up.status, await up.read()
        merged = merge(stream_events(raw))
        if "error" in merged and status == 200:
            status = 400
        return web.Response(status=status, body=json.dumps(merged, separators=(",", ":")).encode(),
                            content_type="application/json")
