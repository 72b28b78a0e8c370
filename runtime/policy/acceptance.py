"""How many drafted tokens a verify step accepts.

`Greedy` is the real, lossless rule: accept the longest prefix of drafts that equals the
target's own greedy tokens. `Bernoulli(p)` is a labelled benchmark model for random-weight
checkpoints, where real acceptance is meaningless: each draft is accepted with probability p,
in order, until the first rejection. Its output is NOT the target's greedy output, so only the
benchmarks may use it (the executor refuses it unless told it runs a benchmark).

A Bernoulli draft is accepted iff u(seed, request key, position) < p, where u is a hash of the
drafted token's position in its request (`draft_uniforms`), not a draw from a stream. So, as
with a real draft, whether position j is accepted is a property of the request, the same for
every K, mode and trial (common random numbers): comparing static K=3 with a dynamic K=4 on
the same requests then measures the K, not the luck of the draws.

Worked example, K=3:
    drafts   [a, b, c]      target greedy [a, b, x, y]
    match    [1, 1, 0]   -> cumprod [1, 1, 0] -> accepted 2; emitted [a, b, x]

Per-request benchmark models draw like Bernoulli, each request at its own rate (`rate_of`):
    BernoulliMix(((0.9, 0.5), (0.2, 0.5)))  request k runs at 0.9 if key_uniform(seed, k) < 0.5,
                                            else 0.2: a fixed hash of (seed, key), so every mode
                                            and trial sees the same rate for the same request
    Shift(0.8, 0.2, at=100)                 keys 0..99 at 0.8, keys 100.. at 0.2
    Shift(0.8, 0.2, at=0.5)                 `at` a fraction of a run's requests: `resolve(model,
                                            n_requests=40)` -> Shift(0.8, 0.2, at=20)
The engine keeps one rate per cache slot, set when the slot is reserved for a request key.

`TraceReplay("benchmarks/traces/tiny_pair.json")` replays recorded real acceptance
(runtime/policy/acceptance_trace.py): request key k replays recorded request
i = floor(key_uniform(seed, k) * n_requests), and a row of that request at output offset t
(the index in its output of the last emitted token; the first verify step is at t = 0)
drafting K accepts min(r_t, K), the same for every K, mode and trial. Offsets past the end of
a recorded request wrap around: t -> t mod length. The reference engine's per-slot copy is a row
of `trace_table`, read at the row's cache position (t = position mod length: the recorded
sequence from phase P mod length for a prompt of P tokens); `rate_of` gives the request's share
of offsets with r_t >= 1, so a consumer of per-slot rates sees its first-draft acceptance.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

import numpy as np

from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance_trace import Trace, read_trace


@dataclass(frozen=True)
class Greedy:
    @property
    def lossless(self) -> bool:
        return True

    def __str__(self) -> str:
        return "real"


@dataclass(frozen=True)
class Bernoulli:
    p: float
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise DynspecError(f"acceptance probability {self.p} is outside [0, 1]")

    @property
    def lossless(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"bernoulli:{self.p:g}"


def _num(x: float) -> str:
    """Shortest text that parses back to x: 0.9 -> '0.9', 1/3 -> '0.3333333333333333'."""
    return f"{x:g}" if float(f"{x:g}") == x else repr(float(x))


def _rate(p: float, what: str) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise DynspecError(f"{what} {p!r} is not a probability in [0, 1]")
    return float(p)


@dataclass(frozen=True)
class BernoulliMix:
    """Each request runs Bernoulli at one of `parts`' rates: parts ((rate, weight), ...), weights
    summing to 1; the part is picked by key_uniform(seed, key) against the cumulative weights."""
    parts: tuple[tuple[float, float], ...]
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.parts:
            raise DynspecError("bernoulli-mix needs at least one rate@weight part")
        for rate, weight in self.parts:
            _rate(rate, "bernoulli-mix rate")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 < weight <= 1.0:
                raise DynspecError(f"bernoulli-mix weight {weight!r} is not in (0, 1]")
        total = sum(w for _, w in self.parts)
        if abs(total - 1.0) > 1e-9:
            raise DynspecError(f"bernoulli-mix weights sum to {total:.12g}, not 1")

    @property
    def lossless(self) -> bool:
        return False

    def rate(self, key: int) -> float:
        u, edge = key_uniform(self.seed, key), 0.0
        for rate, weight in self.parts:
            edge += weight
            if u < edge:
                return float(rate)
        return float(self.parts[-1][0])       # u within rounding of 1 - sum of the weights

    def __str__(self) -> str:
        return "bernoulli-mix:" + ",".join(f"{_num(r)}@{_num(w)}" for r, w in self.parts)


@dataclass(frozen=True)
class Shift:
    """Requests with key < at run Bernoulli at `before`, the rest at `after`. at: an int is a
    request key; a float in (0, 1) is a fraction of a run's requests, which `resolve` turns
    into a key once the run's request count is known (rate_of refuses it before)."""
    before: float
    after: float
    at: int | float
    seed: int = 0

    def __post_init__(self) -> None:
        _rate(self.before, "shift rate before")
        _rate(self.after, "shift rate after")
        if isinstance(self.at, bool) or not isinstance(self.at, (int, float)):
            raise DynspecError(f"shift point {self.at!r} is not a request key or a fraction")
        if isinstance(self.at, int) and self.at < 0:
            raise DynspecError(f"shift point {self.at} is a negative request key")
        if isinstance(self.at, float) and not 0.0 < self.at < 1.0:
            raise DynspecError(f"shift point {self.at!r} is not a fraction in (0, 1) (or give an integer key)")

    @property
    def lossless(self) -> bool:
        return False

    @property
    def resolved(self) -> bool:
        return isinstance(self.at, int)

    def rate(self, key: int) -> float:
        if not self.resolved:
            raise DynspecError(f"acceptance model {self}: the shift point is a fraction of a run's requests;"
                               " resolve(model, n_requests) it first")
        return float(self.before if key < self.at else self.after)

    def __str__(self) -> str:
        return f"shift:{_num(self.before)},{_num(self.after)}@{self.at if self.resolved else _num(self.at)}"


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int) -> Trace:
    return read_trace(path)


