"""What the HTTP front (front.py) checks in a request body and rewrites in a reply; no I/O here.

    check_body(path, body, headers, types)   the JSON of a request, checked (Refusal on a bad one)
    list_output_ids(reply)                   a generate reply or `data: {...}` event, output_ids a list
                                             (and acceptance_fields on a final one)
    merge(events)                            generate_stream events -> one generate reply
    Events(rewrite).push(bytes)              server-sent events re-split and rewritten as they arrive
"""
from __future__ import annotations

import json
import re
import zlib
from typing import Mapping

import numpy as np

from dynspec.runtime.policy.draft_counts import acceptance, mean_k

GENERATE = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/(generate|generate_stream)$")
INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
INT_RANGES = {"INT8": 8, "INT16": 16, "INT32": 32, "INT64": 64, "UINT8": -8, "UINT16": -16, "UINT32": -32,
              "UINT64": -64}           # bits; negative: unsigned
MAX_JSON_DEPTH = 32                    # arrays and objects inside each other (a rank-8 tensor's data needs 11)
BINARY_HEADER = "inference-header-content-length"   # infer's binary extension: the JSON is this many bytes
STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


class Refusal(Exception):
    """A request answered by the front itself: HTTP status, message, and the reason it is counted under."""

    def __init__(self, status: int, message: str, reason: str = "malformed"):
        super().__init__(message)
        self.status, self.reason = status, reason


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
            raise Refusal(400, f"input {name!r} holds {v}, which is outside {datatype} ({low}..{high})",
                          "integer_out_of_range")


WORD_INPUTS = ("stop_words", "bad_words")    # generate's inputs of words: a string or a list of strings
TEXT_INPUTS = WORD_INPUTS + ("text_input",)


def check_text(name: str, value, words: bool) -> None:
    """Every string in `value` (a string or nested lists) must be valid Unicode: JSON's "\\ud800"
    is a lone surrogate, which has no UTF-8 form. words: `value` must be a string or a list of
    strings. Refusal 400 naming the input and the value, e.g. input 'stop_words' holds 7 (a number)."""
    todo = [value] if not isinstance(value, list) or not words else list(value)
    while todo:
        v = todo.pop()
        if isinstance(v, list) and not words:
            todo.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise Refusal(400, f"input {name!r} holds {v[:80]!r}, with a lone surrogate "
                                   f"({v[e.start]!r}); text must be valid Unicode", "text_invalid") from None
        elif words:
            kind = "a number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__
            raise Refusal(400, f"input {name!r} holds {json.dumps(v)[:80]} ({kind}); each word must be a JSON "
                               "string", "text_invalid")


def json_depth(text: bytes) -> int:
    """How deep arrays and objects nest in `text`, brackets inside strings not counted; linear in
    len(text), without recursion. b'{"a": [[1], "]]"]}' -> 3."""
    brackets = np.frombuffer(STRING.sub(b"", text), dtype=np.uint8)
    if brackets.size == 0:
        return 0
    step = np.isin(brackets, (ord("["), ord("{"))).astype(np.int32) - np.isin(brackets, (ord("]"), ord("}")))
    return int(max(np.cumsum(step).max(), 0))


def decoded(body: bytes, encoding: str | None, limit: int) -> bytes:
    """A request body as tritonserver reads it: gzip or deflate (Content-Encoding) undone, up to
    `limit` bytes (more: 413, a compressed body counts at its decompressed size)."""
    kind = (encoding or "identity").strip().lower()
    if kind == "identity":
        return body
    if kind not in ("gzip", "deflate"):
        raise Refusal(415, f"Content-Encoding {encoding!r} is not supported: send gzip, deflate or none",
                      "malformed")
    try:
        d = zlib.decompressobj(31 if kind == "gzip" else 15)
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise Refusal(400, f"the request body is not valid {kind} data ({e})") from None
    if len(out) > limit:
        raise Refusal(413, f"the request body decompresses to over this server's limit of {limit} bytes",
                      "body_too_large")
    return out


