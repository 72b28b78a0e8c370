"""The executor's planning inputs (runtime/executor.py, steps 2-4): the K decision and the state
it reads (the acceptance estimate, the cost calibration, the previous K, the probes, each
request's acceptance counts), and the decode rows' and prompt chunks' shares of the plan."""
from __future__ import annotations

import math
from typing import Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.adaptive import AdaptivePolicy, Decision, PolicyInputs
from dynspec.runtime.overlap import row_inputs
from dynspec.runtime.per_request import RowDecision, RowInputs, RowPolicy
from dynspec.runtime.plan import PromptChunk, StepPlan, StepResult, bucket_for, cap_k, chunk_sizes, make_plan
from dynspec.runtime.requests import Launched, Request
from dynspec.runtime.row_table import RowTable


class KDecider:
    """One K decision an iteration, and what the decisions remember between iterations."""

    def __init__(self, engine, policy, keep_warm: bool, truth=None):
        self.engine, self.policy, self.keep_warm = engine, policy, keep_warm
        self.truth = truth                        # request key -> true rate (per_request.Truth), or None
        # the acceptance estimate (a schedule's made at the first step: the engine is not read before)
        self.estimate = policy.initial_estimate() if isinstance(policy, AdaptivePolicy) else None
        self.calibration = policy.initial_calibration() if isinstance(policy, AdaptivePolicy) else None
        self.prev_k = 0                           # K of the last iteration with decode rows
        self.since_spec = 0                       # iterations with rows since the last one at K > 0
        self.probes = 0                           # probes since the last speculative step that was not one
        self._row_table: RowTable | None = None   # made at first use (the engine is not read before)
        self.pending: tuple | None = None         # (k, accepted, row_k or None, calibration slot or None,
                                                  #  measured ms, predicted ms): update not yet applied

    def new_request(self, slot: int) -> None:
        """A request took `slot`: a row policy's counts of it start empty (no table otherwise)."""
        if isinstance(self.policy, RowPolicy):
            self.row_table.reset(slot)

    @property
    def row_table(self) -> RowTable:
        """Each request's own acceptance counts by slot (a row policy's inputs: runtime/row_table.py)."""
        if self._row_table is None:
            self._row_table = RowTable(self.engine.max_batch_size + 1, max(self.engine.max_draft_len, 1))
        return self._row_table

    def decide(self, rows: Sequence[Request], positions: Sequence[int], rates: tuple[float, ...]):
        """(K, the policy's decision or None, mean context, cost scales used) for these decode rows."""
        if isinstance(self.policy, RowPolicy):
            return self._decide_rows(rows, positions, rates)
        return self._decide(positions, rates)

    def _decide(self, positions: Sequence[int],
                rates: tuple[float, ...]) -> tuple[int, Decision | None, float, tuple[float, ...]]:
        """K within the engine's max_draft_len and the token budget for rows at these positions."""
        b = len(positions)
        if not b:
            return 0, None, 0.0, ()
        eng = self.engine
        context = sum(positions) / b
        if isinstance(self.policy, AdaptivePolicy):
            x = self._batch_inputs(b, context, rates)
            d = self.policy.decide(x)
            return d.k, d, context, x.cost_scale
        k = int(self.policy(b))
        if not 0 <= k <= eng.max_draft_len:
            raise DynspecError(f"policy gave K={k} for batch {b}; the engine supports 0..{eng.max_draft_len}")
        return cap_k(k, b, eng.max_num_tokens), None, context, ()

    def _batch_inputs(self, b: int, context: float, rates: tuple[float, ...]) -> PolicyInputs:
        """The batch-level policy's inputs at b rows (the adaptive policy's, and a row policy's fallback)."""
        eng, cal = self.engine, self.calibration
        scale, plain = (cal.scales(), cal.counts[0]) if cal is not None else ((), math.inf)
        return PolicyInputs(b, context, rates, self.prev_k, self.since_spec, cap_k(eng.max_draft_len, b, eng.max_num_tokens),
                            bucket_for(b, eng.buckets), scale, self.keep_warm, plain, self.probes)

    def _decide_rows(self, rows: Sequence[Request], positions: Sequence[int],
                     rates: tuple[float, ...]) -> tuple[int, RowDecision | None, float, tuple[float, ...]]:
        """A row policy's (max K_i, its RowDecision, mean context, the cost scales it read): each row's rates
        as the policy reads them (RowPolicy.row_rates: its counts in the row table, or the truth)."""
        b = len(rows)
        if not b:
            return 0, None, 0.0, ()
        eng = self.engine
        context = sum(positions) / b
        slots = [r.slot for r in rows]
        scale = self.calibration.scales() if self.calibration is not None else ()
        d = self.policy.decide_rows(RowInputs(
            b, context, rates, self.policy.row_rates(self.row_table, slots, rates, [r.id for r in rows], self.truth),
            [r.idle for r in rows], cap_k(eng.max_draft_len, b, eng.max_num_tokens), self.keep_warm,
            self.since_spec, scale, [r.probes for r in rows], eng.packs_rows, self._batch_inputs(b, context, rates)))
        if len(d.ks) != b or not all(0 <= k <= eng.max_draft_len for k in d.ks):
            raise DynspecError(f"row policy gave K {list(d.ks)} for {b} rows; the engine supports 0..{eng.max_draft_len}")
        probed = set(d.probes)
        for i, (r, k) in enumerate(zip(rows, d.ks)):   # at the decision: the overlapped loop plans before it folds
            r.idle = 0 if k else r.idle + 1
            if k:
                r.probes = r.probes + 1 if i in probed else 0
        return d.k, d, context, scale

    def count_k(self, k: int, decision: "Decision | None") -> None:
        """The memory of an iteration with decode rows run at K (serial: when it is folded;
        overlapped: when it is launched, so the next plan already knows it): the previous K, the
        iterations since the last at K > 0, the probes since the last speculative step not one."""
        self.prev_k, self.since_spec = k, (0 if k else self.since_spec + 1)
        if decision is not None and decision.probe:
            self.probes += 1
        elif k:
            self.probes = 0

    def count_rows(self, launched: Launched, result: StepResult) -> None:
        """A folded step's rows' own counts (the row table, each request's accepted / drafted /
        decode steps), before its tokens are appended: a request that ends on them is complete
        when it ends. A request already ended keeps its counts (the overlapped loop launched this
        step before its end was known; the iteration's stats still count the work)."""
        plan = launched.plan
        live = [i for i, req in enumerate(launched.rows) if req.finish_reason is None]
        if isinstance(self.policy, RowPolicy):            # the table is a row policy's input alone
            self.row_table.update([plan.slots[i] for i in live], [plan.row_k[i] for i in live],   # an ended
                                  [result.accepted[i] for i in live])      # request's slot may be another's now
        for i in live:
            req, ki, a = launched.rows[i], plan.row_k[i], result.accepted[i]
            req.accepted += a
            req.drafted += ki
            req.decode_steps += 1

    def record(self, launched: Launched, result: StepResult, seconds: float) -> None:
        """A folded step with decode rows: the estimate / calibration update pending (apply_pending)."""
        plan, decision = launched.plan, launched.decision
        slot = None
        if decision and decision.predicted_ms and not plan.chunks and self.calibration is not None:
            slot = self.calibration.slot(plan.k, plan.keep_warm, True in plan.stale, plan.per_row)
        self.pending = (plan.k, result.accepted, plan.row_k if plan.per_row else None, slot, seconds * 1e3,
                        decision.predicted_ms if decision else None)

    def apply_pending(self, clock) -> float:
        """Fold the pending (k, accepted, slot, measured, predicted) into the estimate and the
        calibration -> the seconds it took (0 when nothing was pending)."""
        if self.pending is None:
            return 0.0
        t = clock()
        k, accepted, row_k, slot, measured_ms, predicted_ms = self.pending
        self.pending = None
        self.estimate = self.estimate.update(k, accepted, row_k)
        if slot is not None:
            self.calibration = self.calibration.update(slot, measured_ms, predicted_ms)
        return clock() - t

    def rows_leave(self, kept: float, clock) -> None:
        """Decode rows ended: their share of the estimate goes too (the pending update first)."""
        if self.estimate is not None:
            self.apply_pending(clock)
            self.estimate = self.estimate.forget(kept)