def _load(path: str) -> Trace:
    try:
        st = os.stat(path)
    except OSError as e:
        raise DynspecError(f"{path}: cannot read the acceptance trace: {e.strerror or e}") from None
    return _read_cached(path, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class TraceReplay:
    """Recorded acceptance: path_or_trace a trace file (read and checked here) or a Trace."""
    path_or_trace: str | Trace
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.path_or_trace, os.PathLike):
            object.__setattr__(self, "path_or_trace", os.fspath(self.path_or_trace))
        if not isinstance(self.path_or_trace, (str, Trace)):
            raise DynspecError(f"trace replay needs a trace file or a Trace, not {type(self.path_or_trace).__name__}")
        if isinstance(self.path_or_trace, str):
            _load(self.path_or_trace)                       # a bad file fails here, naming it

    @property
    def trace(self) -> Trace:
        t = self.path_or_trace
        return t if isinstance(t, Trace) else _load(t)

    @property
    def lossless(self) -> bool:
        return False

    def index(self, key: int) -> int:
        """The recorded request key `key` replays: floor(key_uniform(seed, key) * n_requests)."""
        return min(int(key_uniform(self.seed, key) * len(self.trace.requests)), len(self.trace.requests) - 1)

    def rate(self, key: int) -> float:
        return float(self.trace.rates[self.index(key)])

    def __str__(self) -> str:
        t = self.path_or_trace
        return "trace:" + (t if isinstance(t, str) else t.path or "<in-memory>")


def accept_lengths(model: TraceReplay, key: int, offset, k: int):
    """Accepted drafts of request `key`'s row at output offset(s) `offset` drafting k: min(r, k),
    offsets wrapping at the recorded length. Recorded r = [3, 0, 2]: offset 4 -> r_1 = 0;
    accept_lengths(m, key, [0, 2], 2) -> array([2, 2]). An int offset gives an int."""
    r = np.asarray(model.trace.requests[model.index(key)], dtype=np.int64)
    out = np.minimum(r[np.asarray(offset) % r.size], k)
    return int(out) if out.ndim == 0 else out


def accept_bits(model: TraceReplay, key: int, offset: int, k: int) -> np.ndarray:
    """[k] bool: draft i (1-based i+1) of the row at `offset` is accepted iff i < r_offset; the
    per-position form of accept_lengths. r_offset = 2, k = 4 -> [True, True, False, False]."""
    return np.arange(k) < accept_lengths(model, key, offset, k)


def trace_table(model: TraceReplay, keys) -> tuple[np.ndarray, np.ndarray]:
    """(table [n_keys, L] int8, lengths [n_keys] int64): row j is the recorded r sequence of
    keys[j], zero-padded to L, the longest of them. A device reads r of row j at offset t as
    table[j, t % lengths[j]] (the reference engine: t its cache position); draft i (0-based) is
    accepted iff i < r."""
    idx = np.array([model.index(k) for k in keys], dtype=np.int64)
    t = model.trace
    lengths = t.lengths[idx]
    L = int(lengths.max()) if idx.size else 0
    return t.table[idx, :L].copy(), lengths.copy()


AcceptanceModel = Greedy | Bernoulli | BernoulliMix | Shift | TraceReplay


def rate_of(model: AcceptanceModel, key: int) -> float | None:
    """The Bernoulli rate of the request with this key; None for Greedy (real acceptance); for
    TraceReplay the replayed request's share of offsets whose first draft is accepted."""
    if isinstance(model, Greedy):
        return None
    if isinstance(model, Bernoulli):
        return float(model.p)
    return model.rate(key)


