"""What a benchmark run measured: pure functions from raw timings to one row of numbers.

A run (one mode at one load point) on one replica yields a `RunRecord`: per-request
timings plus the executor's per-iteration stats. Replicas of an mpirun sweep each yield one;
`summarize` merges them (they started together after a barrier):

    output_tok_per_s = all output tokens / longest replica wall time
    latency          = finish - submit                 (p50, p99 over all requests)
    ttft             = first token - submit            (mean, p50, p99)
    tpot             = (finish - first token) / (output tokens - 1), per request (mean)
    mean_k           = mean over iterations of that iteration's K
    mean_accepted_len= tokens a row gains per target step = (sum accepted + sum b) / sum b
                       (1.0 without speculation; 1 + K with every draft accepted)
    decode_rows / prefill_tokens: per iteration, the rows that decoded and the prompt tokens
                       that rode along (inflight batching); mixed_iterations counts those with both;
                       mean_k / mean_batch_size / k_by_batch skip prompt-only iterations (b = 0)
    steady_tok_per_s   closed loop at C: tokens the decode rows emitted (b + accepted) / seconds,
                       over the iterations with at least STEADY_FILL x C decode rows, summed over
                       replicas: the server while full, without the ramp and the drain tail that a
                       finite closed loop of varied lengths ends with; steady_fraction: the share
                       of iterations counted
    sustained_tok_per_s closed loop: tokens emitted before the last request was submitted / the
                       time until then (`sustained`), summed over replicas
    engine_idle_fraction share of the wall time outside the engine's step (`engine_idle`)
    gpu_gap_fraction   the part of it between two steps, as the device saw it (`gpu_gaps`): the
                       rest lies before the first step and after the last; gpu_gap_mixed_share: the
                       share of those gaps that came before an iteration with prompt chunks
    gc_pause_fraction  share of the wall time in the cycle collector (`gc_pauses`): a pause
                       between steps the device may idle through (runtime/serving/gc_heap.py)

Worked example, two iterations (b=2, K=3, accepted 4) and (b=2, K=0):
    mean_k = 1.5;  acceptance_rate = 4 / 6;  mean_accepted_len = (4 + 4) / 4 = 2.0
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np

from dynspec.runtime.policy.draft_counts import acceptance, mean_k


@dataclass(frozen=True)
class RequestTiming:
    prompt_len: int
    output_len: int
    submit_s: float
    first_token_s: float | None
    finish_s: float
    # its drafting (RequestResult); None: the engine does not report it per request (TRT-LLM)
    accepted_drafts: int | None = None      # draft tokens the target accepted
    drafted: int | None = None              # draft tokens verified for it (sum of its K_i)
    decode_steps: int | None = None         # iterations it ran as a decode row
    key: int | None = None                  # its request key (the acceptance models' key), where known

    @property
    def mean_k(self) -> float | None:
        """runtime/policy/draft_counts.mean_k; None when the engine does not report it."""
        return None if self.drafted is None or self.decode_steps is None else mean_k(self.drafted, self.decode_steps)

    @property
    def acceptance(self) -> float | None:
        """runtime/policy/draft_counts.acceptance; None when not reported or it never drafted."""
        return None if self.accepted_drafts is None else acceptance(self.accepted_drafts, self.drafted)

    @property
    def latency_s(self) -> float:
        return self.finish_s - self.submit_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.submit_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_s is None or self.output_len < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_len - 1)

    @classmethod
    def of(cls, result) -> "RequestTiming":
        """From the executor's RequestResult."""
        return cls(result.prompt_len, len(result.output_ids), result.submit_s, result.first_token_s, result.finish_s,
                   result.accepted_drafts, result.drafted, result.decode_steps, result.request_id)


# a sweep row's per-request table (request_table): one list of these per request
REQUEST_FIELDS = ("output_len", "accepted_drafts", "drafted", "decode_steps", "mean_k", "acceptance", "key")


def request_row(r: RequestTiming) -> list:
    """REQUEST_FIELDS of one request, the ratios to 4 digits:
    32 tokens, 5 of 12 drafts accepted over 3 decode iterations, key 7 -> [32, 5, 12, 3, 4.0, 0.4167, 7]."""
    ratio = lambda x: None if x is None else round(x, 4)   # noqa: E731
    return [r.output_len, r.accepted_drafts, r.drafted, r.decode_steps, ratio(r.mean_k), ratio(r.acceptance), r.key]


