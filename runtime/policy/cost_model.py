"""profile.json, the one reader of it, and the cost model: iteration ms at (batch size b, K, context).

profile.json (`dynspec profile --context-lens 512,2048` writes format 2):
    {"format": "dynspec-profile/2", "device": "cuda:0 (NVIDIA H200)",
     "context_lens": [512, 2048],
     "tables": [{"context_len": 512,
                 "iteration_ms": {"1": {"0": 4.4, "1": 4.9}, "8": {...}},   # b -> K -> median ms
                 "decode_ms": {"1": 4.2, "8": ...},        # K = 0 without the keep-warm draft extend
                 "chunk_ms": {"128": {"1": {"0": 6.0, "1": 6.6}, "8": {...}}}},   # optional (--chunk-lens):
                {"context_len": 2048, ...}],             # chunk -> b -> K -> ms with a prompt chunk riding
     "acceptance": {"per_position": [0.8, 0.7]},           # optional: --measure-acceptance
     "keep_warm": true, "repeats": 20, "command": "dynspec profile ...", ...}   # the rest: meta
Format 1 ("dynspec-profile/1", or no "format"), still read, is one table at the top level: {"device": ...,
"context_len": 1024, "iteration_ms": ..., "decode_ms": ...} (no context_len: the cost model refuses it).

CostModel.lookup(b, K, context) -> CostLookup(ms, extrapolated, note):
  - in b: linear between profiled batch sizes, in each of the two tables that bracket the context;
    then linear in context between those two tables (bilinear on the profiled grid).
  - below the smallest profiled b (or context): that point's time (clamped). Fewer rows and fewer
    keys cost less, so this over-estimates slightly, and for every K alike.
  - above the largest profiled b (or context): the last segment extended (its slope, at least 0);
    with a single profiled point, that point's time. Step time grows close to linearly in rows once
    compute-bound and in KV length (attention), so clamping there would under-price the larger K.
  - anything outside the profiled range says so: extrapolated=True and a note naming what was done.
  - a K that was not profiled raises DynspecError (K's graphs and costs are never guessed).
CostModel.row(b, context) -> (ms for every K, plain-decode ms or None, extrapolated): the same
interpolation for all K at once, plus `decode_ms` (K=0 without the keep-warm draft extend) when
every table has it for every batch size. CostModel.chunk prices a prompt chunk (chunk_cost.py).
Worked example, contexts 512 and 1536, b 1 and 5, K = 2:
    ms(K=2)      b=1    b=5
    ctx  512    12.0   16.0
    ctx 1536    14.0   22.0
    lookup(3, 2, 1024) -> 16.0            b=3 is halfway: 14.0 at 512, 18.0 at 1536; 1024 halfway
    lookup(3, 2, 2560) -> 22.0, extrapolated   context: 18.0 + (18.0 - 14.0) / 1024 * 1024
    lookup(9, 2, 512)  -> 20.0, extrapolated   b: 16.0 + (16.0 - 12.0) / 4 * 4
    lookup(3, 2, 256)  -> 14.0, extrapolated   context clamped to 512       Pure: no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from dynspec.errors import DynspecError
from dynspec.runtime.policy.catch_up_price import CatchUpPrice, catch_up_price
from dynspec.runtime.policy.chunk_cost import ChunkCost
from dynspec.runtime.policy.grid import lerp as _lerp, segment as _segment

PROFILE_FORMAT = "dynspec-profile/2"
PROFILE_FORMAT_ONE = "dynspec-profile/1"      # one table at the top level; still read
_TABLE_KEYS = ("context_len", "iteration_ms", "decode_ms")


@dataclass(frozen=True)
class ContextTable:
    """One context's measurements. context_len None only in a format-1 file that did not record it."""
    context_len: int | None
    iteration_ms: Mapping[int, Mapping[int, float]]          # b -> K -> ms
    decode_ms: Mapping[int, float] | None = None             # b -> plain target step without keep-warm
    chunk_ms: Mapping[int, Mapping[int, Mapping[int, float]]] | None = None   # chunk tokens -> b -> K -> ms

    def falling(self, factor: float = 1.25) -> tuple[tuple[int, int, float, int, float], ...]:
        """(b, K, ms, b2, ms2) wherever b's step takes more than `factor` x the step of a larger
        b2 at the same K: step times do not fall as rows are added, so such a row was timed while
        something else ran (another process on the GPU). {16: {0: 14.6}, 32: {0: 6.9}} ->
        ((16, 0, 14.6, 32, 6.9),)."""
        out = []
        bs = sorted(self.iteration_ms)
        for i, b in enumerate(bs):
            for k, ms in sorted(self.iteration_ms[b].items()):
                b2 = min(bs[i + 1:], key=lambda n: self.iteration_ms[n].get(k, math.inf), default=None)
                if b2 is not None and ms > factor * self.iteration_ms[b2].get(k, math.inf):
                    out.append((b, k, ms, b2, self.iteration_ms[b2][k]))
        return tuple(out)

    def to_json(self) -> dict:
        d = {"context_len": self.context_len,
             "iteration_ms": {str(b): {str(k): ms for k, ms in sorted(row.items())}
                              for b, row in sorted(self.iteration_ms.items())}}
        if self.decode_ms is not None:
            d["decode_ms"] = {str(b): ms for b, ms in sorted(self.decode_ms.items())}
        if self.chunk_ms is not None:
            d["chunk_ms"] = {str(c): {str(b): {str(k): ms for k, ms in sorted(row.items())} for b, row in sorted(t.items())}
                             for c, t in sorted(self.chunk_ms.items())}
        return d