def resolve(model: AcceptanceModel, n_requests: int, first_key: int = 0) -> AcceptanceModel:
    """A fraction-form Shift at a run of n_requests whose keys are first_key, first_key + 1, ...:
    Shift(0.8, 0.2, 0.5) with n_requests=40, first_key=2 -> Shift(0.8, 0.2, 22). Else `model`."""
    if not isinstance(model, Shift) or model.resolved:
        return model
    if n_requests < 1:
        raise DynspecError(f"acceptance model {model}: a run of {n_requests} requests has no shift point")
    return Shift(model.before, model.after, first_key + round(model.at * n_requests), model.seed)


_NUM = r"([0-9]*\.?[0-9]+)"


def parse_acceptance(text: str, seed: int = 0) -> AcceptanceModel:
    """'real' -> Greedy(); 'bernoulli:0.7' -> Bernoulli(0.7);
    'bernoulli-mix:0.9@0.5,0.2@0.5' -> BernoulliMix(((0.9, 0.5), (0.2, 0.5)));
    'shift:0.8,0.2@0.5' -> Shift(0.8, 0.2, 0.5) (a fraction); 'shift:0.8,0.2@100' -> at key 100;
    'trace:benchmarks/traces/tiny_pair.json' -> TraceReplay of that file (the path as written)."""
    if text.strip()[:6].lower() == "trace:":
        path = text.strip()[6:].strip()
        if not path:
            raise DynspecError(f"acceptance model {text!r}: 'trace:' needs a trace file path")
        try:
            return TraceReplay(path, seed)
        except DynspecError as e:
            raise DynspecError(f"acceptance model {text!r}: {e}") from None
    t = text.strip().lower()
    if t in ("real", "greedy"):
        return Greedy()
    try:
        if m := re.fullmatch(r"bernoulli:" + _NUM, t):
            return Bernoulli(float(m.group(1)), seed)
        if t.startswith("bernoulli-mix:"):
            parts = [re.fullmatch(_NUM + "@" + _NUM, x.strip()) for x in t[len("bernoulli-mix:"):].split(",")]
            if all(parts):
                return BernoulliMix(tuple((float(p.group(1)), float(p.group(2))) for p in parts), seed)
        if m := re.fullmatch(r"shift:" + _NUM + "," + _NUM + "@" + r"(?:([0-9]+)|([0-9]*\.[0-9]+))", t):
            at = int(m.group(3)) if m.group(3) is not None else float(m.group(4))
            return Shift(float(m.group(1)), float(m.group(2)), at, seed)
    except DynspecError as e:
        raise DynspecError(f"acceptance model {text!r}: {e}") from None
    raise DynspecError(f"acceptance model {text!r} is not 'real', 'bernoulli:P', 'bernoulli-mix:P1@W1,P2@W2,...'"
                       ", 'shift:BEFORE,AFTER@AT' or 'trace:PATH' (e.g. bernoulli:0.7,"
                       " bernoulli-mix:0.9@0.5,0.2@0.5, shift:0.8,0.2@0.5, trace:benchmarks/traces/tiny_pair.json)")


_M64 = (1 << 64) - 1


def key_uniform(seed: int, key: int) -> float:
    """u in [0, 1) for a request key (host-side, Python ints): a splitmix64 finaliser of (seed, key),
    independent of draft_uniforms' hash. Example: key_uniform(0, 7) is the same in every run."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(key) * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    x ^= x >> 31
    return (x >> 11) * (1.0 / (1 << 53))

_M31 = 0x7FFFFFFF


def draft_uniforms(seed, key, positions):
    """u in [0, 1) for drafted tokens: seed (int or 0-d int64 tensor), key [B] each row's request
    key, positions [B, K] the drafts' positions -> [B, K] float32 (torch, graph-safe: int64 ops
    only, every product below 2^62). A fixed integer hash, so u depends on nothing else.
    Example: draft_uniforms(0, tensor([7]), tensor([[12, 13]])) is the same in every run."""
    x = ((key[:, None] & _M31) * 0x2545F491 & _M31) + ((positions & _M31) * 0x6C8E9CF5 & _M31)
    x = (x + ((seed & _M31) * 0x1B873593 & _M31)) & _M31
    for c in (0x2C1B3C6D, 0x297A2D39):        # xorshift-multiply rounds: each a bijection mod 2^31
        x = (x ^ (x >> 15)) * c & _M31
    x = x ^ (x >> 16)
    return (x >> 7).float() * (1.0 / (1 << 24))   # 24 bits: exact in float32, at most 1 - 2^-24


def accepted_prefix(match):
    """[B, K] bool/0-1 tensor -> [B] length of the leading run of ones (torch, graph-safe)."""
    return match.long().cumprod(dim=1).sum(dim=1)
