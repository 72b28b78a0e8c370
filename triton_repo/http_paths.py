"""The request paths the HTTP front (front.py) accepts, and which of them are admin APIs.

tritonserver's HTTP service decodes percent-encoding and resolves `.` and `..` segments before it
routes, so `/v2/models/m/%67enerate` and `/v2/models/x/../m/generate` reach its generate endpoint.
The front routes on the path as sent, so it accepts only paths that mean one thing: a path that
starts with '/' and holds no percent-encoding, no dot segment and no empty segment. Anything else
is answered 400, naming what was found; every check of the front then applies to every way of
naming an endpoint.

    check_target("/v2/models/dynspec/generate?x=1")   -> "/v2/models/dynspec/generate"
    check_target("/v2/models/dynspec/%67enerate")     -> Refusal 400
    is_admin("/v2/logging")                           -> True
"""
from __future__ import annotations

import hmac
import re
from typing import Mapping

from dynspec.triton_repo.http_rules import Refusal

# tritonserver's admin APIs over HTTP (model-repository, trace, logging)
ADMIN = re.compile(r"^/v2/(repository(/.*)?|logging|trace/setting|models/[^/]+(/versions/[^/]+)?/trace/setting)$")


def check_target(target: str) -> str:
    """A request target as sent -> its path (the query is left to tritonserver, which routes
    without it), or Refusal 400 when the path could name an endpoint in more than one way."""
    path = target.split("?", 1)[0]
    if not path.startswith("/"):
        raise Refusal(400, f"request target {target[:200]!r}: only a path starting with '/' is accepted",
                      "path_refused")
    for bad, what in (("%", "percent-encoding"), ("\\", "a backslash"), ("#", "a '#'")):
        if bad in path:
            raise Refusal(400, f"request path {path[:200]!r} holds {what}; send the path in plain characters "
                               "(this server accepts no encoded path)", "path_refused")
    segments = path.split("/")[1:]
    for seg in segments[:-1] + [s for s in segments[-1:] if s in (".", "..")]:
        if seg in ("", ".", ".."):
            name = "an empty segment ('//')" if seg == "" else f"a dot segment ({seg!r})"
            raise Refusal(400, f"request path {path[:200]!r} holds {name}; send the path without it",
                          "path_refused")
    return path


def is_admin(path: str) -> bool:
    return bool(ADMIN.match(path))


def check_admin(path: str, headers: Mapping[str, str], key: str | None, header: str) -> None:
    """An admin API needs `header` with `key` (403 otherwise); key None: admin APIs are open.
    headers: the request's, names in lower case."""
    if key is None or not is_admin(path):
        return
    given = headers.get(header.lower(), "")
    if not hmac.compare_digest(given.encode(errors="replace"), key.encode()):
        raise Refusal(403, f"{path} is an admin API: it needs the header {header} with this server's admin key "
                           "(printed by the launcher under its first ready line)", "admin_refused")
