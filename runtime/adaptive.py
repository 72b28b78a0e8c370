"""The adaptive draft-length policy: K from the batch size, the context, the measured acceptance
and a profiled cost model (docs/design.md, "The adaptive policy").

For each candidate K (profiled, within the engine's max_draft_len and the token budget):
    E(K)     = 1 + sum_{i<=K} prod_{j<=i} a_j                 tokens a row gains per step
    gain(K)  = E(K) * ms(b, 0, ctx) / ms(b, K, ctx)           predicted speedup over plain decode
    score(K) = gain(K) / draft_margin^K                       each draft must pay for itself
Then, in order:
    1. best = argmax score                          (b above the profiled batch sizes: K=0)
    2. hold: keep the previous K while score(best) <= score(previous) * (1 + margin)
    3. probe: if the choice is K=0, take K=1 once every `interval` iterations without speculation,
       interval = max(min_probe_interval, ceil((1 - gain(1)) / probe_loss)): by the cost model a
       probe costs at most probe_loss of the throughput, and it measures a_1 afresh, so a policy at
       K=0 comes back when the draft starts matching again.

Worked example: b=16, ctx 1024, a = (0.5, 0.5, ...), ms(16, K) = 10, 11, 12, 13 for K = 0..3:
    E = 1, 1.5, 1.75, 1.875   gain = 1, 1.364, 1.458, 1.442
    score (margin 1.01) = 1, 1.350, 1.430, 1.400  -> best K=2; from previous K=3 it moves
    (1.430 > 1.400 * 1.02 = 1.428); from previous K=1 too. With a = 0.15 instead:
    gain = 1, 1.045, 0.977, 0.905 -> K=1 (score 1.035 > 1 x 1.02).
Pure: the state (estimate, previous K, iterations since speculation) lives in the executor and
comes in through PolicyInputs, so the same inputs give the same K on every TP rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.acceptance_estimate import HALF_LIFE_ROWS, AcceptanceEstimate
from dynspec.runtime.cost_model import CostModel


@dataclass(frozen=True)
class AdaptiveSettings:
    margin: float = 0.02             # hysteresis: a new K must score this much above the previous one
    draft_margin: float = 1.01       # per draft position, as `dynspec tune --draft-margin`
    probe_loss: float = 0.005        # at most this share of throughput goes to probing (cost model)
    min_probe_interval: int = 8
    max_probe_interval: int = 4096
    half_life: float = HALF_LIFE_ROWS   # the estimate's memory, in rows drafted at position 1
    prior: float | None = None       # a_1 before any data; None: the profile's measured a_1, else 0.5

    def __post_init__(self) -> None:
        if self.margin < 0 or self.draft_margin < 1 or not 0 < self.probe_loss < 1:
            raise DynspecError(f"adaptive settings: margin {self.margin} must be >= 0, draft_margin "
                               f"{self.draft_margin} >= 1 and probe_loss {self.probe_loss} in (0, 1)")
        if not 1 <= self.min_probe_interval <= self.max_probe_interval:
            raise DynspecError(f"adaptive settings: probe intervals {self.min_probe_interval}.."
                               f"{self.max_probe_interval} must satisfy 1 <= min <= max")


@dataclass(frozen=True)
class PolicyInputs:
    batch_size: int                  # b decode rows
    context: float                   # mean KV length of the decode rows
    acceptance: tuple[float, ...]    # a_1, a_2, ... (AcceptanceEstimate.rates)
    previous_k: int = 0              # K of the last iteration with decode rows
    since_spec: int = 0              # iterations with rows since the last one at K > 0
    max_k: int = 32                  # the largest K the engine and this iteration's token budget allow


@dataclass(frozen=True)
class Decision:
    k: int
    best_k: int                      # the argmax before hold / probe
    gain: float | None               # predicted gain(k) over plain decode; None: not predicted
    reason: str                      # "best" | "hold" | "probe" | "unprofiled batch"
    extrapolated: bool = False       # a cost lookup left the profiled range

    @property
    def probe(self) -> bool:
        return self.reason == "probe"


def expected_tokens(k: int, acceptance: float | Sequence[float]) -> float:
    """E[tokens per row per step | K drafts] under one rate or per-position conditional rates
    (the policy's and `dynspec tune`'s): 1 + sum_{i<=K} prod_{j<=i} a_j.
    expected_tokens(3, 0.7) = 1 + 0.7 + 0.49 + 0.343 = 2.533."""
    if k < 0:
        raise DynspecError(f"negative draft length K={k}")
    if isinstance(acceptance, (int, float)):
        a = float(acceptance)
        if not 0.0 <= a <= 1.0:
            raise DynspecError(f"acceptance rate {a} is outside [0, 1]")
        return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
    rates = [float(x) for x in acceptance]
    if k > len(rates):
        raise DynspecError(f"K={k} needs {k} per-position acceptance rates; {len(rates)} given")
    e, run = 1.0, 1.0
    for i, a in enumerate(rates[:k]):
        if not 0.0 <= a <= 1.0:
            raise DynspecError(f"per-position acceptance rate {i + 1} = {a} is outside [0, 1]")
        run *= a
        e += run
    return e


def choose_k(x: PolicyInputs, cost: CostModel, candidates: Sequence[int], s: AdaptiveSettings) -> Decision:
    """The pure rule of the module docstring."""
    decision, probe = _hold(x, cost, candidates, s)
    return _probed(decision, probe, x.since_spec)


def _hold(x: PolicyInputs, cost: CostModel, candidates: Sequence[int],
          s: AdaptiveSettings) -> tuple[Decision, tuple[int, float] | None]:
    """Steps 1 and 2 (all of choose_k but since_spec), and the probe's (interval, gain(1)) if K=1 may probe."""
    b = x.batch_size
    ks = [k for k in candidates if k <= x.max_k]
    if b > cost.batch_sizes[-1] or len(ks) < 2:
        return Decision(0, 0, None, "unprofiled batch" if b > cost.batch_sizes[-1] else "best"), None
    row, extrapolated = cost.row(b, x.context)                  # ms for each of cost.draft_lens
    ms = dict(zip(cost.draft_lens, row))
    gains = {k: expected_tokens(k, x.acceptance) * ms[0] / ms[k] if k else 1.0 for k in ks}
    score = {k: g / s.draft_margin ** k for k, g in gains.items()}
    best = max(score, key=lambda k: (score[k], -k))
    k, reason = best, "best"
    prev = x.previous_k
    if prev != best and prev in score and score[best] <= score[prev] * (1 + s.margin):
        k, reason = prev, "hold"
    probe = None
    if k == 0 and 1 in gains:
        loss = max(0.0, 1.0 - gains[1])
        probe = (min(s.max_probe_interval, max(s.min_probe_interval, math.ceil(loss / s.probe_loss))), gains[1])
    return Decision(k, best, gains[k], reason, extrapolated), probe


