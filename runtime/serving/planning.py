"""The executor's planning inputs (runtime/serving/executor.py, steps 2-4): the K decision and the state
it reads (the acceptance estimate, the cost calibration, the previous K, the probes, each
request's acceptance counts), and the decode rows' and prompt chunks' shares of the plan."""
from __future__ import annotations

import copy
import math
from typing import Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.serving.draft_sync import RowSync, store_cap
from dynspec.runtime.serving.overlap import row_inputs
from dynspec.runtime.serving.plan import (CatchUp, PromptChunk, StepPlan, StepResult, bucket_for, cap_k, make_plan,
                                          packs_vector)
from dynspec.runtime.serving.requests import Launched, Request
from dynspec.runtime.policy.row_table import RowTable
from dynspec.runtime.policy.step_decision import StepDecision, StepInputs


class KDecider:
    """One K decision an iteration, and what the decisions remember between iterations."""

    def __init__(self, engine, policy, keep_warm: bool, truth=None, lazy: bool = False):
        self.engine, self.policy, self.keep_warm, self.lazy = engine, policy, keep_warm, lazy
        self.truth = truth                        # request key -> true rate (per_request.Truth), or None
        # the acceptance estimate (a policy without initial_estimate: made at the first step, the
        # engine is not read before) and the cost calibration (runtime/policy/__init__.py Policy, its hooks)
        self.estimate = _start(policy, "initial_estimate")
        self.calibration = _start(policy, "initial_calibration")
        self.row_rates = getattr(policy, "row_rates", None)   # a policy that reads each row's own counts
        self.reads_prompts = bool(getattr(policy, "reads_prompts", False))   # ... or the prompts waiting
        self.prev_k = 0                           # K of the last iteration with decode rows
        self.since_spec = 0                       # iterations with rows since the last one at K > 0
        self.probes = 0                           # probes since the last speculative step that was not one
        self._row_table: RowTable | None = None   # made at first use (the engine is not read before)
        self.pending: tuple | None = None         # (k, accepted, row_k or None, calibration slot or None,
                                                  #  measured ms, predicted ms): update not yet applied

    def new_request(self, slot: int) -> None:
        """A request took `slot`: the counts of it start empty (kept for a policy that reads them)."""
        if self.row_rates is not None:
            self.row_table.reset(slot)

    @property
    def row_table(self) -> RowTable:
        """Each request's own acceptance counts by slot (the row_rates hook's input: runtime/policy/row_table.py)."""
        if self._row_table is None:
            self._row_table = RowTable(self.engine.max_batch_size + 1, max(self.engine.max_draft_len, 1))
        return self._row_table

    def decide(self, rows: Sequence[Request], positions: Sequence[int], rates: tuple[float, ...],
               waiting: tuple[int, ...] = ()) -> tuple[int, StepDecision | None, float, tuple[float, ...]]:
        """(K, the policy's decision or None without rows, mean context, cost scales used) for these
        decode rows (and the prompt tokens waiting: StepInputs.waiting): the policy's K of each row,
        within the engine's max_draft_len (else an error) and capped to the token budget."""
        if not rows:
            return 0, None, 0.0, ()
        x = self.inputs(rows, positions, rates, waiting)
        d = self.policy.decide(x)
        kmax, b = self.engine.max_draft_len, x.batch_size
        if len(d.ks) != b or min(d.ks) < 0 or d.k > kmax:
            got = f"K={d.ks[0]} for batch {b}" if len(set(d.ks)) == 1 else f"K {list(d.ks)} for {b} rows"
            raise DynspecError(f"policy gave {got}; the engine supports 0..{kmax}")
        if d.k > x.max_k:
            d = d.capped(x.max_k)
        if self.row_rates is not None:
            probed = set(d.probes)
            for i, (r, k) in enumerate(zip(rows, d.ks)):   # at the decision: the overlapped loop plans before it folds
                r.idle = 0 if k else r.idle + 1
                if k:
                    r.probes = r.probes + 1 if i in probed else 0
        return d.k, d, x.context, x.cost_scale

    def drafts(self, rows: Sequence[Request], positions: Sequence[int], rates: tuple[float, ...],
               waiting: tuple[int, ...] = ()) -> bool:
        """Whether the policy would draft (K > 0, within the budget's cap as decide caps it) for
        these decode rows, asked of a shallow copy of it and without what a decision changes (the
        rows' idle and probe counts): a policy that counts its decisions in an attribute keeps its
        count, and memo caches (AdaptivePolicy's cost rows) are shared, not copied. The executor asks
        it of the rows a step without rows would leave (the prompts it ends), to store their chunks
        where they would not draft next (runtime/serving/draft_sync.py, "Prompts")."""
        if not rows:
            return False
        x = self.inputs(rows, positions, rates, waiting)
        return min(copy.copy(self.policy).decide(x).k, x.max_k) > 0

    def inputs(self, rows: Sequence[Request], positions: Sequence[int], rates: tuple[float, ...],
               waiting: tuple[int, ...] = ()) -> StepInputs:
        """This iteration's StepInputs for b >= 1 decode rows: each row's rates, idle iterations and
        probes only for a policy with the row_rates hook (its rates from the row table, or the truth)."""
        eng, cal, b = self.engine, self.calibration, len(rows)
        scale, plain = (cal.scales(), cal.counts[0]) if cal is not None else ((), math.inf)
        per_row = {}
        if self.row_rates is not None:
            per_row = dict(rates=self.row_rates(self.row_table, [r.slot for r in rows], rates, [r.id for r in rows],
                                                self.truth),
                           idle=[r.idle for r in rows], row_probes=[r.probes for r in rows],
                           packed=packs_vector(eng, bool(waiting)))
        cap = store_cap(eng) if self.lazy else 0
        return StepInputs(b, sum(positions) / b, rates, self.prev_k, self.since_spec,
                          cap_k(eng.max_draft_len, b, eng.max_num_tokens), bucket_for(b, eng.buckets), scale,
                          self.keep_warm, plain, self.probes, **per_row, waiting=tuple(waiting),
                          token_budget=eng.max_num_tokens, lazy=self.lazy,
                          behind=sum(max(min(r.draft_behind, cap) - 1, 0) for r in rows) if cap else 0)

    def count_k(self, k: int, decision: StepDecision | None) -> None:
        """The memory of an iteration with decode rows run at K (Executor.advance: SerialLoop when it
        is folded, OverlappedLoop when it is launched, so the next plan already knows it): the previous
        K, the iterations since the last at K > 0, the probes since the last speculative step not one."""
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
        if self.row_rates is not None:                    # the table is the row_rates hook's input alone
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
        if decision and decision.predicted_ms and not (plan.chunks or plan.catch_up) and self.calibration is not None:
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


