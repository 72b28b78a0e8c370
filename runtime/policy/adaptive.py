"""The adaptive draft-length policy: K from the batch size, the context, the measured acceptance
and a profiled cost model (docs/design.md, "The adaptive policy").

For each candidate K (profiled, within the engine's max_draft_len and the token budget), at the
padded row count B the step's graphs run at (the bucket of b) and the rows' mean context:
    E(K)     = 1 + sum_{i<=K} prod_{j<=i} a_j                 tokens a row gains per step
    t(K)     = ms(B, K, ctx) x s_K                            profiled time x served/profiled ratio
    t(0)     = plain decode (the profile's decode_ms: no keep-warm), else K=0 with keep-warm
    gain(K)  = E(K) * t(0) / t(K)                             predicted speedup over plain decode
    score(K) = gain(K) / draft_margin^K                       each draft must pay for itself
Then, in order:
    1. best = argmax score                          (b above the profiled batch sizes: K=0)
    2. hold: keep the previous K while score(best) <= score(previous) * (1 + margin), except a
       K > 0 against best = 0: speculation predicted to lose to plain decode is never held, so
       the band between K=1 and K=0 is score(1) in [1, 1 + margin], above break-even
    3. explore: while plain decode's served cost is unmeasured (fewer than `explore_steps`
       plain-decode steps calibrated) and the best K predicts less than `explore_band` over it, run
       plain decode: its slot otherwise takes the pooled ratio, i.e. the K > 0 slots' own, and a
       served K=1 that runs further above its profile than plain decode (6% against 3% at b=16 on
       the H200) stays predicted a win at a rate where it loses. A few steps at break-even cost
       nothing; afterwards the comparison is between two measured prices, and the hold band keeps
       K=0 unless K > 0 beats it by the margin.
    4. probe: if the choice is K=0, take K=1 once every `interval` iterations without speculation,
       interval = max(min_probe_interval, ceil((1 - gain(1)) / probe_loss)) x 2^min(n, probe_backoff),
       n the probes run since the last speculative step that was not one: by the cost model the
       first probe costs at most probe_loss of the throughput, each that confirms K=0 halves the
       rate of the next (down to 2^-probe_backoff), and every one measures a_1 afresh, so a policy
       at K=0 comes back when the draft starts matching again. After plain decode the probe rebuilds
       the draft heads: its gain(1) there is scaled by the cold slot's ratio (s_cold), not s_1.
       Example, b=16 at a = 0.15 on the H200 (a cold probe 6.3 ms, plain decode 5.2 ms: gain
       1.15 x 5.2 / 6.3 = 0.949, loss 0.051): probes 11, 22, 44, then 88 iterations apart, ~0.06%
       of the throughput where the fixed interval of 11 spent 0.46%.
    5. keep-warm at K=0 (when the engine keeps the draft warm at all): only while K=0 is held
       against a better K (best > 0), where speculation resumes as soon as the margin is passed.
       When K=0 is the best choice, it runs as plain decode and pays no draft work (up to 13% of
       a b=256 step); a later speculative step (a probe too) rebuilds the draft head, and the
       draft's cache has a gap over the plain-decode stretch: lossless (the target verifies), but
       those rows may be accepted less, which the estimate measures. Rows admitted later have
       their whole prompt in the draft's cache.
    6. lazy draft sync (runtime/policy/catch_up_price.py): a K > 0 step pays the catch-up it runs
       first, c(n) = fixed + per entry x n / horizon over the rows' n entries behind (the entries'
       part is shared by the drafting steps it buys). A K=0 step from a drafting state that carries
       a chunk pays c(n + chunk) in t(0) where the next step, with no prompt and that catch-up to
       pay, drafts (else the pause starts a stretch and pays nothing now). Example, b = 16 at
       a = 0.3 beside a 128-token prompt the step ends (w = 64), c = 1.0 ms: t(0) = 7.68, t(1) =
       8.18 with the chunk's draft pass, gain_w(1) = 1.06 x 7.68 / 8.18 = 0.996, plain decode
       unpriced; the next step would draft (1.3 x 6.4 / (6.5 + 1.0) = 1.11), so t(0) = 8.68,
       gain_w(1) = 1.125 and K=1 holds (tests/test_catch_up_price.py).
s_K (runtime/policy/cost_calibration.py) is 1 until served steps are measured; a speculative step whose
rows' draft heads are stale (after plain decode) calibrates its own slot, s_cold.

Worked example, b=16, ctx 1024, a = (0.5, 0.5, ...), t(16, K) = 10, 11, 12, 13 for K = 0..3:
    E = 1, 1.5, 1.75, 1.875   gain = 1, 1.364, 1.458, 1.442
    score (margin 1.01) = 1, 1.350, 1.430, 1.400  -> best K=2; from previous K=3 it moves
    (1.430 > 1.400 * 1.02 = 1.428); from previous K=1 too. With a = 0.15 instead:
    gain = 1, 1.045, 0.977, 0.905 -> K=1 (score 1.035 > 1 x 1.02), but while fewer than 4
    plain-decode steps are calibrated, 1.045 < 1 + 0.05: plain decode first (explore).
Pure: the state (estimate, step-cost ratios, previous K, iterations since speculation) lives in
the executor and comes in through PolicyInputs; the executor runs on a replica's leader only,
which sends its plan to the other TP ranks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.policy.acceptance_estimate import HALF_LIFE_ROWS, AcceptanceEstimate
from dynspec.runtime.policy.cost_calibration import COLD, KEEP_WARM, CostCalibration
from dynspec.runtime.policy.cost_model import CostModel
from dynspec.runtime.policy.catch_up_price import CatchUpPrice
from dynspec.runtime.policy.prefill_price import PromptSide, chunk_tokens, prompt_side
from dynspec.runtime.policy.step_decision import StepDecision, StepInputs


TTFT_WEIGHT = 128.0   # the default prompt weight (prefill_price.py; chosen on the simulator: docs/design.md)


@dataclass(frozen=True)
class AdaptiveSettings:
    margin: float = 0.02             # hysteresis: a new K must score this much above the previous one
    draft_margin: float = 1.01       # per draft position, as `dynspec tune --draft-margin`
    probe_loss: float = 0.005        # at most this share of throughput goes to the first probe (cost model)
    min_probe_interval: int = 8
    max_probe_interval: int = 4096
    probe_backoff: int = 3           # each probe that leaves K at 0 doubles the next interval, up to 2^this
    explore_band: float = 0.05       # explore plain decode while the best K predicts less than this over it
    explore_steps: float = 4.0       # ... and fewer plain-decode steps than this are calibrated
    calibrate: bool = True           # scale profiled times by served/profiled ratios (False: the profile alone)
    half_life: float = HALF_LIFE_ROWS   # the estimate's memory, in rows drafted at position 1
    prior: float | None = None       # a_1 before any data; None: the profile's measured a_1, else 0.5
    ttft_weight: float = TTFT_WEIGHT  # a prompt whose prefill the step ends weighs this many decode rows
                                     # that gain one token at any K (prefill_price.py; 0: throughput alone)
    price_catch_up: bool = True     # lazy draft sync: a drafting step pays its catch-up, and a K=0 step
                                     # that a resumption follows pays the next one (step 6)
    catch_up_horizon: float = 8.0    # ... its entries' part shared by this many drafting steps

    def __post_init__(self) -> None:
        if self.margin < 0 or self.draft_margin < 1 or not 0 < self.probe_loss < 1:
            raise DynspecError(f"adaptive settings: margin {self.margin} must be >= 0, draft_margin "
                               f"{self.draft_margin} >= 1 and probe_loss {self.probe_loss} in (0, 1)")
        if not 1 <= self.min_probe_interval <= self.max_probe_interval:
            raise DynspecError(f"adaptive settings: probe intervals {self.min_probe_interval}.."
                               f"{self.max_probe_interval} must satisfy 1 <= min <= max")
        if not 0 <= self.probe_backoff <= 16:
            raise DynspecError(f"adaptive settings: probe_backoff {self.probe_backoff} must be in 0..16")
        if not self.ttft_weight >= 0 or not math.isfinite(self.ttft_weight):
            raise DynspecError(f"adaptive settings: ttft_weight {self.ttft_weight} must be a finite number >= 0")
        if not self.catch_up_horizon >= 1 or not math.isfinite(self.catch_up_horizon):
            raise DynspecError(f"adaptive settings: catch_up_horizon {self.catch_up_horizon} must be a finite number >= 1")
        if self.explore_band < 0 or self.explore_steps < 0:
            raise DynspecError(f"adaptive settings: explore_band {self.explore_band} and explore_steps "
                               f"{self.explore_steps} must be >= 0")


PolicyInputs = StepInputs   # the rule reads its first eleven fields (runtime/policy/step_decision.py)


@dataclass(frozen=True)
class Decision:
    k: int
    best_k: int                      # the argmax before hold / probe
    gain: float | None               # predicted gain(k) over plain decode; None: not predicted
    reason: str                      # "best" | "hold" | "probe" | "explore" | "unprofiled batch"
    extrapolated: bool = False       # a cost lookup left the profiled range
    keep_warm: bool = True           # K=0: extend the draft's cache over the new token
    predicted_ms: float | None = None   # the profile's time of (k, keep_warm) at this step, unscaled

    @property
    def probe(self) -> bool:
        return self.reason == "probe"


CostRow = tuple    # (ms by K: [max profiled K + 1], None where K was not profiled; plain-decode ms or None; extrapolated)


def choose_k(x: PolicyInputs, cost: CostModel, candidates: Sequence[int], s: AdaptiveSettings) -> Decision:
    """The pure rule of the module docstring."""
    return _choose(x, _cost_row(cost, x, x.context, lambda b, c: _by_k(cost, cost.row(b, c))), candidates, s,
                   catch_up=_catch_up(cost, x, s))


def _catch_up(cost: CostModel, x: PolicyInputs, s: AdaptiveSettings) -> CatchUpPrice | None:
    """The catch-up price the step's decision reads (step 6): the profile's, under lazy sync."""
    return cost.catch_up if s.price_catch_up and x.lazy else None


def _by_k(cost: CostModel, row) -> CostRow:
    """CostModel.row (ms in draft_lens order) -> CostRow (ms indexed by K).
    draft_lens (0, 1, 3), ms (5, 6, 8) -> ms by K (5, 6, None, 8)."""
    ms_k, cold, extrapolated = row
    by_k = [None] * (cost.draft_lens[-1] + 1)
    for k, ms in zip(cost.draft_lens, ms_k):
        by_k[k] = ms
    return tuple(by_k), cold, extrapolated


def _cost_row(cost: CostModel, x: PolicyInputs, context: float, row) -> "CostRow | None":
    """row(bucket, context) (a CostRow, or a cache of them); None above the profiled batch sizes."""
    return None if x.batch_size > cost.batch_sizes[-1] else row(x.bucket or x.batch_size, context)


def _choose(x: PolicyInputs, row: CostRow | None, candidates: Sequence[int], s: AdaptiveSettings,
            side: PromptSide | None = None, catch_up: CatchUpPrice | None = None) -> Decision:
    """choose_k on a cost row already looked up (None: b above the profiled batch sizes), with the
    step's prompt side (prefill_price.py: the chunk's extra ms by K, the prompts it ends, weighed by
    s.ttft_weight; None: no prompt waits) and lazy sync's catch-up price (step 6; None: unpriced).
    One pass over K ascending builds E(K), gain and score (the policy runs every iteration: no containers)."""
    ks = candidates if candidates[-1] <= x.max_k else [k for k in candidates if k <= x.max_k]
    if row is None or len(ks) < 2:
        return Decision(0, 0, None, "unprofiled batch" if row is None else "best", keep_warm=False)
    ms, decode, extrapolated = row
    scale = x.cost_scale                                   # [K = 0..max_k, keep-warm K=0, cold, ragged]
    plain = decode if decode is not None else ms[0]        # no decode_ms: the keep-warm time, an upper bound
    add = side.extra_ms if side is not None else None      # [K] the chunk's extra ms
    base = (plain * scale[0] if scale else plain) + (add[0] if add else 0.0)
    w, b = s.ttft_weight, x.batch_size
    resume = catch_up.ms(x.behind, s.catch_up_horizon) if catch_up is not None else 0.0   # a drafting step's catch-up
    if catch_up is not None and side is not None and x.previous_k > 0:
        base += _exit_ms(x, row, candidates, s, catch_up)
    acc, prev, dm = x.acceptance, x.previous_k, s.draft_margin
    if len(acc) < ks[-1]:
        raise DynspecError(f"K={ks[-1]} needs {ks[-1]} per-position acceptance rates; {len(acc)} given")
    best, best_score, best_gain = 0, 1.0, 1.0
    prev_score = prev_gain = gain1 = None
    if prev == 0:
        prev_score = 1.0
    e = run = pen = 1.0
    for j in range(1, ks[-1] + 1):
        run *= acc[j - 1]
        e += run
        pen *= dm
        t = ms[j]
        if t is None or j not in ks:
            continue
        tj = (t * scale[j] if scale else t) + (add[j] if add else 0.0)     # the step at K = j, its catch-up aside
        wj = side.weight(j, b, e, w) if side is not None else 1.0
        gain = e * base / (tj + resume) * wj
        score = gain / pen
        if score > best_score:                            # ties go to the smaller K
            best, best_score, best_gain = j, score, gain
        if j == prev:
            prev_score, prev_gain = score, gain
        if j == 1:
            gain1 = gain
            if catch_up is not None and x.behind:           # a probe under lazy sync (step 4)
                gain1 = _probe_gain(x, e, base, tj, catch_up, wj)
    k, gain, reason = best, best_gain, "best"
    # hold the previous K within the margin, but never a speculative K against plain decode
    if prev != best and prev_score is not None and best_score <= prev_score * (1 + s.margin) and (best or not prev):
        k, gain, reason = prev, prev_gain if prev else 1.0, "hold"
    warm = x.keep_warm and (decode is None or best > 0)     # K=0 now (and in the stretch) keeps the draft warm
    if (k or warm) and decode is not None and x.plain_steps < s.explore_steps and best_gain < 1 + s.explore_band:
        return Decision(0, best, 1.0, "explore", extrapolated, keep_warm=False, predicted_ms=plain)
    if k == 0 and gain1 is not None:
        if scale and not warm:                             # the probe rebuilds stale draft heads: its own slot
            gain1 = gain1 * scale[1] / scale[COLD]
        loss = 1.0 - gain1 if gain1 < 1.0 else 0.0
        interval = max(s.min_probe_interval, math.ceil(loss / s.probe_loss)) << min(x.probes, s.probe_backoff)
        interval = min(s.max_probe_interval, interval)
        if x.since_spec >= interval:
            return Decision(1, best, gain1, "probe", extrapolated, predicted_ms=ms[1])
    if k:
        return Decision(k, best, gain, reason, extrapolated, predicted_ms=ms[k])
    a0 = add[0] if add else 0.0
    gain = base / (ms[0] * scale[KEEP_WARM] + a0) if warm and scale else base / (ms[0] + a0) if warm else 1.0
    return Decision(0, best, gain, reason, extrapolated, keep_warm=warm, predicted_ms=ms[0] if warm else plain)


def _probe_gain(x: PolicyInputs, e1: float, base: float, t1: float, catch_up: CatchUpPrice,
                weight: float) -> float:
    """gain(1) of a probe under lazy sync (step 4). A probe is one step: its catch-up is paid whole,
    not shared by later drafting steps, and only the rows it catches up in full draft (the entries
    fit what the budget leaves beside 2b verify tokens, first come first served; runtime/serving/
    draft_sync.py), so E(1) counts a share f = entries written / entries behind of the rows.
    Worked example, the H100's profile at b = 256 with every row 140 entries behind (a stored
    prompt), budget 8192, a = 0.55, t(1) = 17.35, plain 11.94, c(n) = 0.8 + 0.00045 n: 7680 of
    35840 entries fit, f = 0.214, gain = (1 + 0.55 x 0.214) x 11.94 / (17.35 + 4.26) = 0.62, where
    the amortized price gives 1.55 x 11.94 / (17.35 + 2.81) = 0.92; the probe interval grows from
    17 to 77 iterations (probe_loss 0.005)."""
    room = x.token_budget - 2 * x.batch_size if x.token_budget else x.behind
    entries = max(min(x.behind, room), 0)
    share = entries / x.behind
    return (1.0 + (e1 - 1.0) * share) * weight * base / (t1 + catch_up.ms(entries))


def _exit_ms(x: PolicyInputs, row: CostRow, candidates: Sequence[int], s: AdaptiveSettings,
             catch_up: CatchUpPrice) -> float:
    """What a K=0 step from a drafting state costs the next one (step 6): the catch-up of the rows'
    entries and of the chunk it stores, where the next step, with no prompt waiting and that catch-up
    to pay, drafts; else 0 (K=0 is not a pause but the start of a stretch)."""
    after = x.behind + chunk_tokens(x.waiting, x.token_budget, x.batch_size, 0)
    nxt = replace(x, previous_k=0, since_spec=1, waiting=(), token_budget=0, behind=after)
    return catch_up.ms(after, s.catch_up_horizon) if _choose(nxt, row, candidates, s, None, catch_up).k else 0.0


CONTEXT_STEP = 16          # AdaptivePolicy.decide looks costs up at the context rounded to this many tokens


class AdaptivePolicy:
    """choose_k bound to one cost model, candidate set and settings (immutable but for a cache of
    cost rows per (bucket, rounded context): the interpolation runs once per shape, not per step)."""

    def __init__(self, cost: CostModel, settings: AdaptiveSettings = AdaptiveSettings(),
                 max_draft_len: int | None = None):
        ks = tuple(k for k in cost.draft_lens if max_draft_len is None or k <= max_draft_len)
        if 0 not in ks or len(ks) < 2:
            raise DynspecError(f"cost model profiles K = {list(cost.draft_lens)}; the adaptive policy needs K=0 and "
                               f"at least one K in 1..{max_draft_len if max_draft_len is not None else 'max'}")
        self.cost, self.settings, self.candidates = cost, settings, ks
        self._rows: dict = {}

    # ---- Policy (runtime/policy/__init__.py) -------------------------------------------------------
    @property
    def max_draft_len(self) -> int:
        return self.candidates[-1]

    @property
    def drafts(self) -> bool:
        """Its candidates hold a K > 0 (the constructor asks for one)."""
        return self.candidates[-1] > 0

    @property
    def chooses_keep_warm(self) -> bool:
        """A K=0 step keeps the draft warm only while K=0 is held against a better K (step 5)."""
        return True

    @property
    def reads_prompts(self) -> bool:
        """The step's waiting prompts change its decision: the profile prices chunks, or they weigh."""
        return self.cost.chunk is not None or self.settings.ttft_weight > 0

    def choices(self, batch_size: int) -> tuple[int, ...]:
        """Any candidate at any batch size: K in (0, 1, 2) -> (0, 1, 2)."""
        return self.candidates

    def initial_estimate(self) -> AcceptanceEstimate:
        prior = self.settings.prior
        if prior is None:
            prior = self.cost.per_position[0] if self.cost.per_position else 0.5
        return AcceptanceEstimate(prior=prior, positions=max(self.max_draft_len, 1), half_life=self.settings.half_life)

    def initial_calibration(self) -> CostCalibration | None:
        return CostCalibration(max_k=self.max_draft_len) if self.settings.calibrate else None

    @classmethod
    def from_cost(cls, cost: CostModel, max_draft_len: int | None = None, cap=None, ragged_factor: float = 1.0):
        """The registry's constructor (runtime/policy/__init__.py POLICIES): one K for every row reads no cap."""
        return cls(cost, max_draft_len=max_draft_len)

    def decide(self, x: StepInputs) -> StepDecision:
        """choose's K for every row (every row probed on a probe step)."""
        d, b = self.choose(x), x.batch_size
        return StepDecision((d.k,) * b, d.keep_warm, d.predicted_ms, d.gain, tuple(range(b)) if d.probe else (),
                            d.reason, "adaptive")

    def choose(self, inputs: PolicyInputs) -> Decision:
        """choose_k with the cost row at the context rounded to CONTEXT_STEP tokens (a row moves
        by well under 1% over 16 tokens), looked up once per (bucket, rounded context)."""
        context = round(inputs.context / CONTEXT_STEP) * CONTEXT_STEP
        row = _cost_row(self.cost, inputs, context, self._row)
        return _choose(inputs, row, self.candidates, self.settings, self.prompt_side(inputs, context),
                       _catch_up(self.cost, inputs, self.settings))

    def prompt_side(self, x: StepInputs, context: float) -> PromptSide | None:
        """The step's prompt side (prefill_price.py) up to the largest candidate; None without waiting prompts."""
        if not x.waiting:
            return None
        return prompt_side(self.cost, x.waiting, x.token_budget, x.batch_size, x.bucket, context,
                           min(self.candidates[-1], x.max_k))

    def _row(self, b: int, context: int) -> "CostRow":
        hit = self._rows.get((b, context))
        if hit is None:
            if len(self._rows) >= 65536:
                self._rows.clear()
            hit = self._rows[(b, context)] = _by_k(self.cost, self.cost.row(b, context))
        return hit

    def __str__(self) -> str:
        ctx = ",".join(str(c) for c in self.cost.context_lens)
        return f"adaptive (K in {list(self.candidates)}, cost model of {self.cost.device} at context {ctx})"


def load_policy(cost_model_path, max_draft_len: int | None = None,
                settings: AdaptiveSettings = AdaptiveSettings()) -> AdaptivePolicy:
    """ENGINE_DIR/cost_model.json (a profile.json) -> the adaptive policy."""
    return AdaptivePolicy(CostModel.load(cost_model_path), settings, max_draft_len)