def _probed(d: Decision, probe: tuple[int, float] | None, since_spec: int) -> Decision:
    """Step 3: K=1 once `interval` iterations have passed without speculation."""
    if probe is not None and since_spec >= probe[0]:
        return Decision(1, d.best_k, probe[1], "probe", d.extrapolated)
    return d


CONTEXT_STEP = 16          # AdaptivePolicy.decide rounds the context to this many tokens
RATE_STEP = 0.005          # and each acceptance rate to this


class AdaptivePolicy:
    """choose_k bound to one cost model, candidate set and settings (immutable)."""

    def __init__(self, cost: CostModel, settings: AdaptiveSettings = AdaptiveSettings(),
                 max_draft_len: int | None = None):
        ks = tuple(k for k in cost.draft_lens if max_draft_len is None or k <= max_draft_len)
        if 0 not in ks or len(ks) < 2:
            raise DynspecError(f"cost model profiles K = {list(cost.draft_lens)}; the adaptive policy needs K=0 and "
                               f"at least one K in 1..{max_draft_len if max_draft_len is not None else 'max'}")
        self.cost, self.settings, self.candidates = cost, settings, ks
        self._memo: dict = {}

    @property
    def max_draft_len(self) -> int:
        return self.candidates[-1]

    def initial_estimate(self) -> AcceptanceEstimate:
        prior = self.settings.prior
        if prior is None:
            prior = self.cost.per_position[0] if self.cost.per_position else 0.5
        return AcceptanceEstimate(prior=prior, positions=max(self.max_draft_len, 1), half_life=self.settings.half_life)

    def decide(self, inputs: PolicyInputs) -> Decision:
        """choose_k on the inputs rounded (context to CONTEXT_STEP tokens, rates to RATE_STEP), memoized:
        in steady decoding b, the rounded context and the rounded estimate repeat for many iterations,
        so most iterations cost one dict lookup. The rounding moves a score by well under 1%."""
        ctx = round(inputs.context / CONTEXT_STEP) * CONTEXT_STEP
        acc = tuple(round(a / RATE_STEP) for a in inputs.acceptance)
        key = (inputs.batch_size, ctx, acc, inputs.previous_k, inputs.max_k)
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= 65536:
                self._memo.clear()
            x = PolicyInputs(inputs.batch_size, ctx, tuple(a * RATE_STEP for a in acc), inputs.previous_k, 0,
                             inputs.max_k)
            hit = self._memo[key] = _hold(x, self.cost, self.candidates, self.settings)
        return _probed(*hit, inputs.since_spec)

    def __str__(self) -> str:
        ctx = ",".join(str(c) for c in self.cost.context_lens)
        return f"adaptive (K in {list(self.candidates)}, cost model of {self.cost.device} at context {ctx})"


def load_policy(cost_model_path, max_draft_len: int | None = None,
                settings: AdaptiveSettings = AdaptiveSettings()) -> AdaptivePolicy:
    """ENGINE_DIR/cost_model.json (a profile.json) -> the adaptive policy."""
    return AdaptivePolicy(CostModel.load(cost_model_path), settings, max_draft_len)
