"""The three ports of a tritonserver (HTTP, gRPC, metrics): free ones, the checks before a launch,
and which process listens on a port (from /proc)."""
from __future__ import annotations

import errno
import http.client
import os
import random
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from dynspec.errors import DynspecError


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int


EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000                    # below: the well-known and registered ports people configure by hand


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to bind(0) and to outgoing connections, e.g. (32768, 60999)."""
    try:
        low, high = map(int, EPHEMERAL.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999       # the Linux default


def free_ports(host: str = "127.0.0.1") -> Ports:
    """Three distinct ports that bind on `host` right now, drawn outside the ephemeral range.

    A port from bind(0) lies inside that range, so between its release and tritonserver's bind
    (seconds: the server loads its models first) any outgoing connection or bind(0) on the machine
    (gloo, mpirun, a client) may be given it. Outside the range only an explicit bind can take it."""
    family, addr = resolve(host)
    low, high = ephemeral_range()
    pool = [*range(LOWEST, low), *range(high + 1, 65536)]
    random.shuffle(pool)
    socks = []
    try:
        for port in [*pool, *[0] * 3]:        # every such port taken: the kernel's choice
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.bind((addr[0], port, *addr[2:]))
            except OSError as e:
                s.close()
                if e.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue
                raise DynspecError(f"--host {host} is not an address of this machine: cannot bind it "
                                   f"({e.strerror}); give a local address, e.g. 127.0.0.1 or 0.0.0.0") from None
            socks.append(s)
            if len(socks) == 3:
                return Ports(*(s.getsockname()[1] for s in socks))
        raise DynspecError(f"no free TCP port on {host}")
    finally:
        for s in socks:
            s.close()


def resolve(host: str) -> tuple[int, tuple]:
    """(address family, socket address with port 0) of `host`, e.g. (AF_INET, ('127.0.0.1', 0))."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise DynspecError(f"--host {host!r} does not resolve: {e.strerror}") from None
    return family, addr


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
    family, addr = resolve(host)
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
    return bool(inodes) and bool(socket_inodes(pid) & inodes)

def unix_listening_inodes(path: str) -> set[int]:
    """Socket inodes listening on the Unix socket `path`, from /proc/net/unix: a line there is
    `Num RefCount Protocol Flags Type St Inode Path`; flag 00010000 (__SO_ACCEPTCON) marks a listener."""
    inodes = set()
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return inodes
    for line in lines:
        f = line.split(None, 7)
        if len(f) == 8 and f[7] == path and int(f[3], 16) & 0x10000:
            inodes.add(int(f[6]))
    return inodes


def owns_unix_listener(pid: int, path: str) -> bool:
    """True when process `pid` holds the socket listening on the Unix socket `path`."""
    inodes = unix_listening_inodes(path)
    return bool(inodes) and bool(socket_inodes(pid) & inodes)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds (from /proc/PID/fd)."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if m:
            out.add(int(m.group(1)))
    return out


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket: UnixHTTPConnection("/run/x/http.sock").request("GET", "/")."""

    def __init__(self, path: str, timeout: float = 10.0):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def unix_status(path: str, url: str, timeout: float = 1.0) -> int:
    """The HTTP status a GET of `url` gets from the server on Unix socket `path`."""
    conn = UnixHTTPConnection(path, timeout)
    try:
        conn.request("GET", url)
        return conn.getresponse().status
    finally:
        conn.close()
