"""The reference `dynspec` model's custom metrics on Triton's /metrics: the executor's
IterationStats read by iteration number (StatsCursor -> MetricsSample), and the Prometheus
families they and the finished requests update (ModelMetrics: K, b, drafted / accepted tokens,
iterations by K, requests finished / rejected / cancelled, per-request acceptance histograms)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

from dynspec.triton_repo.request_acceptance import ACCEPTANCE_BUCKETS, mean_k_buckets


@dataclass(frozen=True)
class MetricsSample:
    draft_len: int | None               # K of the latest iteration; None before the first one
    batch_size: int                     # b of the latest iteration; 0 once the executor is idle
    drafted: int                        # draft tokens proposed since the previous sample
    accepted: int                       # draft tokens accepted since the previous sample
    iterations_by_k: Mapping[int, int]  # iterations since the previous sample, by K
    acceptance: float | None = None     # the executor's estimate of a_1 at the latest iteration
    probes: int = 0                     # adaptive K=1 probe iterations since the previous sample
    gc_seconds: float = 0.0             # the process's cycle-collector pauses in those iterations (gc_heap.py)


# Iteration stats the served executor keeps: the monitor reads them every 50 ms, far fewer
# iterations than this ever run in between (an iteration of the tiny pair on CPU takes ~2 ms).
STATS_KEPT = 4096


class StatsCursor:
    """Reads an executor's IterationStats by iteration number; each sample covers iterations
    not seen before. Feed it `executor.stats_since(cursor.next)`: the executor keeps only the
    newest iterations, so positions in its log are not stable, iteration numbers are."""

    def __init__(self) -> None:
        self.next = 0
        self._k: int | None = None
        self._b = 0
        self._a1: float | None = None

    def sample(self, stats: Sequence, busy: bool) -> MetricsSample:
        new = [st for st in stats if st.iteration >= self.next]
        if new:
            self.next = new[-1].iteration + 1
        # an iteration with prompt chunks only (batch_size 0: no row decodes) makes no K decision
        decoding = [st for st in new if st.batch_size > 0]
        by_k: dict[int, int] = {}
        for st in decoding:
            by_k[st.k] = by_k.get(st.k, 0) + 1
        if decoding:
            self._k, self._b = decoding[-1].k, decoding[-1].batch_size
            if decoding[-1].acceptance:
                self._a1 = decoding[-1].acceptance[0]
        elif not busy:
            self._b = 0
        return MetricsSample(self._k, self._b, sum(s.drafted for s in new), sum(s.accepted for s in new), by_k,
                             self._a1, sum(s.probe for s in decoding), sum(s.gc_seconds for s in new))


REJECTED = {"refused": "output_rule", "tp_fault": "tp_fault", "dropped": "internal"}   # finish reason -> label


class ModelMetrics:
    """Custom metrics on Triton's /metrics endpoint. `family`: the python backend's
    pb_utils.MetricFamily (Triton-free here, so a fake one can stand in). The histograms' buckets:
    request_acceptance.ACCEPTANCE_BUCKETS and mean_k_buckets(max_draft_len). Not thread-safe:
    callers hold the model's lock."""

    def __init__(self, family, labels, max_draft_len):
        self._labels = labels
        self._families = {
            "k": family("dynspec_draft_length", "Draft length K of the latest executor iteration", family.GAUGE),
            "b": family("dynspec_batch_size", "Batch size of the latest executor iteration (0 when idle)",
                        family.GAUGE),
            "drafted": family("dynspec_drafted_tokens_total", "Draft tokens proposed (batch size x K)",
                              family.COUNTER),
            "accepted": family("dynspec_accepted_tokens_total", "Draft tokens accepted by the target",
                               family.COUNTER),
            "iterations": family("dynspec_iterations_total", "Executor iterations, by draft length k",
                                 family.COUNTER),
            "acceptance": family("dynspec_acceptance_estimate", "The executor's estimate of draft position 1's "
                                 "acceptance rate at the latest iteration (runtime/policy/acceptance_estimate.py)",
                                 family.GAUGE),
            "probes": family("dynspec_probe_iterations_total", "K=1 iterations the adaptive policy took to "
                             "measure acceptance while K=0 was best", family.COUNTER),
            "gc": family("dynspec_gc_pause_seconds_total", "Seconds the serving process spent in Python's cycle "
                         "collector between iterations (its heap is frozen at start: runtime/serving/gc_heap.py)",
                         family.COUNTER),
            "finished": family("dynspec_requests_finished_total", "Finished requests, by reason",
                               family.COUNTER),
            "rejected": family("dynspec_requests_rejected_total", "Requests answered with an error, by reason "
                               "(invalid_argument, output_rule, tp_fault, internal)", family.COUNTER),
            "cancelled": family("dynspec_requests_cancelled_total", "Requests cancelled by their client or "
                                "ended because their client went away", family.COUNTER),
        }
        self._families["request_acceptance"] = family(
            "dynspec_request_acceptance", "Per finished request: accepted / drafted draft tokens (requests answered "
            "with their output that drafted at least one token)", family.HISTOGRAM)
        self._families["request_mean_k"] = family(
            "dynspec_request_mean_k", "Per finished request: mean draft length K over its decode iterations "
            "(requests answered with their output that decoded at least once)", family.HISTOGRAM)
        self.request_acceptance = self._families["request_acceptance"].Metric(labels=labels,
                                                                              buckets=list(ACCEPTANCE_BUCKETS))
        self.request_mean_k = self._families["request_mean_k"].Metric(labels=labels,
                                                                      buckets=list(mean_k_buckets(max_draft_len)))
        self._families["restarts"] = family("dynspec_server_restarts",
                                            "Times the launcher restarted tritonserver after it crashed", family.GAUGE)
        self.restarts = self._families["restarts"].Metric(labels=labels)
        self.restarts.set(int(os.environ.get("DYNSPEC_SERVER_RESTARTS") or 0))
        self.k = self._families["k"].Metric(labels=labels)
        self.b = self._families["b"].Metric(labels=labels)
        self.drafted = self._families["drafted"].Metric(labels=labels)
        self.accepted = self._families["accepted"].Metric(labels=labels)
        self.cancelled = self._families["cancelled"].Metric(labels=labels)
        self.acceptance = self._families["acceptance"].Metric(labels=labels)
        self.probes = self._families["probes"].Metric(labels=labels)
        self.gc = self._families["gc"].Metric(labels=labels)
        self._by = {}

    def _labelled(self, family, key, value):
        if (family, value) not in self._by:
            self._by[(family, value)] = self._families[family].Metric(labels={**self._labels, key: str(value)})
        return self._by[(family, value)]

    def update(self, sample):
        if sample.draft_len is not None:
            self.k.set(sample.draft_len)
        self.b.set(sample.batch_size)
        if sample.drafted:
            self.drafted.increment(sample.drafted)
        if sample.accepted:
            self.accepted.increment(sample.accepted)
        if sample.acceptance is not None:
            self.acceptance.set(sample.acceptance)
        if sample.probes:
            self.probes.increment(sample.probes)
        if sample.gc_seconds:
            self.gc.increment(sample.gc_seconds)
        for k, n in sample.iterations_by_k.items():
            self._labelled("iterations", "k", k).increment(n)

    def finished(self, reason):
        self._labelled("finished", "reason", reason).increment(1)
        if reason == "cancelled":
            self.cancelled.increment(1)
        elif reason in REJECTED:
            self._labelled("rejected", "reason", REJECTED[reason]).increment(1)

    def rejected(self, reason):
        self._labelled("rejected", "reason", reason).increment(1)

    def observe(self, acceptance):
        """One answered request's RequestAcceptance (None: its counts are unknown) into the histograms."""
        if acceptance is None:
            return
        if acceptance.acceptance is not None:
            self.request_acceptance.observe(acceptance.acceptance)
        if acceptance.decode_steps:
            self.request_mean_k.observe(acceptance.mean_k)