@dataclass(frozen=True)
class Profile:
    """A profile.json: its per-context tables (ascending context_len), acceptance and meta."""
    device: str
    tables: tuple[ContextTable, ...]
    per_position: tuple[float, ...] | None = None           # conditional acceptance per draft position
    meta: Mapping[str, object] = field(default_factory=dict)

    @property
    def context_lens(self) -> tuple[int | None, ...]:
        return tuple(t.context_len for t in self.tables)

    def table(self, context: int | None = None, where: str = "profile") -> ContextTable:
        """The table timed at `context`; None: the only one (an error listing them if several)."""
        if context is None:
            if len(self.tables) == 1:
                return self.tables[0]
            raise DynspecError(f"{where} has tables at contexts {list(self.context_lens)}; choose one (--context N)")
        for t in self.tables:
            if t.context_len == context:
                return t
        raise DynspecError(f"{where} has no table at context {context}; it has {list(self.context_lens)}")

    def to_json(self) -> dict:
        d = {"format": PROFILE_FORMAT, "device": self.device, "context_lens": list(self.context_lens),
             "tables": [t.to_json() for t in self.tables]}
        if self.per_position is not None:
            d["acceptance"] = {"per_position": list(self.per_position)}
        d.update(self.meta)
        return d

    @classmethod
    def from_json(cls, d: Mapping, where: str = "profile") -> "Profile":
        fmt = d.get("format", PROFILE_FORMAT_ONE)
        if fmt == PROFILE_FORMAT_ONE:
            tables = (_table(d, where, where),)
            known = {"format", "device", "acceptance", *_TABLE_KEYS}
        elif fmt == PROFILE_FORMAT:
            tables = _tables(d, where)
            known = {"format", "device", "acceptance", "context_lens", "tables"}
        else:
            raise DynspecError(f"{where}: field 'format' is {fmt!r}; this reader knows "
                               f"{PROFILE_FORMAT!r} and {PROFILE_FORMAT_ONE!r}")
        return cls(str(d.get("device", "unknown")), tables, _acceptance(d.get("acceptance"), where),
                   {k: v for k, v in d.items() if k not in known})

    @classmethod
    def load(cls, path) -> "Profile":
        from dynspec.artifacts import read_json

        return cls.from_json(read_json(path, "profile"), where=str(path))


def _number(ms, what: str) -> float:
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
        raise DynspecError(f"{what} = {ms!r} is not a positive number of ms")
    return float(ms)


def _int_key(s, what: str) -> int:
    try:
        return int(s)
    except (TypeError, ValueError):
        raise DynspecError(f"{what} {s!r} is not an integer") from None


def _table(d: Mapping, where: str, at: str) -> ContextTable:
    """One table from its fields; `at` prefixes every field named in an error ('p.json: tables[1]')."""
    ctx = d.get("context_len")
    if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1):
        raise DynspecError(f"{at}: field 'context_len' = {ctx!r} is not an integer >= 1")
    if "iteration_ms" not in d:
        raise DynspecError(f"{at}: missing field 'iteration_ms'")
    it = _grid_of(d["iteration_ms"], f"{at}: iteration_ms")
    chunk = d.get("chunk_ms")
    if chunk is not None:
        if not isinstance(chunk, Mapping) or not chunk:
            raise DynspecError(f"{at}: field 'chunk_ms' must be a non-empty object {{\"<chunk>\": {{\"<b>\": ...}}}}")
        chunk = {_int_key(cs, f"{at}: chunk_ms key"): _grid_of(t, f"{at}: chunk_ms[{cs!r}]") for cs, t in chunk.items()}
        if min(chunk) < 1:
            raise DynspecError(f"{at}: chunk_ms key {min(chunk)} is not a chunk of >= 1 tokens")
    dec, decode = d.get("decode_ms"), None
    if dec is not None:
        if not isinstance(dec, Mapping):
            raise DynspecError(f"{at}: field 'decode_ms' must be an object {{\"<b>\": ms}}")
        decode = {_int_key(bs, f"{at}: decode_ms key"): _number(ms, f"{at}: decode_ms[{bs!r}]")
                  for bs, ms in dec.items()}
    return ContextTable(ctx, it, decode, chunk)


