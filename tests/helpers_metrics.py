"""The dynspec_* Prometheus series of a running server (tests/test_triton_server.py's `server`
fixture and its kin), parsed and polled."""
from __future__ import annotations

import re
import time


def metrics(server) -> dict:
    """Prometheus text -> {(name, frozenset(labels)): value} for the dynspec_* families."""
    out = {}
    for line in server.metrics().splitlines():
        m = re.match(r"^(dynspec_\w+)\{([^}]*)\} (\S+)$", line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(m: dict, name: str, **labels) -> float:
    """The sum of `name` over the series whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in m.items() if n == name and want <= set(ls))


def settle(server, check, timeout=10.0):
    """Poll /metrics until check(metrics) holds (the model publishes gauges every 50 ms); returns
    those metrics. Fails after `timeout` seconds, with the dynspec_* series last read."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(server)
        if check(m):
            return m
        assert time.monotonic() < deadline, f"metrics did not settle within {timeout:g} s: {m}"
        time.sleep(0.05)
