"""Measured draft acceptance, read from what a run left behind, for `dynspec tune --acceptance-from`.

Three sources, told apart by their content:
- a sweep result JSON (benchmarks/sweep.py: {"env": ..., "rows": [...]}). Each row holds its
  median trial's `acceptance_rate` (accepted / drafted) and `k_by_batch` ([b, K, iterations]),
  so drafted = sum b x K x iterations and accepted = acceptance_rate x drafted; rows without
  drafting (baseline) are skipped. Per position only where rows that drafted at one K each cover
  K = 1..Kmax (static rows at K = 1, 2, 3, ...): with m_K the mean accepted per row-step at K,
  P(first i accepted) = m_i - m_(i-1), so a_1 = m_1 and a_i = (m_i - m_(i-1)) / (m_(i-1) - m_(i-2)),
  clamped to [0, 1]. Otherwise one rate a fitted to every row at once (`fit_rate`).
- a TensorRT-LLM iteration-stats JSONL: one IterationStats object per line as `LLM.get_stats()`
  hands them out (a dict, or on 1.2-era builds its JSON string). Its `specDecodingStats` holds
  numDraftTokens, numAcceptedTokens, numRequestsWithDraftTokens, acceptanceLength, iterLatencyMS
  and draftOverhead (NVIDIA/TensorRT-LLM, cpp/tensorrt_llm/executor/jsonSerialization.cpp, the
  SpecDecodingStats serialiser; the fields are documented in cpp/include/tensorrt_llm/executor/types.h):
  totals per iteration over the batch, not per position, so the result is always one fitted
  rate. K per drafting request = numDraftTokens / numRequestsWithDraftTokens. That is the K that
  ran for a static max_draft_len; under a draft_len_schedule 1.2.x pads each request's drafts to
  max_draft_len (docs/design.md, "Stats parser"), the ratio reads max_draft_len and the fitted
  rate comes out low: measure acceptance with a static K.
- a profile.json with `acceptance.per_position` (`dynspec profile --measure-acceptance`): the rates
  as measured, with no counts (steps = drafted = accepted = 0).

One rate a fitted to totals: the a with sum over row-steps of E[accepted | K] = accepted, where
E[accepted | K] = a + a^2 + ... + a^K (each draft accepted with probability a, in order, until the
first rejection). Example: 25 row-steps at K=2 accepting 24 drafts -> a + a^2 = 0.96 -> a = 0.6.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from dynspec.errors import DynspecError


@dataclass(frozen=True)
class MeasuredAcceptance:
    per_position: tuple[float, ...]   # conditional acceptance at positions 1..len
    source: str                       # what was read and how the rates were derived
    steps: int                        # row-steps (one request's verify) that drafted
    drafted: int
    accepted: int
    fitted: bool = False              # one rate fitted to totals: the same at every K, so valid beyond len

    @property
    def rate(self) -> float | None:
        """The one fitted rate, or None for per-position rates."""
        return self.per_position[0] if self.fitted else None


def expected_accepted(a: float, k: int) -> float:
    """a + a^2 + ... + a^k: E[accepted drafts] of one row-step at K=k. expected_accepted(0.5, 2) = 0.75."""
    return sum(a ** i for i in range(1, k + 1))


def fit_rate(steps_by_k: Mapping[int, int], accepted: int) -> float:
    """The a in [0, 1] with sum_K steps_K x expected_accepted(a, K) = accepted (bisection: the sum
    rises with a from 0 to sum_K steps_K x K). fit_rate({2: 25}, 24) = 0.6."""
    total = lambda a: sum(n * expected_accepted(a, k) for k, n in steps_by_k.items())
    lo, hi = 0.0, 1.0
    if accepted <= 0:
        return 0.0
    if accepted >= total(1.0):
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) < accepted else (lo, mid)
    return (lo + hi) / 2


def per_position_from_means(means: Mapping[int, float]) -> tuple[float, ...] | None:
    """Mean accepted per row-step at each K -> a_1..a_Kmax, or None unless K = 1..Kmax (Kmax >= 2)
    are all there. {1: 0.8, 2: 1.28} -> (0.8, 0.6): P(2 accepted) = 1.28 - 0.8 = 0.48 = 0.8 x 0.6."""
    kmax = max(means, default=0)
    if kmax < 2 or set(means) != set(range(1, kmax + 1)):
        return None
    prefix = [1.0] + [means[k] - means.get(k - 1, 0.0) for k in range(1, kmax + 1)]   # P(first i accepted)
    return tuple(min(1.0, max(0.0, prefix[i] / prefix[i - 1] if prefix[i - 1] > 0 else 0.0))
                 for i in range(1, kmax + 1))


def _count(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DynspecError(f"{where} = {value!r} is not a count >= 0")
    return value


def _fitted(steps_by_k: Mapping[int, int], drafted: int, accepted: int, source: str, where: str) -> MeasuredAcceptance:
    steps = sum(steps_by_k.values())
    if steps == 0:
        raise DynspecError(f"{where}: nothing was drafted, so there is no acceptance to measure")
    a = fit_rate(steps_by_k, accepted)
    return MeasuredAcceptance((a,) * max(steps_by_k), f"{source}; one rate fitted to the totals (a + ... + a^K)",
                              steps, drafted, accepted, fitted=True)


# ---- sweep result JSON --------------------------------------------------------------------
def _sweep_row(row, where: str) -> tuple[dict[int, int], int, int] | None:
    """One sweep row -> (row-steps per drafting K, drafted, accepted), or None when it drafted nothing."""
    if not isinstance(row, Mapping):
        raise DynspecError(f"{where} is {type(row).__name__}, not an object")
    kb = row.get("k_by_batch")
    if not isinstance(kb, list):
        raise DynspecError(f"{where}.k_by_batch is missing or not a list of [b, K, iterations]")
    steps: dict[int, int] = {}
    for j, e in enumerate(kb):
        if not isinstance(e, list) or len(e) != 3:
            raise DynspecError(f"{where}.k_by_batch[{j}] = {e!r} is not [b, K, iterations]")
        b, k, n = (_count(x, f"{where}.k_by_batch[{j}]") for x in e)
        if k:
            steps[k] = steps.get(k, 0) + b * n
    drafted = sum(k * n for k, n in steps.items())
    rate = row.get("acceptance_rate")
    if drafted == 0:
        return None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise DynspecError(f"{where}.acceptance_rate = {rate!r} is not a rate in [0, 1] (the row drafted {drafted})")
    return steps, drafted, round(rate * drafted)


def from_sweep(doc: Mapping, path: str) -> MeasuredAcceptance:
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise DynspecError(f"{path}: field 'rows' is not a list of sweep rows")
    steps: dict[int, int] = {}
    drafted = accepted = 0
    single: dict[int, list[int]] = {}          # K -> [row-steps, accepted] of rows that drafted at K only
    for i, row in enumerate(rows):
        got = _sweep_row(row, f"{path}: rows[{i}]")
        if got is None:
            continue
        s, d, a = got
        for k, n in s.items():
            steps[k] = steps.get(k, 0) + n
        drafted, accepted = drafted + d, accepted + a
        if len(s) == 1:
            (k, n), = s.items()
            acc = single.setdefault(k, [0, 0])
            acc[0], acc[1] = acc[0] + n, acc[1] + a
    env = doc.get("env") if isinstance(doc.get("env"), Mapping) else {}
    source = f"sweep {path} (acceptance model {env.get('acceptance_model', '?')})"
    pp = per_position_from_means({k: a / n for k, (n, a) in single.items() if n})
    if pp is None:
        return _fitted(steps, drafted, accepted, source, path)
    return MeasuredAcceptance(pp, f"{source}; per position from single-K rows at K = 1..{len(pp)}",
                              sum(steps.values()), drafted, accepted)


# ---- TensorRT-LLM iteration-stats JSONL ----------------------------------------------------
def _trtllm_line(text: str, where: str) -> tuple[int, int, int] | None:
    """One line -> (drafting requests, K, accepted), or None for an iteration that drafted nothing."""
    try:
        entry = json.loads(text)
        if isinstance(entry, str):                     # get_stats() entries as JSON strings
            entry = json.loads(entry)
    except ValueError as e:
        raise DynspecError(f"{where} is not JSON: {e}") from None
    if not isinstance(entry, Mapping):
        raise DynspecError(f"{where} is {type(entry).__name__}, not an iteration-stats object")
    spec = entry.get("specDecodingStats")
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise DynspecError(f"{where}: specDecodingStats is {type(spec).__name__}, not an object")
    got = {f: _count(spec.get(f), f"{where}: specDecodingStats.{f}")
           for f in ("numDraftTokens", "numAcceptedTokens", "numRequestsWithDraftTokens")}
    d, a, n = got["numDraftTokens"], got["numAcceptedTokens"], got["numRequestsWithDraftTokens"]
    if (d > 0) != (n > 0) or a > d or (n and d % n):
        raise DynspecError(f"{where}: specDecodingStats numDraftTokens={d}, numAcceptedTokens={a} over"
                           f" numRequestsWithDraftTokens={n} is not the same K drafts per drafting request")
    return (n, d // n, a) if n else None


def from_trtllm_jsonl(lines: Iterable[str], path: str) -> MeasuredAcceptance:
    steps: dict[int, int] = {}
    drafted = accepted = 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        got = _trtllm_line(line, f"{path}: line {i}")
        if got is not None:
            n, k, a = got
            steps[k] = steps.get(k, 0) + n
            drafted, accepted = drafted + n * k, accepted + a
    return _fitted(steps, drafted, accepted, f"TensorRT-LLM iteration stats {path} (specDecodingStats)", path)


# ---- profile.json --------------------------------------------------------------------------
def from_profile(doc: Mapping, path: str) -> MeasuredAcceptance:
    """The profile's measured rates, read by the one profile reader (runtime/policy/cost_model.py)."""
    from dynspec.runtime.policy.cost_model import Profile

    pp = Profile.from_json(doc, where=path).per_position
    if not pp:
        raise DynspecError(f"{path}: field 'acceptance.per_position' is missing or empty;"
                           " measure it with `dynspec profile --measure-acceptance`")
    return MeasuredAcceptance(pp, f"profile {path} (acceptance.per_position)", 0, 0, 0)


def read_measured_acceptance(path: str | Path) -> MeasuredAcceptance:
    """A sweep result JSON, a TensorRT-LLM iteration-stats JSONL (*.jsonl) or a profile.json."""
    from dynspec.artifacts import read_json

    p = Path(path)
    if p.suffix == ".jsonl":
        if not p.is_file():
            raise DynspecError(f"acceptance source {p} does not exist")
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise DynspecError(f"acceptance source {p} is not UTF-8 text (byte {e.start})") from None
        return from_trtllm_jsonl(text.splitlines(), str(p))
    doc = read_json(p, "acceptance source")
    if "rows" in doc:
        return from_sweep(doc, str(p))
    if "acceptance" in doc or "iteration_ms" in doc or "tables" in doc:
        return from_profile(doc, str(p))
    raise DynspecError(f"acceptance source {p} is neither a sweep result (field 'rows') nor a profile"
                       " (field 'acceptance'); TensorRT-LLM iteration stats must be a .jsonl file")
