"""Per-request draft length: each decode row gets its own K_i, decided once per iteration before
anything is shaped (docs/design.md, "Per-request draft length").

A policy that sets each row's K has a `row_rates(...)` hook (how it reads each request's counts:
the row table, runtime/policy/row_table.py; the executor then hands it the rows' rates in StepInputs.rates)
and answers `decide(StepInputs) -> StepDecision` like every policy; the executor plans the step with
row_k = the decision's ks (plan.StepPlan.row_k). PerRequestPolicy's rule reads RowInputs, each row
read optimistically (an upper confidence bound on its Beta posterior, so a new row drafts while its
own trials are few); runtime/policy/per_request_oracle.py reads each request's true rate instead
(benchmarks only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from dynspec.errors import DynspecError
from dynspec.runtime.policy.adaptive import CONTEXT_STEP, AdaptivePolicy, AdaptiveSettings
from dynspec.runtime.policy.cost_model import CostModel
from dynspec.runtime.policy.per_row import Allocation, allocate, uniform_allocation
from dynspec.runtime.policy.prefill_price import finishing, prompt_weight
from dynspec.runtime.policy.row_table import RowTable
from dynspec.runtime.policy.split_cost import SplitCost
from dynspec.runtime.policy.step_decision import StepDecision, StepInputs


@dataclass(frozen=True)
class RowInputs:
    batch_size: int                  # b decode rows
    context: float                   # mean KV length of the rows
    pool: tuple[float, ...]          # the pooled per-position estimate (AcceptanceEstimate.rates)
    rates: np.ndarray                # [b, P] each row's per-position rates, shrunk toward the pool
    idle: np.ndarray                 # [b] iterations since each row last drafted (0: it drafted last time)
    max_k: int                       # the largest K_i the engine and the token budget allow
    keep_warm: bool = True           # the engine may keep the draft warm at K=0
    since_spec: int = 0              # iterations with rows since the last one with any K_i > 0
    cost_scale: tuple[float, ...] = ()   # CostCalibration.scales() (empty: the profile alone)
    probes: Sequence[int] = ()       # [b] each row's probes since it last drafted other than as a probe (empty: 0)
    packed: bool = True              # the engine verifies each row's K_i + 1 tokens in this step (Engine.packs_rows;
                                     # without a prompt chunk: packs_rows_alone); False: every row padded to max K_i
    batch: StepInputs | None = None      # the batch-level policy's inputs at this step (None: no fallback)


Truth = Callable[[int], "float | None"]   # a request key -> its true rate (acceptance.rate_of), None: unknown
LABEL = "per-request"    # what chose K in the iteration stats (StepDecision.policy), the oracle's too


PRIOR_WEIGHT = 2.0     # pseudo-trials of the pool in a row's posterior
OPTIMISM = 0.5         # standard deviations above the posterior mean (chosen on the simulator: docs/design.md)
PROBE_EVERY = 8        # iterations a row may sit at K=0 before it drafts one token to re-measure, ...
PROBE_BACKOFF = 3      # ... doubled by each probe since it last drafted otherwise, up to 2^this times


class PerRequestPolicy(AdaptivePolicy):
    """Each row's K from its own shrunk rates, jointly with the batch's cost (runtime/policy/per_row.py:
    SplitCost prices V verify tokens and the deepest chain m; allocate picks the K vector with the
    most expected tokens per predicted ms, a vector of different K_i at the ragged calibration
    slot's price: SplitCost.ragged), or one K >= 1 for every row where that is within the
    settings' margin of it and above plain decode (per_row.uniform_allocation at the uniform
    steps' calibrated prices: the decode graphs instead of the whole-forward ones), always where
    the engine pads rows (RowInputs.packed False) or b = 1. Keeps the adaptive policy's pooled
    estimate (the rows' prior, `prior_weight` pseudo-trials) and cost model; each row's rates are
    the upper confidence bound of its Beta posterior, `optimism` standard deviations above its mean
    (RowTable.optimistic): a new row drafts where the batch can afford the trial, and a few of its
    own trials take it to its rate (a 0.95 row to the oracle's K, a 0.05 row to K=0, within 8
    steps at b = 64: tests/test_per_request_rule.py). `cap` (a DraftSchedule) bounds every K_i by
    the schedule's K at b.
    Guarantees: never predicted to lose to plain decode, K_i <= min(cap(b), the token budget's
    cap), a row at K=0 for its probe interval (probe_interval: PROBE_EVERY iterations, doubled by
    each probe since it last drafted otherwise) drafts one token: in a step that drafts anyway
    (one more verify token each), or, when the whole batch has sat at K=0 for PROBE_EVERY
    iterations, all due rows in one step (the chain's cost at most once every PROBE_EVERY
    iterations, not in every step; where rows are padded, K=1 for every row); not where the cap
    at b is 0 (the schedule's K=0 tier) or the profile has no K=1."""

    def __init__(self, cost: CostModel, settings: AdaptiveSettings = AdaptiveSettings(),
                 max_draft_len: int | None = None, cap=None, prior_weight: float = PRIOR_WEIGHT,
                 optimism: float = OPTIMISM, ragged_factor: float = 1.0, floor: bool = True):
        super().__init__(cost, settings, max_draft_len)
        if not 0.5 <= ragged_factor <= 4.0:
            raise DynspecError(f"per-request policy: ragged_factor {ragged_factor} is outside 0.5..4")
        self.ragged_factor = float(ragged_factor)   # a per-row vector's excess over the split (step_prices.py)
        self.floor = bool(floor)                    # the batch-level decision as the floor (decide_rows)
        self.rated_floor = True                     # ... its gain no higher than on the rows' own rates
        if not prior_weight > 0 or not optimism >= 0:
            raise DynspecError(f"per-request policy: prior_weight {prior_weight} must be > 0 pseudo-trials and"
                               f" optimism {optimism} >= 0 standard deviations")
        self.cap, self.prior_weight, self.optimism = cap, float(prior_weight), float(optimism)
        self._splits: dict = {}

    @classmethod
    def from_cost(cls, cost: CostModel, max_draft_len: int | None = None, cap=None, ragged_factor: float = 1.0):
        """The registry's constructor (runtime/policy/__init__.py POLICIES)."""
        return cls(cost, max_draft_len=max_draft_len, cap=cap, ragged_factor=ragged_factor)

    def decide(self, x: StepInputs) -> StepDecision:
        """decide_rows on the step's rows, x itself the batch-level fallback's inputs."""
        return self.decide_rows(RowInputs(x.batch_size, x.context, x.acceptance, x.rates, x.idle, x.max_k, x.keep_warm,
                                          x.since_spec, x.cost_scale, x.row_probes, x.packed, x))

    def row_rates(self, table: RowTable, slots: Sequence[int], pool: Sequence[float], keys: Sequence[int],
                  truth: Truth | None) -> np.ndarray:
        """[b, P] each row's upper confidence rates (RowTable.optimistic); keys and truth unread."""
        return table.optimistic(slots, pool, self.prior_weight, self.optimism)

    def choices(self, batch_size: int) -> tuple[int, ...]:
        """Any candidate up to the cap at b (a uniform vector runs the pure-decode graphs)."""
        top = self._cap(batch_size, self.max_draft_len)
        return tuple(k for k in self.candidates if k <= top)

    def _cap(self, b: int, max_k: int) -> int:
        return min(max_k, self.max_draft_len, self.cap.draft_len(b) if self.cap is not None else max_k)

    def decide_rows(self, x: RowInputs) -> StepDecision:
        """The per-row decision (_per_row) where it runs rows at different K and beats the batch-level
        adaptive decision (AdaptivePolicy.choose on x.batch, capped alike) by the settings' margin;
        otherwise that decision for every row, so rows of one rate run exactly as adaptive runs them.
        The batch-level gain counts no higher than that K gains on the rows' own rates,
        sum_i E_i(K) / t(K): the pool is measured on the rows that drafted, so after a vector that
        drafts only the 0.95 rows of a 0.95 / 0.05 mix it reads 0.95, and K=3 for every row would
        look 1.46x where it is 1.18x. Rows of one rate (their optimistic rates at or above the
        pool) keep the batch-level gain, so they run as adaptive runs them.
        Example: gains 1.30 per-row against 1.25 batch-level (margin 2%: 1.275) -> the vector; 1.27 ->
        the batch-level K for every row."""
        d, uniform_gain = self._per_row(x)
        if x.batch is None or not self.floor:
            return d
        b = x.batch_size
        batch = self.choose(replace(x.batch, max_k=min(x.batch.max_k, self._cap(b, x.max_k))))
        probed = set(d.probes)
        floor = batch.gain
        if batch.k and floor is not None and self.rated_floor:   # no higher than on the rows' own rates
            floor = min(floor, uniform_gain(batch.k) or 0.0)
        if len({0 if i in probed else k for i, k in enumerate(d.ks)}) > 1 and d.gain is not None \
                and floor is not None and d.gain >= floor * (1 + self.settings.margin):
            return d
        return StepDecision((batch.k,) * b, keep_warm=batch.keep_warm, predicted_ms=batch.predicted_ms, gain=batch.gain,
                            probes=tuple(range(b)) if batch.probe else (), reason="batch " + batch.reason,
                            policy=LABEL)

    def _weight(self, a: Allocation, x: StepInputs | None) -> float:
        """gain_w / gain of allocation a: the prompts the step ends weighed as adaptive weighs them
        (prefill_price.py), so the floor compares like with like: (T + w f(V)) / T x b / (b + w f(b)),
        T a's expected tokens, f(n) the prompts that end beside n verify tokens."""
        w = self.settings.ttft_weight
        if x is None or not w or not x.waiting or not a.expected_tokens > 0:
            return 1.0
        b, left = x.batch_size, x.token_budget - x.batch_size
        return prompt_weight(a.expected_tokens, b, finishing(x.waiting, left - sum(a.ks)), finishing(x.waiting, left), w)

    def _per_row(self, x: RowInputs) -> tuple[StepDecision, Callable[[int], "float | None"]]:
        """(the per-row decision, K -> the gain of K for every row on the rows' rates and the uniform
        steps' price, prompt-weighed like the decision; None where plain decode is not profiled)."""
        b = x.batch_size
        cap = self._cap(b, x.max_k)
        context = round(x.context / CONTEXT_STEP) * CONTEXT_STEP
        raw = self._split(b, context)
        side = self.prompt_side(x.batch, context) if x.batch is not None and self.cost.chunk is not None else None
        extra = side.extra_ms if side is not None else ()   # a riding chunk's price by depth (its wait: the floor's)
        cost = raw.calibrated(x.cost_scale).plus(extra)  # uniform vectors: the decode graphs, each depth
        if cap == 0:                                    # the schedule's K=0 tier: as the schedule runs it
            warm = x.keep_warm
            return StepDecision((0,) * b, keep_warm=warm, gain=1.0, reason="cap", predicted_ms=_k0_ms(raw, b, warm),
                                policy=LABEL), lambda k: None
        # probes take K=1: none where the profile has no K=1 (a probe's cost would be unknown); no
        # row is due before PROBE_EVERY idle iterations (the shortest interval)
        due = tuple(i for i, (n, t) in enumerate(zip(x.idle, probe_interval(x.probes, b))) if n >= t) \
            if math.isfinite(cost.chain_ms[1]) and max(x.idle, default=0) >= PROBE_EVERY else ()
        rates, budget = x.rates[:, :cap], b * (cap + 1)
        u = uniform_allocation(rates, cost, cap, budget)
        if u is not None and u.tokens_per_ms <= b / _k0_ms(cost, b, False):
            u = None                                    # one K for every row, only above K=0
        probing = due if x.since_spec >= PROBE_EVERY else ()   # the whole batch sat at K=0 that long
        if x.packed and b > 1:
            a = self._packed(x.cost_scale, raw, cost, rates, cap, budget, due, probing, u, extra)
        else:                                           # (one row: every vector is uniform)
            a = _padded(rates, cost, u, probing)
        plain = b / cost.decode_ms if cost.decode_ms else None
        warm = x.keep_warm and a.reason != "plain decode"
        # the profile's time of the chosen option, unscaled (what the calibration compares with)
        profiled = raw.step_ms(a.verify_tokens, a.depth) if any(a.ks) else _k0_ms(raw, b, warm)
        d = StepDecision(a.ks, keep_warm=warm and not any(a.ks), predicted_ms=profiled,
                         gain=a.tokens_per_ms / plain * self._weight(a, x.batch) if plain else None,
                         probes=a.probed, reason=a.reason, policy=LABEL)

        def uniform_gain(k: int) -> float | None:
            if not plain or not 0 < k <= cap or not math.isfinite(cost.chain_ms[k]):
                return None if not plain else 0.0
            e = float(b + np.cumprod(rates[:, :k], axis=1).sum())
            ms = cost.step_ms(b * (k + 1), k)
            return e / ms / plain * self._weight(Allocation((k,) * b, e, ms, e / ms, "uniform"), x.batch)
        return d, uniform_gain

    def _packed(self, scales, raw: SplitCost, cost: SplitCost, rates: np.ndarray, cap: int, budget: int,
                due: tuple[int, ...], probing: tuple[int, ...], u: Allocation | None, extra=()) -> Allocation:
        """The K vector where the engine verifies each row's K_i + 1 tokens packed: allocate over
        every vector at the ragged price (SplitCost.ragged); a per-row answer stands only where
        it beats one K >= 1 for every row (u, at the uniform steps' own prices) by the settings'
        margin; a uniform or all-zero answer gives way to u, else to plain decode (with the due
        rows' probe). Due rows ride along a per-row step that drafts anyway."""
        ragged = raw.ragged(scales).scaled(self.ragged_factor).plus(extra)
        a = allocate(rates, ragged, cap, budget, cost.decode_ms, probing)
        probed = set(a.probed)
        base = {0 if i in probed else k for i, k in enumerate(a.ks)}     # the K's before probes
        if len(base) > 1:                               # a per-row vector
            if u is not None and u.tokens_per_ms * (1 + self.settings.margin) >= a.tokens_per_ms:
                return u
            if not a.probed and any(a.ks[i] == 0 for i in due):     # the step drafts anyway:
                a = allocate(rates, ragged, cap, budget, cost.decode_ms, due)   # the due rows ride along
            return a
        if u is not None:                               # one K for every row, at its own price
            return u
        if base == {0}:                                 # plain decode, or the due rows' probe
            return a
        # one K >= 1 for every row beat plain decode only at the ragged price: plain decode
        ks = tuple(1 if i in probing else 0 for i in range(len(a.ks)))
        return _zero(rates, cost, ks, ragged.step_ms(len(ks) + len(probing), 1), probing)

    def _split(self, b: int, context: int) -> SplitCost:
        hit = self._splits.get((b, context))
        if hit is None:
            if len(self._splits) >= 65536:
                self._splits.clear()
            hit = self._splits[(b, context)] = SplitCost.at(self.cost, b, context)
        return hit

    def __str__(self) -> str:
        ctx = ",".join(str(c) for c in self.cost.context_lens)
        return (f"per-request (K_i in {list(self.candidates)}, cost model of {self.cost.device} at context {ctx}, "
                f"prior {self.prior_weight:g} trials, optimism {self.optimism:g} sd)")


def probe_interval(probes: Sequence[int], b: int) -> list[int]:
    """[b] iterations each row sits at K=0 before its next probe: PROBE_EVERY doubled by each of
    its probes since it last drafted other than as a probe, at most PROBE_BACKOFF times.
    probes (0, 1, 5) -> (8, 16, 64): a row whose probes keep failing costs a chain pass ever more rarely,
    one that a bad first draft sent to K=0 is measured again within PROBE_EVERY iterations."""
    return [PROBE_EVERY << min(int(p), PROBE_BACKOFF) for p in probes] if len(probes) else [PROBE_EVERY] * b


def _padded(rates: np.ndarray, cost: SplitCost, u: Allocation | None, due: tuple[int, ...]) -> Allocation:
    """Where the engine pads every row to max K_i (plan.row_k only caps acceptance), a row below
    the max pays for tokens it cannot accept: one K for every row (u), else plain decode, whose
    probe is K=1 for every row (all of them probed: their backoff moves together)."""
    b = rates.shape[0]
    if u is not None:
        return u
    return _zero(rates, cost, (1,) * b if due else (0,) * b, cost.step_ms(2 * b, 1), tuple(range(b)) if due else ())


def _zero(rates: np.ndarray, cost: SplitCost, ks: tuple[int, ...], probe_ms: float, probed: tuple[int, ...]) -> Allocation:
    """Plain decode (the K=0 step where the profile has no decode_ms), or, with `probed` rows,
    those K=1 rows (ks) at probe_ms."""
    b = rates.shape[0]
    if probed:
        tokens = b + float(sum(rates[i, 0] for i, k in enumerate(ks) if k))
        return Allocation(ks, tokens, probe_ms, tokens / probe_ms, "probe", probed)
    ms = _k0_ms(cost, b, False)
    return Allocation((0,) * b, float(b), ms, b / ms, "plain decode" if cost.decode_ms is not None else "best")


def _k0_ms(raw: SplitCost, b: int, keep_warm: bool) -> float:
    """The profile's time of an all-K=0 step at b: with keep-warm the uniform K=0 step, else plain
    decode (the keep-warm time where the profile has no decode_ms)."""
    return raw.step_ms(b, 0) if keep_warm or raw.decode_ms is None else raw.decode_ms
