"""Recorded acceptance traces: the one reader and writer of the trace file format.

A trace holds, for each recorded request, r_t at every output offset t: how many drafts in a
row a greedy chain of depth kmax gets right when it starts after output token t (the chain
drafts output tokens t+1, t+2, ...). A verify step at offset t drafting K accepts min(r_t, K),
exactly, for greedy chain drafting; so one trace serves every K and every schedule.

    offset t    0  1  2  3  4  5
    r_t         3  2  1  0  0  5        K=2 from t=0: accepts 2, emits 3 tokens -> next t=3
                                        K=2 from t=3: accepts 0, emits 1 token  -> next t=4

File (JSON; one request per line when written here):
    {"format": "dynspec-acceptance-trace/1",
     "source": {"pair": ..., "prompts": ..., "new_tokens": 96, "kmax": 8, "command": ...},
     "kmax": 8,
     "requests": [[3, 2, 1, 0, 0, 5, ...], ...]}      ints in 0..kmax, each request non-empty

`from_vllm_stats` turns vLLM's per-request spec-decode stats (`--per-request-spec-decode-stats
detailed` / `--per-request-spec-decode-metrics detailed`: the object under a response choice's
"speculative_decoding_stats" or a response's "metrics.speculative_decoding", with ordered
"per_step_accepted" and "per_step_drafted" arrays; docs/features/speculative_decoding/
acceptance_metrics.md in vllm-project/vllm) into a trace; see its doc for what it can and
cannot know.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from dynspec.errors import DynspecError

FORMAT = "dynspec-acceptance-trace/1"
MAX_KMAX = 127                     # r values travel as int8 (`table`)
MAX_FILE_BYTES = 32 << 20          # a trace file larger than this is refused before it is read
MAX_TABLE_BYTES = 256 << 20        # n_requests x the longest request, one int8 each (`table`)


@dataclass(frozen=True)
class Trace:
    kmax: int
    requests: tuple[tuple[int, ...], ...]            # requests[i][t] = r_t of request i
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    path: str | None = field(default=None, compare=False, hash=False)   # the file it was read from

    def __post_init__(self) -> None:
        validate({"format": FORMAT, "source": dict(self.source), "kmax": self.kmax,
                  "requests": [list(r) for r in self.requests]}, self.path or "trace")

    @cached_property
    def lengths(self) -> np.ndarray:
        """[n_requests] int64 number of recorded offsets of each request."""
        return np.array([len(r) for r in self.requests], dtype=np.int64)

    @cached_property
    def table(self) -> np.ndarray:
        """[n_requests, max length] int8: row i is requests[i], then zeros past lengths[i]."""
        out = np.zeros((len(self.requests), int(self.lengths.max())), dtype=np.int8)
        for i, r in enumerate(self.requests):
            out[i, :len(r)] = r
        return out

    @cached_property
    def rates(self) -> np.ndarray:
        """[n_requests] float64: the share of offsets whose first draft is accepted (r_t >= 1).
        Example: r = [3, 0, 1, 0] -> 0.5."""
        return np.array([np.mean(np.asarray(r) >= 1) for r in self.requests], dtype=np.float64)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shown(x: Any) -> str:
    """repr(x), cut to 40 characters: a value quoted in an error stays short."""
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def validate(obj: Any, where: str) -> None:
    """Check a decoded trace file; raise DynspecError naming `where` and the field or index at
    fault (Trace.__post_init__ calls it too). The padded table (n_requests x the longest request)
    must fit MAX_TABLE_BYTES: it is sized here, before anything allocates it."""
    if not isinstance(obj, dict):
        raise DynspecError(f"{where}: a trace is a JSON object, not {type(obj).__name__}")
    if obj.get("format") != FORMAT:
        raise DynspecError(f"{where}: field 'format' is {_shown(obj.get('format'))}; expected {FORMAT!r}")
    if not isinstance(obj.get("source"), dict):
        raise DynspecError(f"{where}: field 'source' must be an object (what pair, prompts and command)")
    kmax = obj.get("kmax")
    if not _is_int(kmax) or not 1 <= kmax <= MAX_KMAX:
        raise DynspecError(f"{where}: field 'kmax' is {_shown(kmax)}; expected an integer in 1..{MAX_KMAX}")
    reqs = obj.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise DynspecError(f"{where}: field 'requests' must be a non-empty list of lists of integers")
    for i, r in enumerate(reqs):
        if not isinstance(r, list) or not r:
            raise DynspecError(f"{where}: requests[{i}] must be a non-empty list of integers")
        for t, x in enumerate(r):
            if not _is_int(x) or not 0 <= x <= kmax:
                raise DynspecError(f"{where}: requests[{i}][{t}] is {_shown(x)}; expected an integer in 0..kmax={kmax}")
    longest = max(len(r) for r in reqs)
    if len(reqs) * longest > MAX_TABLE_BYTES:
        raise DynspecError(f"{where}: {len(reqs)} requests padded to the longest ({longest} offsets) make a"
                           f" {len(reqs) * longest}-byte table; at most {MAX_TABLE_BYTES} (split the trace)")


def trace_from_json(obj: Any, where: str) -> Trace:
    validate(obj, where)
    return Trace(obj["kmax"], tuple(tuple(r) for r in obj["requests"]), dict(obj["source"]), where)


def _read_bytes(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_FILE_BYTES. Opened without blocking and checked
    by fstat before any read, so a FIFO, a device (/dev/zero) or a directory is refused at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise DynspecError(f"{path}: cannot read the acceptance trace: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket")
            raise DynspecError(f"{path}: is {kind}; an acceptance trace must be a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise DynspecError(f"{path}: {st.st_size} bytes; an acceptance trace may hold at most {MAX_FILE_BYTES}")
        chunks, n = [], 0
        while n <= MAX_FILE_BYTES:                 # a file that grows while read stops at the cap
            b = os.read(fd, min(1 << 20, MAX_FILE_BYTES + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > MAX_FILE_BYTES:
            raise DynspecError(f"{path}: grew past {MAX_FILE_BYTES} bytes while read; an acceptance trace may"
                               f" hold at most {MAX_FILE_BYTES}")
        return b"".join(chunks)
    except OSError as e:
        raise DynspecError(f"{path}: cannot read the acceptance trace: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_trace(path: str | os.PathLike) -> Trace:
    """The validated trace in FILE; any fault is one DynspecError line naming the file: not a
    regular file, larger than MAX_FILE_BYTES, not UTF-8, not JSON, a bad field, a table past
    MAX_TABLE_BYTES."""
    path = Path(path)
    data = _read_bytes(path)
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DynspecError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise DynspecError(f"{path}: not JSON (nested too deeply)") from None
    except ValueError as e:
        raise DynspecError(f"{path}: not JSON ({e})") from None
    return trace_from_json(obj, str(path))


def trace_text(trace: Trace) -> str:
    """The file's text: header fields indented, then one request per line."""
    head = json.dumps({"format": FORMAT, "source": dict(trace.source), "kmax": trace.kmax}, indent=2)
    rows = ",\n".join("    " + json.dumps(list(r), separators=(",", ":")) for r in trace.requests)
    return head[:-2] + ',\n  "requests": [\n' + rows + "\n  ]\n}\n"