def _grid_of(table, at: str) -> dict[int, dict[int, float]]:
    """{"<b>": {"<K>": ms}} -> {b: {K: ms}}; `at` names the field in an error."""
    if not isinstance(table, Mapping) or not table:
        raise DynspecError(f"{at} must be a non-empty object {{\"<b>\": {{\"<K>\": ms}}}}")
    it: dict[int, dict[int, float]] = {}
    for bs, row in table.items():
        b = _int_key(bs, f"{at} key")
        if b < 1:
            raise DynspecError(f"{at} key {bs!r} is not a batch size >= 1")
        if not isinstance(row, Mapping) or not row:
            raise DynspecError(f"{at}[{bs!r}] must be a non-empty object {{\"<K>\": ms}}")
        it[b] = {}
        for ks, ms in row.items():
            k = _int_key(ks, f"{at}[{bs!r}] key")
            if k < 0:
                raise DynspecError(f"{at}[{bs!r}] key {ks!r} is a negative K")
            it[b][k] = _number(ms, f"{at}[{bs!r}][{ks!r}]")
    return it


def _tables(d: Mapping, where: str) -> tuple[ContextTable, ...]:
    raw = d.get("tables")
    if not isinstance(raw, list) or not raw:
        raise DynspecError(f"{where}: field 'tables' must be a non-empty list of per-context tables")
    out = []
    for i, t in enumerate(raw):
        at = f"{where}: tables[{i}]"
        if not isinstance(t, Mapping):
            raise DynspecError(f"{at} must be an object {{\"context_len\": N, \"iteration_ms\": ...}}")
        if t.get("context_len") is None:
            raise DynspecError(f"{at}: missing field 'context_len'")
        out.append(_table(t, where, at))
    ctxs = [t.context_len for t in out]
    if any(b <= a for a, b in zip(ctxs, ctxs[1:])):
        raise DynspecError(f"{where}: tables' context_len {ctxs} must be strictly ascending")
    listed = d.get("context_lens", ctxs)
    if listed != ctxs:
        raise DynspecError(f"{where}: field 'context_lens' {listed!r} does not match the tables' {ctxs}")
    return tuple(out)


def _acceptance(acc, where: str) -> tuple[float, ...] | None:
    if acc is None:
        return None
    if not isinstance(acc, Mapping) or "per_position" not in acc:
        raise DynspecError(f"{where}: field 'acceptance' must be {{\"per_position\": [a1, a2, ...]}}")
    raw = acc["per_position"]
    if not isinstance(raw, list) or not raw:
        raise DynspecError(f"{where}: field 'acceptance.per_position' must be a non-empty list")
    for i, a in enumerate(raw):
        if not isinstance(a, (int, float)) or isinstance(a, bool) or not 0.0 <= a <= 1.0:
            raise DynspecError(f"{where}: acceptance.per_position[{i}] = {a!r} is not a rate in [0, 1]")
    return tuple(float(a) for a in raw)


# ---- the cost model ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CostLookup:
    ms: float
    extrapolated: bool
    note: str = ""            # what was done outside the profiled range; "" inside it