def json_part(path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    """The JSON of a request body: the whole body, or the first Inference-Header-Content-Length
    bytes of an infer request that sends its tensors in binary after it."""
    given = headers.get(BINARY_HEADER)
    if given is None or not INFER.match(path):
        return body
    if not given.isdigit() or int(given) > len(body):
        raise Refusal(400, f"header Inference-Header-Content-Length is {given!r}; it must be a whole number "
                           f"of bytes, at most the body's {len(body)}")
    return body[:int(given)]


def check_body(path: str, body: bytes, headers: Mapping[str, str], types: Mapping[str, str]) -> dict | None:
    """A request body's JSON -> the document (None for an empty body), or Refusal:
    400 when it is not JSON, nests deeper than MAX_JSON_DEPTH, holds an integer outside its
    input's type, text that is not valid Unicode, or a word (WORD_INPUTS) that is not a string (generate: `types` maps input names to Triton datatypes; infer bodies name their own).
    `headers`: the request's, names in lower case."""
    text = json_part(path, body, headers)
    if not text:
        return None
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise Refusal(400, f"the request's JSON nests {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted",
                      "json_too_deep")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise Refusal(400, f"the request body is not valid JSON: {e}", "json_invalid") from None
    if not isinstance(doc, dict):
        raise Refusal(400, f"the request body is a JSON {type(doc).__name__}; it must be a JSON object",
                      "json_invalid")
    if GENERATE.match(path):
        for name, value in doc.items():
            if name in types:
                check_integers(name, value, types[name])
            elif name in TEXT_INPUTS:
                check_text(name, value, name in WORD_INPUTS)
    elif INFER.match(path):
        for tensor in doc.get("inputs") or []:
            if isinstance(tensor, dict) and tensor.get("datatype") in INT_RANGES:
                check_integers(str(tensor.get("name")), tensor.get("data"), tensor["datatype"])
            elif isinstance(tensor, dict) and tensor.get("datatype") == "BYTES":
                check_text(str(tensor.get("name")), tensor.get("data"), False)
    return doc


def _json_dict(raw: bytes) -> dict | None:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


ACCEPTANCE_COUNTS = ("accepted_drafts", "drafted", "decode_steps")   # the model's final-response outputs (ints)


def _one(value):
    """A [1] output as tritonserver may write it: 5 or [5] -> 5."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def acceptance_fields(doc: dict) -> dict:
    """A reply or event with the model's per-request counts (its final one) -> the counts as
    numbers, mean_k exact (drafted / decode_steps, not the model's FP32) and `acceptance` =
    accepted_drafts / drafted, null for a request that never drafted. Others are returned as they are.
    {"accepted_drafts": 5, "drafted": 12, "decode_steps": 3, "mean_k": 4.0}
      -> {..., "mean_k": 4.0, "acceptance": 0.4166666666666667}"""
    counts = {name: _one(doc.get(name)) for name in ACCEPTANCE_COUNTS}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts.values()):
        return doc
    accepted, drafted, steps = counts["accepted_drafts"], counts["drafted"], counts["decode_steps"]
    return {**doc, **counts, "mean_k": mean_k(drafted, steps), "acceptance": acceptance(accepted, drafted)}


def list_output_ids(event: bytes) -> bytes:
    """One generate reply or one `data: {...}` event: a scalar `output_ids` becomes a list, and a
    final one's counts get acceptance_fields.
    b'data: {"output_ids":7}' -> b'data: {"output_ids":[7]}'; anything else is left as it is."""
    prefix = b"data: " if event.startswith(b"data: ") else b""
    doc = _json_dict(event[len(prefix):])
    if doc is None:
        return event
    out = acceptance_fields(doc)
    if isinstance(out.get("output_ids"), int):
        out = {**out, "output_ids": [out["output_ids"]]}
    if out is doc:
        return event
    return prefix + json.dumps(out, separators=(",", ":")).encode()


def stream_events(raw: bytes) -> list[dict]:
    """A generate_stream reply body -> its events' JSON objects (a body that is not a stream of
    events, e.g. tritonserver's error reply: that one object, or an error quoting it)."""
    events = [_json_dict(e[len(b"data: "):]) or {} for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    return events or [_json_dict(raw) or {"error": raw.decode(errors="replace")[:200]}]


def merge(events: list[dict]) -> dict:
    """Events -> one generate reply: the first error, or the fields of the events (a later one's
    value wins: the final event's per-request counts) with output_ids and text_output joined, and
    acceptance_fields.
    [{"output_ids": [5, 83], "text_output": "%s"}, {"output_ids": 14, "text_output": "."}]
      -> {"output_ids": [5, 83, 14], "text_output": "%s."}"""
    for e in events:
        if "error" in e:
            return {"error": e["error"]}
    out: dict = {}
    for e in events:
        out.update(e)
    ids: list = []
    for e in events:
        v = e.get("output_ids", [])
        ids.extend(v if isinstance(v, list) else [v])
    out["output_ids"] = ids
    out["text_output"] = "".join(str(e.get("text_output", "")) for e in events)
    return acceptance_fields(out)


class Events:
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