def write_trace(path: str | os.PathLike, trace: Trace) -> None:
    """Write next to PATH, then rename into place (artifacts.write_text)."""
    from dynspec.artifacts import write_text

    write_text(path, trace_text(trace))


def summary(trace: Trace) -> dict:
    """Requests, offsets, mean r and the spread of per-request mean r and rate."""
    means = np.array([np.mean(r) for r in trace.requests])
    flat = np.concatenate([np.asarray(r) for r in trace.requests])
    return {"requests": len(trace.requests), "offsets": int(flat.size), "kmax": trace.kmax,
            "mean_r": round(float(flat.mean()), 3),
            "request_mean_r": {"min": round(float(means.min()), 3), "median": round(float(np.median(means)), 3),
                               "max": round(float(means.max()), 3)},
            "request_rate": {"min": round(float(trace.rates.min()), 3),
                             "median": round(float(np.median(trace.rates)), 3),
                             "max": round(float(trace.rates.max()), 3)}}


def steps_to_offsets(accepted: list[int]) -> list[int]:
    """One request's verify steps -> r at every output offset it covers. Step s at offset t_s
    accepted a_s of n_s drafts, so r_{t_s} = a_s (a lower bound where a_s == n_s), and the
    offsets t_s+1 .. t_s+a_s, which no step started at, get a_s - 1, ..., 0: the rest of that
    chain. Replayed at the recorded draft lengths it gives back `accepted` exactly.
    Example: accepted [2, 0, 1] (3 drafted each) -> [2, 1, 0, 0, 1, 0]."""
    out: list[int] = []
    for a in accepted:
        out += list(range(a, -1, -1))
    return out


def from_vllm_stats(stats: Iterable[Mapping[str, Any]], source: Mapping[str, Any], where: str = "vllm stats") -> Trace:
    """vLLM `detailed` per-request stats objects (one per request: per_step_accepted,
    per_step_drafted, num_spec_tokens) -> a Trace with kmax = the largest num_spec_tokens.
    The offsets inside an accepted run and the censored steps are filled as steps_to_offsets
    says, so it is exact only at the recorded draft lengths."""
    requests, kmax = [], 0
    for i, s in enumerate(stats):
        if not isinstance(s, Mapping):
            raise DynspecError(f"{where}: request {i} is not an object")
        a, n = s.get("per_step_accepted"), s.get("per_step_drafted")
        if not isinstance(a, list) or not isinstance(n, list) or not a or len(a) != len(n):
            raise DynspecError(f"{where}: request {i}: 'per_step_accepted' and 'per_step_drafted' must be"
                               " non-empty lists of one length (vLLM's 'detailed' level)")
        if not all(_is_int(x) and _is_int(y) and 0 <= x <= y for x, y in zip(a, n)):
            raise DynspecError(f"{where}: request {i}: every step needs 0 <= accepted <= drafted")
        k = s.get("num_spec_tokens")
        kmax = max(kmax, k if _is_int(k) else 0, max(n))
        requests.append(tuple(steps_to_offsets(a)))
    if not requests:
        raise DynspecError(f"{where}: no requests")
    return Trace(max(kmax, 1), tuple(requests), dict(source))
