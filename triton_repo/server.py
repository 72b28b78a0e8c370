"""Run the `tritonserver` that the nvidia-pytriton wheel ships (CPU works) on a model repository.

The launcher's CLI: start the server (server_process.launch), print its ready line, restart it when it
crashes, stop it on SIGTERM / SIGINT / SIGHUP. Finding and configuring the binary: triton_install.py.

    python -m dynspec.triton_repo.server REPO [--http-port 8000 --grpc-port 8001 --metrics-port 8002]
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Callable, Mapping

from dynspec.errors import DynspecError
from dynspec.triton_repo.ports import Ports
from dynspec.triton_repo.server_process import STOP_SIGNALS, ServerExited, TritonServer, launch
from dynspec.triton_repo.triton_install import ADMIN_APIS, ADMIN_HEADER, admin_key


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
BACKOFF_S, MAX_BACKOFF_S = 1.0, 16.0        # the wait before restart n (n >= 2): 1, 2, 4, ... 16 s


def backoff_s(restart: int) -> float:
    """Seconds to wait before restart number `restart`: none before the first, then doubling to a cap."""
    return 0.0 if restart <= 1 else min(BACKOFF_S * 2 ** (restart - 2), MAX_BACKOFF_S)


def serve(args: argparse.Namespace, *, env: Mapping[str, str | None] | None = None,
          watch: Callable[[], str | None] | None = None, note: str = "", restart: bool | None = None) -> int:
    """Launch on add_server_args' flags, print the ready line (+ note), wait until a stop signal
    (exit status 0), the server's own exit or a message from `watch` (polled every WATCH_S: the TP
    launcher's fault report; 1), and stop the server. A server that does not start: 2.
    restart (default: without `watch`, i.e. one process serves): a server that exits by itself
    (a crash: signal 11 on a hostile request, kill -9), also while the launcher waits for it to be
    ready, is started again on the same ports after backoff_s, with a line on stderr and the count
    in the model's dynspec_server_restarts gauge; more than RESTART_LIMIT restarts within
    RESTART_WINDOW_S: exit 1. A first start that fails other than by a signal: exit 2. An HTTP front that stops serving is
    restarted the same way (front_watch). The admin key (server_command) is made once, printed
    with the first ready line, and kept over restarts."""
    restart = watch is None if restart is None else restart
    key = admin_key()
    _Stop.seen = _Stop.stopping = _Stop.key_shown = False
    previous = {s: signal.signal(s, _raise_stop) for s in STOP_SIGNALS}
    crashes: list[float] = []
    started = False
    try:
        while True:
            code, ready = _serve_once(args, {**(env or {}), RESTARTS_ENV: str(len(crashes))}, watch, note, key,
                                      started)
            started = started or ready
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
            wait = backoff_s(len(crashes))
            after = f" in {wait:g} s" if wait else ""
            print(f"error: tritonserver exited with {code}; restarting it{after} (restart {len(crashes)})",
                  file=sys.stderr, flush=True)
            try:
                time.sleep(wait)
            except _Stop:
                return 0
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


def _serve_once(args, env, watch, note, key, started):
    """One server's life -> (how it ended, whether it was ready): None (stopped by a signal, or
    exited 0), "start" (did not start), "watch" (stopped on watch's or front_watch's message), or
    why it ended by itself ("signal 11"; also a crash before it was ready, or any failed start
    once a server of this launcher has been ready)."""
    ports = Ports(args.http_port, args.grpc_port, args.metrics_port)
    try:
        server = launch(args.repo, ports, host=args.host, log_path="-", ready_timeout_s=args.ready_timeout,
                        env=env, die_with_parent=True, key=key)
    except ServerExited as e:
        if e.returncode < 0:
            return f"signal {-e.returncode} before it was ready", False
        if started:
            return f"code {e.returncode} before it was ready", False
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return "start", False
    except DynspecError as e:
        if started:
            return f"a failed start ({str(e).splitlines()[0]})", False
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return "start", False
    except _Stop:
        return None, False
    # one write, newline included: tritonserver logs to the same stdout, and print's separate
    # write of the newline (unbuffered output) let a log line land inside the ready line
    admin = "" if _Stop.key_shown else (f"{server.protection}\nadmin APIs ({ADMIN_APIS}) need the header "
                                        f"{ADMIN_HEADER}: {key} (HTTP only; closed over gRPC)\n")
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
        return "watch", True
    code = server.proc.returncode
    if signalled or _Stop.seen or code == 0:
        return None, True
    _Stop.stopping = False                  # it ended by itself: killed (a crash, OOM, kill -9) or failed
    return (f"signal {-code}" if code < 0 else f"code {code}"), True


def make_parser(prog: str = "python -m dynspec.triton_repo.server", description: str | None = None):
    """The launcher's parser: flags only as spelled in full, defaults in --help (dynspec.parsers.Parser)."""
    from dynspec.parsers import Parser

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