def request_table(records: Iterable[RunRecord]) -> dict:
    """The replicas' requests of one run as {"fields": REQUEST_FIELDS, "replicas": [[request_row, ...], ...]},
    each replica's in the order its requests finished."""
    return {"fields": list(REQUEST_FIELDS), "replicas": [[request_row(r) for r in rec.requests] for rec in records]}


@dataclass(frozen=True)
class StepRecord:
    batch_size: int
    k: int
    drafted: int
    accepted: int
    seconds: float
    host_seconds: float
    decode_rows: int | None = 0     # rows that decoded this iteration (K+1 tokens each); None: not reported
    prefill_tokens: int | None = 0  # prompt tokens that rode in the same forward; None: not reported
    emitted: int | None = None      # tokens the step appended to requests; None: not reported
    end_s: float | None = None      # the run's clock at the step's end; None: not reported
    gpu_idle_s: float | None = None  # device idle before it: the previous step's end to its start
    gc_s: float = 0.0               # collector pauses since the previous step (IterationStats.gc_seconds)
    catch_up_tokens: int = 0        # draft entries its lazy catch-up wrote (IterationStats.catch_up_tokens)

    @classmethod
    def of(cls, st) -> "StepRecord":
        """From the executor's IterationStats."""
        return cls(st.batch_size, st.k, st.drafted, st.accepted, st.seconds, st.host_seconds, st.decode_rows,
                   st.prefill_tokens, getattr(st, "emitted", None), getattr(st, "end_s", None),
                   getattr(st, "gpu_idle_s", None), getattr(st, "gc_seconds", 0.0), getattr(st, "catch_up_tokens", 0))


@dataclass(frozen=True)
class RunRecord:
    """One replica's run: raw, small, picklable (it crosses mpi4py's gather)."""

    requests: tuple[RequestTiming, ...]
    steps: tuple[StepRecord, ...]
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)


@dataclass(frozen=True)
class RunMetrics:
    replicas: int
    num_requests: int
    output_tokens: int
    duration_s: float
    output_tok_per_s: float
    requests_per_s: float
    p50_latency_s: float
    p99_latency_s: float
    mean_latency_s: float
    ttft_s: float | None            # mean
    p50_ttft_s: float | None
    p99_ttft_s: float | None
    tpot_s: float | None            # mean over requests with >= 2 output tokens
    p50_tpot_s: float | None
    iterations: int
    mean_batch_size: float
    mean_k: float
    acceptance_rate: float | None   # accepted / drafted; None when nothing was drafted
    mean_accepted_len: float
    mean_step_ms: float
    host_overhead_fraction: float   # (policy + planning) / engine step time
    mean_decode_rows: float | None
    prefill_tokens: int | None      # prompt tokens carried by the iterations, summed (None: not reported)
    mixed_iterations: int | None    # iterations with decode_rows > 0 and prefill_tokens > 0
    per_replica_tok_per_s: tuple[float, ...]
    k_by_batch: tuple[tuple[int, int, int], ...]   # (batch size, K, iterations), sorted
    steady_tok_per_s: float | None = None   # None: open loop, or no iteration was that full
    steady_fraction: float | None = None
    sustained_tok_per_s: float | None = None   # None: open loop, one wave, or steps without end_s / emitted
    engine_idle_fraction: float | None = None  # see engine_idle; None: no steps or no wall time
    gpu_gap_fraction: float | None = None      # see gpu_gaps; None: the engine reports no device idle
    gpu_gap_mixed_share: float | None = None
    gc_pause_fraction: float | None = None     # see gc_pauses

    def to_json(self) -> dict:
        d = asdict(self)
        d["per_replica_tok_per_s"] = list(self.per_replica_tok_per_s)
        d["k_by_batch"] = [list(t) for t in self.k_by_batch]
        return d


