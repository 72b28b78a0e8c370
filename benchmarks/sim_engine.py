"""The Engine protocol on a measured cost model: the serving simulator's engine
(benchmarks/simulate.py; docs/design.md, "The serving simulator").

It runs no model. A step's accepted drafts come from the acceptance model exactly as the reference
engine draws them (draft_uniforms of the request key and position for Bernoulli models, the recorded
run for trace replay), so a simulated request accepts what the same request accepts on the GPU. A
step's time comes from the cost model, priced as the GPU engine runs the plan, and moves a virtual
clock that the executor and the load generator read.

Step price (ms), b decode rows, B = bucket_for(b) (the captured graph's rows), c = mean row position,
T prompt-chunk tokens, base the profile's time of the step's decode rows:
    base      uniform K: CostModel(B, K, c) (K=0 without keep-warm: decode_ms(B, c)); per-row K_i in a
              step with a prompt chunk: SplitCost(B, c).ms(sum_i (K_i + 1) + (B - b), max K_i), without
              one CostModel(B, max K_i, c) (the CUDA engine's decode graph: plan.Engine
              packs_rows_alone); no rows: decode_ms(1, 0)
    price     base - host_ms                                    (the overlapped loop hides the host)
              + chunk_fixed_ms + chunk_ms_per_token x T         (a step with chunks: the whole-forward graph)
              + draft_chunk_ms_per_token x T                    (a drafting mode's draft pass over the chunk;
                                                                 none where lazy sync stores it: plan.store_chunks)
              + catch-up: fixed + per entry x entries           (lazy sync's catch-up, where the step has one;
                                                                 CostModel.catch_up: runtime/policy/catch_up_price.py)
              + (ragged_factor - 1) x base                      (rows at different K_i)
Where the profile has a chunk axis (`dynspec profile --chunk-lens`), a chunk's price is its extra
there instead (chunk_cost.py, at B, c, the step's K), the draft's pass over it included.
StepPrices (runtime/policy/step_prices.py) holds what the profile does not time, per device, fitted on
recorded GPU runs (benchmarks/sim_fit.py); without one a chunk token costs the plain-step curve's slope at B and
nothing else is added. Worked example, the H100 profile of benchmarks/sim_data (context 128): b = 13
at K = 0 without keep-warm runs the 16-row graph, base = decode_ms(16) = 6.58.

Overlapped (SimEngine(..., overlapped=True)): launch queues the step on a simulated device that runs
steps back to back and the clock stays; reading its result moves the clock to the step's end. So
the executor's OverlappedLoop plans i+1 while i runs, as on CUDA, and a prompt that arrives during
i rides in i+2 (docs/design.md, "The overlapped loop").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from dynspec.errors import DynspecError
from dynspec.runtime.engines.reference.mixed_layout import forward_tokens, mixed_buckets
from dynspec.runtime.policy.acceptance import AcceptanceModel, Greedy, TraceReplay, accept_lengths, draft_uniforms, rate_of
from dynspec.runtime.policy.catch_up_price import CatchUpPrice
from dynspec.runtime.policy.cost_model import CostModel
from dynspec.runtime.serving.plan import StepPlan, StepResult, batch_buckets, bucket_for, packs_vector
from dynspec.runtime.policy.split_cost import SplitCost
from dynspec.runtime.policy.step_prices import StepPrices


class SimClock:
    """Virtual seconds: the executor's and the load generator's clock; `sleep` moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, float(seconds))


# a step's fit features (sim_fit.py): steps, chunk tokens, steps with chunks, chunk tokens of drafting
# modes, base ms of per-row steps
FEATURES = ("steps", "chunk_tokens", "chunk_steps", "draft_chunk_tokens", "ragged_base_ms")


@dataclass(frozen=True)
class SimShape:
    """The GPU engine's sizes that shape its steps (engine.json / the sweep's engine)."""
    max_batch_size: int
    max_seq_len: int
    max_draft_len: int
    max_num_tokens: int = 8192
    packs_rows: bool = True          # the CUDA reference engine verifies each row's K_i + 1 tokens ...
    draft_sync_cap: int = 0          # lazy draft sync: the feature store's tokens a slot (0: none)
    packs_rows_alone: bool = False   # ... packs_rows only in a step with a prompt chunk (plan.Engine)


