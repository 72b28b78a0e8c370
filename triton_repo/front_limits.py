"""How many client connections the HTTP front (front.py) holds open, and what one more is answered."""
from __future__ import annotations

import asyncio
import json
import resource

MAX_CONNECTIONS = 1024                 # open client connections, at most
FD_RESERVE = 64                        # descriptors kept for the launcher's own files, pipes and children


def connection_bound(limit: int = MAX_CONNECTIONS) -> int:
    """Open client connections the descriptor limit allows: each proxied request holds two
    descriptors (the client's and tritonserver's). RLIMIT_NOFILE 1024 -> 480."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(1, min(limit, (soft - FD_RESERVE) // 2))


class Busy(asyncio.Protocol):
    """A connection over the bound: 503 and closed."""
    REPLY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
             b"Content-Length: %d\r\n\r\n%s")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        body = json.dumps({"error": "too many open connections to this server; try again"}).encode()
        transport.write(self.REPLY % (len(body), body))
        transport.close()