def _start(policy, hook: str):
    """The policy's initial_estimate() or initial_calibration(); None where it has no such hook."""
    start = getattr(policy, hook, None)
    return start() if start is not None else None


def plan_row_inputs(rows: Sequence[Request], prev: Launched | None):
    """Each decode row's plan inputs (runtime/serving/overlap.py): exact when nothing is in flight."""
    if prev is None:
        return row_inputs([r.length for r in rows], [r.out[-1] if r.out else None for r in rows], None)
    ran = {id(r) for r in prev.rows}
    return row_inputs([r.length for r in rows], [None] * len(rows),
                      [prev.plan.k if id(r) in ran else 0 for r in rows])


def prompt_chunks(reqs: Sequence[Request], left: int, cap: int | None = None
                  ) -> tuple[tuple[PromptChunk, ...], list[Request]]:
    """The admitted requests' next prompt chunks within `left` tokens, first come first served
    (as plan.chunk_sizes), and the request of each chunk. cap (lazy sync, a step that drafts its
    chunks): a request behind (draft_sync.chunk_catch_up) spends min(behind, cap) of `left` on its
    catch-up before its chunk, and waits where that leaves no token for the chunk."""
    chunks, chunked = [], []
    for req in reqs:
        need = min(req.draft_behind, cap) if cap is not None else 0
        n = min(len(req.prompt) - req.prefilled, left - need)
        if n <= 0:
            continue
        left -= n + need
        s, e = req.prefilled, req.prefilled + n
        chunks.append(PromptChunk(req.slot, s, req.prompt[s:e], req.prompt[e] if e < len(req.prompt) else None))
        chunked.append(req)
    return tuple(chunks), chunked


def make_step_plan(k: int, rows: Sequence[Request], rin, decision, draft_sync: str, engine, chunks,
                   sync: RowSync, carry: bool, draft: bool, chunk_catch_up: Sequence[CatchUp] = (),
                   store_chunks: bool = False) -> StepPlan:
    """The iteration's StepPlan (plan.make_plan) from its rows, K decision, draft sync (the
    executor's mode; the rows' RowSync: each row's K, stale head and catch-up), chunks and their
    lazy sync (the prompts' catch-ups; store_chunks). keep_warm: the decision's (a policy may
    choose it) under "warm" only."""
    warm = draft_sync == "warm"
    return make_plan(
        k,
        positions=rin.positions,
        pending=rin.pending,
        stale=sync.stale,
        keep_warm=(decision.keep_warm if decision else True) and warm,
        buckets=engine.buckets,
        slots=[r.slot for r in rows],
        chunks=chunks,
        from_device=rin.from_device,
        carry=carry,
        draft=draft,
        row_k=sync.ks if rows else None,
        lazy=draft_sync == "lazy",
        catch_up=sync.catch_up + tuple(chunk_catch_up),
        store_chunks=store_chunks,
    )