class SimEngine:
    """Engine protocol (runtime/serving/plan.py) on a cost model; see the module docstring."""

    vocab_size = 1 << 30             # the workload's token ids are never read

    def __init__(self, cost: CostModel, shape: SimShape, clock: SimClock, prices: StepPrices = StepPrices(),
                 catch_up: CatchUpPrice = CatchUpPrice(), overlapped: bool = False):
        if shape.max_draft_len > cost.draft_lens[-1]:
            raise DynspecError(f"simulator: max_draft_len {shape.max_draft_len} is above the cost model's profiled"
                               f" K {list(cost.draft_lens)}")
        self.cost, self.clock = cost, clock
        self.max_batch_size, self.max_seq_len = shape.max_batch_size, shape.max_seq_len
        self.max_draft_len, self.max_num_tokens = shape.max_draft_len, shape.max_num_tokens
        self.max_reservation = shape.max_seq_len
        self.packs_rows, self.draft_sync_cap = shape.packs_rows, shape.draft_sync_cap
        self.packs_rows_alone = shape.packs_rows_alone
        self.token_buckets = mixed_buckets(shape.max_num_tokens) if shape.packs_rows else ()   # the whole graphs'
        self.catch_up = catch_up                   # lazy sync's catch-up (CostModel.catch_up; none: free)
        self.buckets = batch_buckets(shape.max_batch_size)
        self._free = list(range(shape.max_batch_size, 0, -1))    # slots 1..max_batch_size, 1 first
        self._key: dict[int, int] = {}
        self._split: dict[tuple[int, int], SplitCost] = {}
        self.prices = prices
        self.base_ms = 0.0                         # sum of the steps' base ms
        self.features = [0.0] * len(FEATURES)      # sums of each step's FEATURES
        self.async_launch = overlapped             # launch queues the step on a simulated device (below)
        self._device_free: float | None = None     # ... which runs its steps in order: when it is free

    # ---- slots --------------------------------------------------------------------------------
    def reserve(self, tokens: int, key: int = 0) -> int | None:
        if tokens > self.max_reservation:
            raise DynspecError(f"simulator: a request needs {tokens} positions, above max_seq_len {self.max_seq_len}")
        if not self._free:
            return None
        slot = self._free.pop()
        self._key[slot] = key
        return slot

    def release(self, slot: int) -> None:
        self._key.pop(slot, None)
        self._free.append(slot)

    # ---- one iteration ------------------------------------------------------------------------
    def step(self, plan: StepPlan, acceptance: AcceptanceModel) -> StepResult:
        if self.async_launch:
            return self.result(self.launch(plan, acceptance))
        ms = self.step_ms(plan)
        accepted = self.accepted(plan, acceptance)
        self.clock.sleep(ms / 1e3)
        return self._result(plan, accepted, ms, 0.0)

    @staticmethod
    def _result(plan: StepPlan, accepted: tuple[int, ...], ms: float, idle: float) -> StepResult:
        return StepResult(accepted=accepted, emitted=tuple((0,) * (n + 1) for n in accepted),
                          draft_warm=plan.k > 0,
                          first_tokens=tuple(0 if c.last else None for c in plan.chunks),
                          device_s=ms / 1e3, idle_s=idle)

    def launch(self, plan: StepPlan, acceptance: AcceptanceModel):
        """async_launch False: the step, run (the clock moves by its ms). True: the step queued on
        the device, which starts it when the previous one ends or now, whichever is later, and the
        clock stays: -> (result, end). Steps of 10 and 12 ms launched at 0 and 1 ms end at 10 and
        22 ms; reading the second moves the clock to 22 ms."""
        if not self.async_launch:
            return self.step(plan, acceptance)
        ms = self.step_ms(plan)
        free = self.clock.now if self._device_free is None else self._device_free     # the first step: no gap
        start = max(self.clock.now, free)
        self._device_free = start + ms / 1e3
        return self._result(plan, self.accepted(plan, acceptance), ms, start - free), self._device_free

    def result(self, handle) -> StepResult:
        if not self.async_launch:
            return handle
        res, end = handle
        self.clock.sleep(end - self.clock.now)
        return res

    def accepted(self, plan: StepPlan, acceptance: AcceptanceModel) -> tuple[int, ...]:
        """[b] accepted drafts: the reference engine's rule (draft_chain.accept) for each row at its K_i."""
        if isinstance(acceptance, Greedy):
            raise DynspecError("simulator: real (greedy) acceptance needs the model; use a Bernoulli, mix, shift or"
                               " trace acceptance model")
        if not plan.batch_size or not plan.k:
            return (0,) * plan.batch_size
        keys = [self._key[s] for s in plan.slots]
        if isinstance(acceptance, TraceReplay):
            return tuple(int(accept_lengths(acceptance, key, pos, k))
                         for key, pos, k in zip(keys, plan.positions, plan.row_k))
        K = plan.k
        pos = torch.tensor(plan.positions, dtype=torch.long)[:, None] + torch.arange(1, K + 1)[None, :]   # [b, K]
        u = draft_uniforms(int(getattr(acceptance, "seed", 0)), torch.tensor(keys, dtype=torch.long), pos)
        p = torch.tensor([rate_of(acceptance, key) for key in keys], dtype=torch.float32)[:, None]
        n = (u < p).long().cumprod(dim=1).sum(dim=1)                              # [b] leading accepts
        return tuple(min(int(a), k) for a, k in zip(n.tolist(), plan.row_k))

    def step_ms(self, plan: StepPlan) -> float:
        """The plan's price (module docstring); its base and features are added to the run's sums."""
        base, split = self._base(plan)
        T, p = plan.prefill_tokens, self.prices
        per_token = p.chunk_ms_per_token
        if T and per_token is None:
            per_token = _slope(split)
        draft_t = T if plan.draft and not plan.store_chunks else 0
        ragged = base if self._ragged(plan) else 0.0
        feats = (1.0, float(T), 1.0 if T else 0.0, float(draft_t), ragged)
        self.base_ms += base
        self.features = [a + f for a, f in zip(self.features, feats)]
        chunk = p.chunk_fixed_ms + per_token * T + p.draft_chunk_ms_per_token * draft_t if T else 0.0
        if T and self.cost.chunk is not None:            # the profile times chunks: its chunk axis instead
            chunk = self._profiled_chunk(plan, T)
        n = plan.catch_up_tokens
        ms = base - p.host_ms + chunk + ((p.ragged_factor or 1.0) - 1.0) * ragged + self.catch_up.ms(n)
        return max(ms, 0.1 * base)

    def _profiled_chunk(self, plan: StepPlan, T: int) -> float:
        """A T-token chunk's extra over the rows' step, from the profile's chunk axis at the step's
        bucket, context and (deepest) K; no rows: over a one-row plain step."""
        b = plan.batch_size
        B = bucket_for(b, self.buckets) if b else 1
        context = sum(plan.positions) / b if b else 0.0
        k = plan.k if plan.k in self.cost.draft_lens else 0
        return self.cost.chunk.row(self.cost, B, context, T)[self.cost.draft_lens.index(k)]

    def _base(self, plan: StepPlan) -> tuple[float, SplitCost]:
        b = plan.batch_size
        if not b:
            return float(self.cost.row(1, 0.0)[1] or self.cost.lookup(1, 0, 0.0).ms), self._split_at(1, 0.0)
        B = bucket_for(b, self.buckets)
        context = sum(plan.positions) / b
        split = self._split_at(B, context)
        if self._ragged(plan):
            return split.step_ms(plan.decode_tokens + (B - b), plan.k), split
        if plan.k == 0 and not plan.keep_warm and self.cost.decode is not None:
            return float(self.cost.row(B, context)[1]), split
        return float(self.cost.lookup(B, plan.k, context).ms), split

    def forward_tokens(self, decode_rows: int, k: int, prefill_tokens: int, verify_tokens: int | None = None) -> int:
        """Tokens the GPU engine's forward runs for such an iteration, padding included: the
        reference engine's rule (mixed_layout.forward_tokens) at its token buckets."""
        return forward_tokens(decode_rows, k, prefill_tokens, verify_tokens, self.buckets, self.token_buckets,
                              self.packs_rows_alone)

    def _ragged(self, plan: StepPlan) -> bool:
        """A per-row plan the engine runs packed (plan.Engine packs_rows, packs_rows_alone); else
        every row runs max K_i tokens: the uniform price at plan.k."""
        return bool(plan.per_row and plan.batch_size) and packs_vector(self, bool(plan.chunks))

    def _split_at(self, B: int, context: float) -> SplitCost:
        key = (B, int(round(context / 16)) * 16)
        hit = self._split.get(key)
        if hit is None:
            hit = self._split[key] = SplitCost.at(self.cost, B, key[1])
        return hit


def _slope(split: SplitCost) -> float:
    """ms per token of the plain-step curve over its upper half (a prompt chunk's token, unfitted)."""
    f, mid = split.f_ms, len(split.f_ms) // 2
    return max(float(f[-1] - f[mid]) / max(len(f) - 1 - mid, 1), 0.0)


def shape_of(max_batch_size: int, max_seq_len: int, max_draft_len: int, max_num_tokens: int = 8192,
             packs_rows: bool = True, draft_sync_cap: int = 0) -> SimShape:
    if min(max_batch_size, max_seq_len, max_num_tokens) < 1 or max_draft_len < 0:
        raise DynspecError(f"simulator: engine sizes must be positive (max_batch_size {max_batch_size}, max_seq_len"
                           f" {max_seq_len}, max_draft_len {max_draft_len}, max_num_tokens {max_num_tokens})")
    return SimShape(max_batch_size, max_seq_len, max_draft_len, max_num_tokens, packs_rows, draft_sync_cap)


__all__: Sequence[str] = ("FEATURES", "SimClock", "SimEngine", "SimShape", "shape_of")