@dataclass(frozen=True)
class CostModel:
    """Iteration ms on a full (context x batch size x K) grid; see the module docstring."""
    device: str
    context_lens: tuple[int, ...]                            # ascending
    batch_sizes: tuple[int, ...]                             # ascending
    draft_lens: tuple[int, ...]                              # ascending, 0 included
    per_position: tuple[float, ...] | None
    ms: tuple[tuple[tuple[float, ...], ...], ...]            # [context][batch size][K index]
    decode: tuple[tuple[float, ...], ...] | None = None      # [context][batch size] K=0 without keep-warm
    chunk: "ChunkCost | None" = None                         # the chunk axis (runtime/policy/chunk_cost.py)
    catch_up: "CatchUpPrice | None" = None                   # lazy sync's catch-up (runtime/policy/catch_up_price.py)
    # [context][batch size][K index..., plain decode]: what row() interpolates (derived)
    _grid: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grid = self.ms if self.decode is None else tuple(
            tuple(r + (d,) for r, d in zip(table, dec)) for table, dec in zip(self.ms, self.decode))
        object.__setattr__(self, "_grid", grid)

    def lookup(self, b: int, k: int, context: float) -> CostLookup:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise DynspecError(f"cost model lookup: batch size {b!r} is not an integer >= 1")
        if k not in self.draft_lens:
            raise DynspecError(f"cost model lookup: K={k!r} was not profiled (profiled K: {list(self.draft_lens)})")
        if isinstance(context, bool) or not isinstance(context, (int, float)) or not math.isfinite(context) \
                or context < 0:
            raise DynspecError(f"cost model lookup: context {context!r} is not a finite number >= 0")
        j = self.draft_lens.index(k)
        per_ctx = [[row[j] for row in table] for table in self.ms]          # [context][batch size]
        (ci, ct), cnote = _segment(self.context_lens, float(context), "context")
        (bi, bt), bnote = _segment(self.batch_sizes, float(b), "b")

        def at(c: int) -> float:
            ys = per_ctx[c]
            return _lerp(ys[bi], ys[bi + 1], bt) if bt else ys[bi]

        ms = _lerp(at(ci), at(ci + 1), ct) if ct else at(ci)
        notes = [n for n in (bnote, cnote) if n]
        return CostLookup(ms, bool(notes), "; ".join(notes))

    def row(self, b: int, context: float) -> tuple[tuple[float, ...], float | None, bool]:
        """(ms for every profiled K, in draft_lens order; plain-decode ms or None; extrapolated?) at
        (b, context): the interpolation of `lookup`, done once for all K (the policy's call).
        row(b, ctx)[0][draft_lens.index(k)] == lookup(b, k, ctx).ms."""
        (ci, ct), cnote = _segment(self.context_lens, float(context), "context")
        (bi, bt), bnote = _segment(self.batch_sizes, float(b), "b")

        def at(ys) -> tuple[float, ...]:           # ys [context][batch size][n] -> [n] at (b, context)
            def in_b(c: int) -> tuple[float, ...]:
                return tuple(_lerp(y0, y1, bt) for y0, y1 in zip(ys[c][bi], ys[c][bi + 1])) if bt else ys[c][bi]
            return tuple(_lerp(y0, y1, ct) for y0, y1 in zip(in_b(ci), in_b(ci + 1))) if ct else in_b(ci)

        both = at(self._grid)
        n = len(self.draft_lens)
        return both[:n], (both[n] if self.decode is not None else None), bool(bnote or cnote)

    @classmethod
    def from_profile(cls, profile: Profile, where: str = "profile") -> "CostModel":
        """The grid from a Profile; every table must hold the same batch sizes and K's (0 included)."""
        first = profile.tables[0]
        bs = tuple(sorted(first.iteration_ms))
        ks = tuple(sorted(first.iteration_ms[bs[0]]))
        if 0 not in ks:
            raise DynspecError(f"{where}: no K=0 (plain decode) times; the cost model needs them")
        for i, t in enumerate(profile.tables):
            at = f"{where}: tables[{i}]" if len(profile.tables) > 1 else where
            if t.context_len is None:
                raise DynspecError(f"{at}: missing field 'context_len'; the cost model needs each table's context")
            if tuple(sorted(t.iteration_ms)) != bs:
                raise DynspecError(f"{at}: iteration_ms has batch sizes {sorted(t.iteration_ms)}, "
                                   f"the first table {list(bs)}; every table needs the same grid")
            for b, row in t.iteration_ms.items():
                if tuple(sorted(row)) != ks:
                    raise DynspecError(f"{at}: iteration_ms[{str(b)!r}] has K {sorted(row)}, "
                                       f"iteration_ms[{str(bs[0])!r}] of the first table {list(ks)}")
        ms = tuple(tuple(tuple(t.iteration_ms[b][k] for k in ks) for b in bs) for t in profile.tables)
        full = all(t.decode_ms is not None and all(b in t.decode_ms for b in bs) for t in profile.tables)
        decode = tuple(tuple(t.decode_ms[b] for b in bs) for t in profile.tables) if full else None
        chunk = ChunkCost.from_tables(profile.tables, bs, ks, where)
        return cls(profile.device, tuple(profile.context_lens), bs, ks, profile.per_position, ms, decode, chunk,
                   catch_up_price(profile, where))

    @classmethod
    def load(cls, path, max_draft_len: int | None = None, bound: str = "") -> "CostModel":
        """The cost model of `path`; with max_draft_len, every profiled K must be at most it (the
        engine's, which `bound` names): K 0..40 on a 4:4 engine -> DynspecError "cost.json:
        profiles K=40, above the engine's max_draft_len 4 (engine.json schedule 4:4) ..."."""
        cost = cls.from_profile(Profile.load(path), where=str(path))
        over = [k for k in cost.draft_lens if max_draft_len is not None and k > max_draft_len]
        if over:
            raise DynspecError(f"{path}: profiles K={over[-1]}, above the engine's max_draft_len {max_draft_len}"
                               f"{f' ({bound})' if bound else ''}; profile K in 0..{max_draft_len} "
                               f"(dynspec profile --draft-lens) or use an engine built for K={over[-1]}")
        return cost