def percentile(xs: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no data."""
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else None


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def step_summary(steps: Sequence[StepRecord]) -> dict:
    """mean_k, acceptance_rate, mean_accepted_len, ... over iterations (pure).

    mean_batch_size, mean_k and k_by_batch count decode iterations only (b > 0): an iteration
    that only carries prompt chunks has no K to choose. Iterations (b, K, prefill):
    (0, 0, 64), (2, 3, 0), (2, 0, 8) -> mean_k 1.5, mean_batch_size 2, mixed_iterations 1."""
    decode = [s for s in steps if s.batch_size > 0]
    rows = sum(s.batch_size for s in steps)
    drafted = sum(s.drafted for s in steps)
    accepted = sum(s.accepted for s in steps)
    secs = sum(s.seconds for s in steps)
    return {
        "iterations": len(steps),
        "mean_batch_size": rows / len(decode) if decode else 0.0,
        "mean_k": sum(s.k for s in decode) / len(decode) if decode else 0.0,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_len": (accepted + rows) / rows if rows else 1.0,
        "mean_step_ms": 1e3 * secs / len(steps) if steps else 0.0,
        "host_overhead_fraction": sum(s.host_seconds for s in steps) / secs if secs > 0 else 0.0,
        **_iteration_mix(steps),
        "k_by_batch": tuple(sorted((b, k, n) for (b, k), n in Counter((s.batch_size, s.k) for s in decode).items())),
    }


def _iteration_mix(steps) -> dict:
    """Decode rows / prompt tokens per iteration; None where an engine did not report them
    (TRT-LLM iteration stats without inflightBatchingStats) rather than a made-up 0."""
    if any(s.decode_rows is None or s.prefill_tokens is None for s in steps):
        return {"mean_decode_rows": None, "prefill_tokens": None, "mixed_iterations": None}
    return {
        "mean_decode_rows": sum(s.decode_rows for s in steps) / len(steps) if steps else 0.0,
        "prefill_tokens": sum(s.prefill_tokens for s in steps),
        "mixed_iterations": sum(1 for s in steps if s.decode_rows > 0 and s.prefill_tokens > 0),
    }


STEADY_FILL = 0.9


def steady_state(steps: Sequence[StepRecord], concurrency: int, fill: float = STEADY_FILL) -> tuple[float, float] | None:
    """(tok/s, share of iterations) over one replica's iterations with b >= ceil(fill x C) decode
    rows; None when none was that full. C=4, fill 0.9 -> b >= 4: steps (b=4, acc 2, 10 ms),
    (b=2, acc 0, 5 ms) -> ((4 + 2) / 0.010, 0.5)."""
    need = math.ceil(round(fill * concurrency, 9))           # round first: 0.9 x 10 is 9.000000000000002
    full = [s for s in steps if s.batch_size >= max(1, need)]
    secs = sum(s.seconds for s in full)
    if not full or secs <= 0:
        return None
    return sum(s.batch_size + s.accepted for s in full) / secs, len(full) / len(steps)


def sustained(rec: RunRecord) -> float | None:
    """Closed loop: tokens emitted by the steps that ended before the last request was submitted,
    over the time from the run's start to that submission: the server while every client still
    had a request to send, without the drain a finite run of varied lengths ends with (about one
    longest output). Lockstep waves of fixed lengths give their overall rate (waves 1..N-1).
    Example: start 0, last submit at 2.0 s, steps ending at 1.0 (emitting 64), 2.0 (64), 3.0 (64)
    -> 128 / 2.0 = 64 tok/s. None when no step ended before the last submission (one wave: every
    request went in at the start) or a step lacks end_s / emitted."""
    if not rec.requests or any(s.end_s is None or s.emitted is None for s in rec.steps):
        return None
    last = max(r.submit_s for r in rec.requests)
    held = [s for s in rec.steps if s.end_s <= last]
    if not held or last <= rec.start_s:
        return None
    return sum(s.emitted for s in held) / (last - rec.start_s)


def engine_idle(records: Sequence[RunRecord]) -> float | None:
    """Share of the replicas' wall time spent outside the engine's step: the policy and planning,
    the executor's bookkeeping between iterations (appending tokens, retiring rows) and the load
    generator. The GPU waits through all of it: the loop is serial. Example: steps of 7.0 and
    8.0 ms in a 16.0-ms run -> 1 - 15 / 16 = 0.0625. None without steps or wall time."""
    wall = sum(rec.duration_s for rec in records)
    if wall <= 0 or not any(rec.steps for rec in records):
        return None
    return 1.0 - sum(s.seconds for rec in records for s in rec.steps) / wall


def gc_pauses(records: Sequence[RunRecord]) -> float | None:
    """Share of the wall time the process spent in cycle collections between the steps (the
    first step's share, which reaches back before the run, left out; runtime/serving/gc_heap.py). Example:
    a 16.0-ms run whose steps report 0, 0.4 and 0 ms -> 0.025. None without wall time or steps."""
    wall = sum(rec.duration_s for rec in records)
    later = [s for rec in records for s in rec.steps[1:]]
    if wall <= 0 or not later:
        return None
    return sum(s.gc_s for s in later) / wall


def gpu_gaps(records: Sequence[RunRecord]) -> tuple[float | None, float | None]:
    """(device idle between consecutive steps / wall time, the share of that idle which came before
    an iteration with prompt chunks), from the steps' gpu_idle_s; (None, None) when a step does not
    report it. Each run's first step is left out: its gap reaches back to the step before the run
    (a warm-up or the previous trial), outside the run's wall time. Example: a 16.0-ms run,
    steps with gaps None, 0.5 ms (decode) and 1.5 ms (a chunk rode along) -> (2 / 16, 0.75)."""
    wall = sum(rec.duration_s for rec in records)
    later = [s for rec in records for s in rec.steps[1:]]
    if wall <= 0 or not later or any(s.gpu_idle_s is None for s in later):
        return None, None
    gap = sum(s.gpu_idle_s for s in later)
    mixed = sum(s.gpu_idle_s for s in later if s.prefill_tokens)
    return gap / wall, (mixed / gap if gap > 0 else None)


def summarize(records: Iterable[RunRecord], concurrency: int | None = None) -> RunMetrics:
    """Merge the replicas' records of one run into one row of metrics. concurrency: the closed
    loop's C per replica (steady_tok_per_s); None for open-loop runs."""
    records = list(records)
    if not records:
        raise ValueError("no run records to summarize")
    reqs = [r for rec in records for r in rec.requests]
    if not reqs:
        raise ValueError("run records hold no finished requests")
    steps = [s for rec in records for s in rec.steps]
    duration = max(rec.duration_s for rec in records)
    tokens = sum(r.output_len for r in reqs)
    lat = [r.latency_s for r in reqs]
    ttft = [r.ttft_s for r in reqs if r.ttft_s is not None]
    tpot = [r.tpot_s for r in reqs if r.tpot_s is not None]
    ss = step_summary(steps)
    steady = [steady_state(rec.steps, concurrency) for rec in records] if concurrency else [None]
    if any(x is None for x in steady):
        ss.update(steady_tok_per_s=None, steady_fraction=None)
    else:
        ss.update(steady_tok_per_s=sum(x[0] for x in steady), steady_fraction=min(x[1] for x in steady))
    held = [sustained(rec) for rec in records] if concurrency else [None]
    ss["sustained_tok_per_s"] = None if any(x is None for x in held) else sum(held)
    ss["engine_idle_fraction"] = engine_idle(records)
    ss["gpu_gap_fraction"], ss["gpu_gap_mixed_share"] = gpu_gaps(records)
    ss["gc_pause_fraction"] = gc_pauses(records)
    return RunMetrics(
        replicas=len(records),
        num_requests=len(reqs),
        output_tokens=tokens,
        duration_s=duration,
        output_tok_per_s=tokens / duration if duration > 0 else 0.0,
        requests_per_s=len(reqs) / duration if duration > 0 else 0.0,
        p50_latency_s=percentile(lat, 50),
        p99_latency_s=percentile(lat, 99),
        mean_latency_s=_mean(lat),
        ttft_s=_mean(ttft),
        p50_ttft_s=percentile(ttft, 50),
        p99_ttft_s=percentile(ttft, 99),
        tpot_s=_mean(tpot),
        p50_tpot_s=percentile(tpot, 50),
        per_replica_tok_per_s=tuple(rec.output_tokens / rec.duration_s if rec.duration_s > 0 else 0.0
                                    for rec in records),
        **ss,
    )