def plan_row_inputs(rows: Sequence[Request], prev: Launched | None):
    """Each decode row's plan inputs (runtime/overlap.py): exact when nothing is in flight."""
    if prev is None:
        return row_inputs([r.length for r in rows], [r.out[-1] if r.out else None for r in rows], None)
    ran = {id(r) for r in prev.rows}
    return row_inputs([r.length for r in rows], [None] * len(rows),
                      [prev.plan.k if id(r) in ran else 0 for r in rows])


def prompt_chunks(reqs: Sequence[Request], left: int) -> tuple[tuple[PromptChunk, ...], list[Request]]:
    """The admitted requests' next prompt chunks within `left` tokens (plan.chunk_sizes), and the
    request of each chunk."""
    sizes = chunk_sizes(left, [len(r.prompt) - r.prefilled for r in reqs])
    chunks, chunked = [], []
    for req, n in zip(reqs, sizes):
        if n == 0:
            continue
        s, e = req.prefilled, req.prefilled + n
        chunks.append(PromptChunk(req.slot, s, req.prompt[s:e], req.prompt[e] if e < len(req.prompt) else None))
        chunked.append(req)
    return tuple(chunks), chunked


def make_step_plan(k: int, rows: Sequence[Request], rin, decision, keep_warm: bool, engine, chunks,
                   carry: bool, draft: bool) -> StepPlan:
    """The iteration's StepPlan (plan.make_plan) from its rows, K decision and chunks."""
    return make_plan(
        k,
        positions=rin.positions,
        pending=rin.pending,
        stale=[not r.draft_warm for r in rows],
        keep_warm=decision.keep_warm if decision else keep_warm,
        buckets=engine.buckets,
        slots=[r.slot for r in rows],
        chunks=chunks,
        from_device=rin.from_device,
        carry=carry,
        draft=draft,
        row_k=decision.ks if isinstance(decision, RowDecision) else None,
    )
