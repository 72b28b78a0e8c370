"""The prompt side of an iteration, as the draft-length policies price it (docs/design.md,
"Prefill-aware K"): the chunk that rides with the decode rows, and the prompts whose prefill
it ends. Pure: no torch.

StepInputs.waiting lists the prompt tokens each waiting request still needs, in the order the
planner hands out the budget (runtime/serving/plan.py chunk_sizes: first come, first served);
StepInputs.token_budget is max_num_tokens. For b decode rows at K:
    chunk(K)     = min(sum(waiting), budget - b(K+1))      the tokens that ride with the rows
    finishing(K) = prompts whose last token fits in chunk(K)   (their first token comes out of this step)
The chunk's extra time is priced at chunk(0) for every K: tokens a larger K pushes out of this
step are paid in a later one, so they make no K cheaper. The extra itself may differ by K
(CostModel.chunk, from the profile's chunk axis); without that axis the chunk is not priced.

The prompt's wait. A prompt finishing in the step waits the whole step for its first token,
so K > 0 delays it by t(K) - t(0). With a TTFT weight w, each finishing prompt counts as w
decode rows that gain one token whatever K is:
    gain_w(K) = (b E(K) + w finishing(K)) / (b + w finishing(0)) x t(0) / t(K)
w = 0 is the throughput rule. Worked example, b = 16, E(2) = 1.75, t(0) = 10, t(2) = 12, one
prompt finishing at every K: w = 0 -> 1.458; w = 16 -> (28 + 16) / (16 + 16) x 10 / 12 = 1.146;
w = 64 -> 92 / 80 x 10 / 12 = 0.958 < 1: plain decode for that step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class PromptSide:
    """The iteration's prompt side by K (indexed by K: 0..max_k)."""
    extra_ms: tuple[float, ...]      # the chunk's extra over the rows' step (all 0: unpriced)
    finishing: tuple[int, ...]       # prompts whose prefill ends in the step

    def weight(self, k: int, b: int, e: float, w: float) -> float:
        """gain_w(K) / gain(K) of b rows at K, each gaining E(K) tokens (prompt_weight)."""
        return prompt_weight(b * e, b, self.finishing[k], self.finishing[0], w)


def prompt_weight(tokens: float, b: int, fin: int, fin0: int, w: float) -> float:
    """gain_w / gain of a step of b rows expecting `tokens` tokens beside `fin` finishing prompts
    (fin0 at K=0): (tokens + w fin) / tokens x b / (b + w fin0); 1 when w = 0 or none finish at K=0.
    The one form of the weight, for one K of every row (PromptSide.weight) and a per-row vector alike.
    prompt_weight(28, 16, 1, 1, 16) = 44 / 28 x 16 / 32 = 0.786 (module docstring: 1.458 x 0.786 = 1.146)."""
    if not w or not fin0:
        return 1.0
    return (tokens + w * fin) / tokens * b / (b + w * fin0)


def chunk_tokens(waiting: Sequence[int], budget: int, b: int, k: int) -> int:
    """chunk(K): chunk_tokens((100, 40), 8192, 64, 4) = 140; chunk_tokens((100, 40), 400, 64, 4) = 80."""
    return max(0, min(sum(waiting), budget - b * (k + 1)))


def finishing(waiting: Sequence[int], left: int) -> int:
    """Prompts that end within `left` tokens, first come first served: finishing((30, 50, 20), 90) = 2."""
    n = 0
    for need in waiting:
        if need > left:
            break
        left -= need
        n += 1
    return n


def prompt_side(cost, waiting: Sequence[int], budget: int, b: int, bucket: int, context: float,
                max_k: int) -> PromptSide | None:
    """The prompt side of a step of b rows (running at `bucket`) for K = 0..max_k; None without
    waiting prompts. `cost` a CostModel: its chunk axis prices chunk(0) at each profiled K (others 0)."""
    if not waiting or budget <= 0:
        return None
    fin = tuple(finishing(waiting, budget - b * (k + 1)) for k in range(max_k + 1))
    extra = [0.0] * (max_k + 1)
    chunk = chunk_tokens(waiting, budget, b, 0)
    if cost.chunk is not None and chunk:
        for k, ms in zip(cost.draft_lens, cost.chunk.row(cost, bucket or b, context, chunk)):
            if k <= max_k:
                extra[k] = ms
    return PromptSide(tuple(extra), fin)
