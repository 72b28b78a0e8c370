"""A sweep's result rows: one per (load point, mode), the median trial with the spread over
trials, its iterations' sizes and times (step_times), and the adaptive mode's per-iteration
records (StepTrace)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dynspec.benchmarks.sweep_modes import LOOP_LABELS, policy_label, shift_of
from dynspec.runtime.policy import DraftSchedule, registered_name

if TYPE_CHECKING:
    from dynspec.benchmarks.sweep_plan import LoadPoint, SweepSpec


def matched_rate(trial_metrics: Sequence, world_size: int) -> float:
    """Poisson rate per replica at the closed loop's mean load: the median trial's requests/s
    over all replicas / replicas. Trials at 10.0, 12.0, 11.0 req/s on 2 replicas -> 5.5 req/s."""
    return median_trial(trial_metrics).requests_per_s / world_size


# one adaptive iteration: K, the acceptance estimate's position 1 the decision used (None before any),
# 1 for a probe step, the policy's host time (us), the smallest request key among the decode rows,
# the engine step (us), the decode rows
ADAPTIVE_FIELDS = ("k", "acceptance1", "probe", "policy_us", "oldest_key", "step_us", "batch_size", "policy_exposed_us")


class StepTrace:
    """Wraps an Executor: forwards everything; step() counts the iterations the overlapped loop
    ran (`overlapped`) and, with adaptive=True, keeps each decode iteration's ADAPTIVE_FIELDS
    (IterationStats of the adaptive policy) in `steps`, compact tuples."""

    def __init__(self, executor, adaptive: bool = True):
        self._ex, self._adaptive = executor, adaptive
        self.steps: list[tuple] = []
        self.overlapped = 0

    def __getattr__(self, name):
        return getattr(self._ex, name)

    def step(self):
        st = self._ex.step()
        if st is not None:
            self.overlapped += bool(getattr(st, "overlapped", False))
            if self._adaptive and st.batch_size > 0:
                self.steps.append(adaptive_record(st))
        return st


def adaptive_record(st) -> tuple:
    """IterationStats -> (k, acceptance1, probe, policy_us, oldest_key, step_us, batch_size,
    policy_exposed_us): K=2, acceptance (0.61234, 0.4), probe False, policy 21.5e-6 s, oldest 7,
    step 0.0123 s, b=4, exposed 9.25e-6 s -> (2, 0.6123, 0, 21.5, 7, 12300.0, 4, 9.2)."""
    acc = tuple(getattr(st, "acceptance", ()) or ())
    return (st.k, round(float(acc[0]), 4) if acc else None, int(bool(getattr(st, "probe", False))),
            round(1e6 * float(getattr(st, "policy_seconds", 0.0)), 1), getattr(st, "oldest_key", None),
            round(1e6 * st.seconds, 1), st.batch_size,
            round(1e6 * float(getattr(st, "policy_exposed_seconds", getattr(st, "policy_seconds", 0.0))), 1))


def adaptive_fields(trial_steps: Sequence, acceptance) -> dict:
    """The adaptive row's per-iteration records: {"adaptive_steps": {"fields", "trials": [trial
    [replica [iteration record]]]}} and, under a shift, "shift": its key and rates at this point."""
    out = {"adaptive_steps": {"fields": list(ADAPTIVE_FIELDS), "trials": [list(t) for t in trial_steps]}}
    sh = shift_of(acceptance)
    if sh is not None:
        out["shift"] = sh
    return out


def trial_fields(mets: Sequence) -> dict:
    """Per-mode spread over trials: tok/s of every trial, min and max (the row itself is the median trial).

    Trials at 90, 100, 95 tok/s -> output_tok_per_s 95 (median run), tok_per_s_min 90, tok_per_s_max 100."""
    tps = [x.output_tok_per_s for x in mets]
    return {"trials": len(mets), "trial_tok_per_s": tps, "tok_per_s_min": min(tps), "tok_per_s_max": max(tps),
            "trial_p99_ttft_s": [x.p99_ttft_s for x in mets],
            "trial_steady_tok_per_s": [x.steady_tok_per_s for x in mets],
            "trial_sustained_tok_per_s": [x.sustained_tok_per_s for x in mets]}


def median_trial(mets: Sequence):
    """The trial with the median throughput (the lower middle one for an even count)."""
    return sorted(mets, key=lambda x: x.output_tok_per_s)[(len(mets) - 1) // 2]


def make_row(p: LoadPoint, mode: str, spec: SweepSpec, schedule: DraftSchedule, draft_sync: str, met,
             world_size: int) -> dict:
    row = {
        "mode": mode,
        "loop": LOOP_LABELS[dict(spec.loops)[mode]],   # serial | overlap: the executor loop the mode ran
        "concurrency": p.concurrency,
        "total_concurrency": None if p.concurrency is None else p.concurrency * world_size,
        "request_rate": p.request_rate,
        "matched_concurrency": p.matched_concurrency,
        "acceptance_model": str(spec.acceptance),
        "schedule": policy_label(schedule),
        "policy": registered_name(schedule),     # schedule, adaptive, per-request or per-request-oracle
        "draft_sync": draft_sync,                # lazy | warm | off: the draft while K=0
    }
    row.update(met.to_json())
    return row


# one iteration of any mode: decode rows, K, prompt tokens riding, catch-up entries written, engine step (us)
STEP_FIELDS = ("batch_size", "k", "prefill_tokens", "catch_up_tokens", "step_us")


def step_times(replica_steps: Sequence[Sequence]) -> dict:
    """The iterations of one trial, every replica, as STEP_FIELDS tuples (benchmarks/figures_steps.py
    splits a mode's time by them): IterationStats b=64, K=1, 128 prompt tokens, no catch-up,
    0.0123 s -> (64, 1, 128, 0, 12300.0)."""
    return {"fields": list(STEP_FIELDS),
            "replicas": [[(s.batch_size, s.k, s.prefill_tokens, s.catch_up_tokens, round(1e6 * s.seconds, 1))
                          for s in steps] for steps in replica_steps]}


def padding_share(steps, forward_tokens) -> float | None:
    """Pure. The padding of the mixed and per-row iterations' forwards: sum(forward - real) /
    sum(forward) over iterations with prompt tokens or rows at their own K, real = the rows'
    verify tokens (drafted + rows) + prompt tokens, forward = forward_tokens(decode rows, K,
    prompt tokens, verify tokens) (the engine's padded size); None without any.
    Rows 3 at K=1 + 9 prompt tokens, forward 16 (a 16-token graph): (16 - 15) / 16 = 0.0625."""
    def verify(s) -> int:
        return s.drafted + s.decode_rows

    mixed = [s for s in steps if s.prefill_tokens or verify(s) != s.decode_rows * (s.k + 1)]
    total = sum(forward_tokens(s.decode_rows, s.k, s.prefill_tokens, verify(s)) for s in mixed)
    real = sum(verify(s) + s.prefill_tokens for s in mixed)
    return (total - real) / total if total else None


def capture_fields(engine) -> dict:
    """What the engine's graph captures took (ReferenceEngine.capture_costs): seconds and device
    bytes, decode and whole-forward graphs together; {} for an engine that reports none."""
    costs = getattr(engine, "capture_costs", None) or {}
    if not costs:
        return {}
    return {"graphs_captured": sum(c.graphs for c in costs.values()),
            "graph_capture_s": sum(c.seconds for c in costs.values()),
            "graph_capture_bytes": sum(c.bytes for c in costs.values())}
