"""The Engine protocol on a measured cost model: the serving simulator's engine
(benchmarks/simulate.py; docs/design.md, "The serving simulator").

It runs no model. A step's accepted drafts come from the acceptance model exactly as the reference
engine draws them (draft_uniforms of the request key and position for Bernoulli models, the recorded
run for trace replay), so a simulated request accepts what the same request accepts on the GPU. A
step's time comes from the cost model, priced as the GPU engine runs the plan, and moves a virtual
clock that the executor and the load generator read.

Step price (ms), b decode rows, B = bucket_for(b) (the captured graph's rows), c = mean row position:
    uniform K, no chunk      CostModel(B, K, c)         K=0 without keep-warm: decode_ms(B, c)
    per-row K_i, no chunk    SplitCost(B, c).ms(sum_i (K_i + 1) + (B - b), max K_i)
    with prompt chunks       SplitCost(B, c).ms(V + T, m): the chunk's T tokens verified as decode
                             tokens are (the plain step curve f of runtime/split_cost.py); only
                             chunks: f(T)
Worked example, the H100 profile of benchmarks/sim_data (context 128): b = 13 at K = 0 without
keep-warm runs the 16-row graph, decode_ms(16) = 6.58; 64 rows at K=0 plus a 128-token chunk price
f(192) = 9.85 against the mixed_step run's 9.62 + 2.21 = 11.83 at context 1024.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from dynspec.errors import DynspecError
from dynspec.runtime.acceptance import AcceptanceModel, Greedy, TraceReplay, accept_lengths, draft_uniforms, rate_of
from dynspec.runtime.cost_model import CostModel
from dynspec.runtime.plan import StepPlan, StepResult, batch_buckets, bucket_for
from dynspec.runtime.split_cost import SplitCost


class SimClock:
    """Virtual seconds: the executor's and the load generator's clock; `sleep` moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, float(seconds))


@dataclass(frozen=True)
class SimShape:
    """The GPU engine's sizes that shape its steps (engine.json / the sweep's engine)."""
    max_batch_size: int
    max_seq_len: int
    max_draft_len: int
    max_num_tokens: int = 8192
    packs_rows: bool = True          # the CUDA reference engine verifies each row's K_i + 1 tokens


class SimEngine:
    """Engine protocol (runtime/plan.py) on a cost model; see the module docstring."""

    vocab_size = 1 << 30             # the workload's token ids are never read

    def __init__(self, cost: CostModel, shape: SimShape, clock: SimClock):
        if shape.max_draft_len > cost.draft_lens[-1]:
            raise DynspecError(f"simulator: max_draft_len {shape.max_draft_len} is above the cost model's profiled"
                               f" K {list(cost.draft_lens)}")
        self.cost, self.clock = cost, clock
        self.max_batch_size, self.max_seq_len = shape.max_batch_size, shape.max_seq_len
        self.max_draft_len, self.max_num_tokens = shape.max_draft_len, shape.max_num_tokens
        self.max_reservation = shape.max_seq_len
        self.packs_rows = shape.packs_rows
        self.buckets = batch_buckets(shape.max_batch_size)
        self._free = list(range(shape.max_batch_size, 0, -1))    # slots 1..max_batch_size, 1 first
        self._key: dict[int, int] = {}
        self._split: dict[tuple[int, int], SplitCost] = {}
        self.steps = 0

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
        ms = self.step_ms(plan)
        accepted = self.accepted(plan, acceptance)
        self.clock.sleep(ms / 1e3)
        self.steps += 1
        return StepResult(accepted=accepted, emitted=tuple((0,) * (n + 1) for n in accepted),
                          draft_warm=plan.k > 0,
                          first_tokens=tuple(0 if c.last else None for c in plan.chunks),
                          device_s=ms / 1e3, idle_s=0.0)

    def launch(self, plan: StepPlan, acceptance: AcceptanceModel) -> StepResult:
        return self.step(plan, acceptance)

    def result(self, handle: StepResult) -> StepResult:
        return handle

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
        """The plan's price on the cost model (module docstring)."""
        b, T = plan.batch_size, plan.prefill_tokens
        if not b:
            return float(self._split_at(1, 0).f_ms_at(T))
        B = bucket_for(b, self.buckets)
        context = sum(plan.positions) / b
        if not T and not plan.per_row:
            if plan.k == 0 and not plan.keep_warm and self.cost.decode is not None:
                return float(self.cost.row(B, context)[1])
            return float(self.cost.lookup(B, plan.k, context).ms)
        split = self._split_at(B, context)
        verify = plan.decode_tokens + (B - b) * (plan.k + 1 if not plan.per_row else 1)
        return float(split.ms(verify + T, plan.k) if plan.k or plan.keep_warm else split.f_ms_at(verify + T))

    def _split_at(self, B: int, context: float) -> SplitCost:
        key = (B, int(round(context / 16)) * 16)
        hit = self._split.get(key)
        if hit is None:
            hit = self._split[key] = _Split(SplitCost.at(self.cost, B, key[1]))
        return hit


class _Split:
    """A SplitCost that also prices token counts past its profiled curve (long prompt chunks): the
    last segment's slope extended, as SplitCost extends f past the profiled batch sizes."""

    def __init__(self, split: SplitCost):
        self.split = split

    def f_ms_at(self, n: int) -> float:
        f = self.split.f_ms
        if n < len(f):
            return float(f[n])
        slope = max(float(f[-1] - f[-2]), 0.0)
        return float(f[-1]) + slope * (n - (len(f) - 1))

    def ms(self, verify_tokens: int, depth: int) -> float:
        s = self.split
        return max(self.f_ms_at(verify_tokens) + float(s.chain_ms[depth]), s.floor_ms)


def shape_of(max_batch_size: int, max_seq_len: int, max_draft_len: int, max_num_tokens: int = 8192,
             packs_rows: bool = True) -> SimShape:
    if min(max_batch_size, max_seq_len, max_num_tokens) < 1 or max_draft_len < 0:
        raise DynspecError(f"simulator: engine sizes must be positive (max_batch_size {max_batch_size}, max_seq_len"
                           f" {max_seq_len}, max_draft_len {max_draft_len}, max_num_tokens {max_num_tokens})")
    return SimShape(max_batch_size, max_seq_len, max_draft_len, max_num_tokens, packs_rows)


__all__: Sequence[str] = ("SimClock", "SimEngine", "SimShape", "shape_of")
