"""Choose a draft-length schedule from a measured profile. Pure: numbers in, schedule out. The one
rule of `dynspec tune` (benchmarks/cli.py) and of the schedule `dynspec generate` tunes at start
(runtime/generate/tune_at_start.py), with per_position_rates, the acceptance both read from served steps.

For each batch size b and candidate K:
    goodput(b, K) = b * E[tokens | K] / iteration_ms(b, K)          tokens per ms
    gain(b, K)    = goodput(b, K) / goodput(b, 0)                   predicted speedup over plain decode

E[tokens | K] is what one row gains per verify step (the bonus token included):
    one rate a:               E = (1 - a^(K+1)) / (1 - a)           (= K + 1 when a = 1)
    per-position rates a_i:   E = 1 + sum_{i<=K} prod_{j<=i} a_j     a_i = P(draft i accepted | drafts < i accepted)
    worked example, a = 0.7, K = 3:   E = 1 + 0.7 + 0.49 + 0.343 = 2.533

Batch sizes between profiled points get iteration_ms interpolated LINEARLY IN b (iteration
time is close to affine in b both while memory-bound and once compute-bound; the knee
between them is where interpolation errs, so profile densely there). Below the smallest
profiled b the smallest point's times are used; above the largest, K = 0 (not measured, so
no speculation is promised there).

The per-b argmax can wiggle with noise, while a DraftSchedule needs K non-increasing in b.
So the final K's are the non-increasing sequence that maximises sum_b gain(b, K_b) / b
(equal weight per octave of batch size), found by dynamic programming; where the argmax is
already non-increasing that is exactly the argmax.

Draft margin m >= 1: each draft position must pay for itself by the factor m, so the score
maximised is gain(b, K) / m^K (K = 0 scores its gain, 1). A larger K's predicted gain rests more
on the acceptance estimate, and request ends truncate its windows. Example: an H200 regime-A
profile (a = 0.7, b=1) predicts K=4 at 2.0096x and K=3 at 2.0015x, 0.4% apart, where a sweep
served K=4 0.977x as fast as K=3 (2.68 tokens accepted a step against 2.77 predicted). With m = 1.01,
b=1 takes K=3 (2.0015 / 1.01^3 = 1.943 > 2.0096 / 1.01^4 = 1.931).

Token budget (TRT-LLM's max_num_tokens): one iteration feeds the target b * (K+1) tokens, so a
K with b * (K+1) > max_num_tokens is never chosen (K = 0 always is: admission, not K, limits
rows past the budget). Budget 16: b=4 may take K <= 3, b=8 K <= 1, b=16 K = 0.

The DP keeps one row per batch size, so the largest profiled batch size is bounded by
MAX_BATCH_SIZE (16384, past any TRT-LLM engine's max_batch_size; ~0.5 s and ~30 MB at K <= 4).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.policy.expected_tokens import expected_tokens   # tune's E[tokens | K], one definition
from dynspec.runtime.policy import DraftSchedule

Acceptance = float | Sequence[float]
MAX_BATCH_SIZE = 16384
DRAFT_MARGIN = 1.01      # `dynspec tune`'s default (see "Draft margin" above); tune() itself defaults to none, 1.0
INTERPOLATION = "linear in batch size between profiled points; smallest point's times below it; K=0 above the largest"


def interpolate(points: Mapping[int, float], b: int) -> float | None:
    """Linear in b between the profiled points; the smallest point's value below it; None above.

    points {1: 10.0, 4: 13.0}: b=2 -> 11.0, b=4 -> 13.0, b=5 -> None."""
    bs = sorted(points)
    if b > bs[-1]:
        return None
    if b <= bs[0]:
        return float(points[bs[0]])
    i = bisect.bisect_left(bs, b)          # bs[i-1] < b <= bs[i]
    lo, hi = bs[i - 1], bs[i]
    t = (b - lo) / (hi - lo)
    return float(points[lo]) + t * (float(points[hi]) - float(points[lo]))


@dataclass(frozen=True)
class TuneRow:
    batch_size: int
    k: int                   # chosen (after smoothing)
    best_k: int              # the per-b argmax before smoothing
    iteration_ms: float      # at the chosen K
    gain: float              # goodput(b, k) / goodput(b, 0)
    profiled: bool           # False: iteration times interpolated


@dataclass(frozen=True)
class TuneResult:
    schedule: DraftSchedule
    rows: tuple[TuneRow, ...]          # every b from 1 to the largest profiled b
    acceptance: str                    # e.g. "0.7" or "per-position [0.8, 0.6]"
    candidates: tuple[int, ...]        # the K values considered
    interpolation: str = INTERPOLATION
    min_gain: float = 1.0              # margin a K > 0 must clear over plain decode
    draft_margin: float = 1.0          # factor each further draft position must add
    max_num_tokens: int | None = None  # token budget: b * (K+1) <= it for every chosen K

    def row(self, b: int) -> TuneRow:
        return self.rows[b - 1]

    def table_rows(self) -> tuple[TuneRow, ...]:
        """The rows worth printing: every profiled b, plus each b where K changes."""
        keep = []
        for i, r in enumerate(self.rows):
            changed = i > 0 and self.rows[i - 1].k != r.k
            if r.profiled or changed:
                keep.append(r)
        return tuple(keep)

    def loose_thresholds(self, spread: float = 2.0) -> tuple[tuple[int, int, int, int, int], ...]:
        """Where K changes at an unprofiled b whose profiled neighbours lo < b < hi are more than
        `spread` apart: (b, K before, K from b on, lo, hi). Such a threshold rests on straight
        lines between lo and hi, and step times bend there (the knee). Example: a regime-B
        profile on the grid 1, 4, 16, 64, 256 puts K 1 -> 0 at b=243 from the lines of 64 and
        256; profiled at 128 and 192 as well, it moves to 187."""
        profiled = sorted(r.batch_size for r in self.rows if r.profiled)
        out = []
        for prev, r in zip(self.rows, self.rows[1:]):
            if r.k != prev.k and not r.profiled:
                i = bisect.bisect_left(profiled, r.batch_size)
                if 0 < i < len(profiled) and profiled[i] > spread * profiled[i - 1]:
                    out.append((r.batch_size, prev.k, r.k, profiled[i - 1], profiled[i]))
        return tuple(out)

    def table(self) -> str:
        margin = f"; K > 0 only where gain >= {self.min_gain:g}x" if self.min_gain > 1 else ""
        if self.draft_margin > 1:
            margin += f"; each draft position must add {self.draft_margin:g}x"
        if self.max_num_tokens is not None:
            margin += f"; b x (K+1) <= max_num_tokens {self.max_num_tokens}"
        lines = [f"acceptance {self.acceptance}; candidates K in {list(self.candidates)}{margin}",
                 f"iteration times: {self.interpolation}",
                 f"{'batch':>6} {'K':>3} {'best K':>7} {'iter ms':>10} {'gain vs K=0':>12}  source"]
        for r in self.table_rows():
            src = "profiled" if r.profiled else "interpolated"
            note = "" if r.k == r.best_k else f"  (smoothed from K={r.best_k})"
            lines.append(f"{r.batch_size:>6} {r.k:>3} {r.best_k:>7} {r.iteration_ms:>10.3f} {r.gain:>11.3f}x  {src}{note}")
        lines.append(f"schedule: {self.schedule.to_spec() or '(no speculation)'}")
        for b, k0, k1, lo, hi in self.loose_thresholds():
            lines.append(f"note: K {k0} -> {k1} at b={b} is interpolated between profiled b={lo} and b={hi}; "
                         f"profile batch sizes between them to place it")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "schedule": self.schedule.to_spec(),
            "acceptance": self.acceptance,
            "candidates": list(self.candidates),
            "min_gain": self.min_gain,
            "draft_margin": self.draft_margin,
            "max_num_tokens": self.max_num_tokens,
            "interpolation": self.interpolation,
            "loose_thresholds": [dict(batch_size=b, k_before=k0, k=k1, profiled_below=lo, profiled_above=hi)
                                 for b, k0, k1, lo, hi in self.loose_thresholds()],
            "rows": [dict(batch_size=r.batch_size, k=r.k, best_k=r.best_k, iteration_ms=r.iteration_ms,
                          gain=r.gain, profiled=r.profiled) for r in self.table_rows()],
        }


def _check_grid(iteration_ms: Mapping[int, Mapping[int, float]]) -> tuple[list[int], list[int]]:
    if not iteration_ms:
        raise DynspecError("profile has no iteration times")
    bs = sorted(iteration_ms)
    if bs[-1] > MAX_BATCH_SIZE:
        raise DynspecError(f"profile batch size {bs[-1]} exceeds the tuner's maximum {MAX_BATCH_SIZE}")
    ks = sorted(iteration_ms[bs[0]])
    for b in bs:
        if sorted(iteration_ms[b]) != ks:
            raise DynspecError(
                f"profile: batch size {b} has draft lengths {sorted(iteration_ms[b])}, batch size {bs[0]} has {ks};"
                " every batch size needs the same draft lengths"
            )
        for k, ms in iteration_ms[b].items():
            if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0):
                raise DynspecError(f"profile: iteration_ms[{b}][{k}] = {ms!r} is not a positive number")
    if 0 not in ks:
        raise DynspecError("profile has no K=0 (plain decode) times; gains are measured against it")
    return bs, ks


def tune(iteration_ms: Mapping[int, Mapping[int, float]], acceptance: Acceptance,
         max_draft_len: int | None = None, min_gain: float = 1.0, max_num_tokens: int | None = None,
         draft_margin: float = 1.0) -> TuneResult:
    """The goodput-maximising non-increasing schedule for a profile (see the module docstring).

    min_gain > 1 is a margin against profile error: a K > 0 is chosen only where its predicted
    gain over plain decode, divided by min_gain, still beats K = 0 (e.g. 1.05: speculate only
    where the model promises at least 5%). draft_margin > 1 is a margin between K's: the score
    is divided by draft_margin^K (see the module docstring)."""
    if not (math.isfinite(min_gain) and min_gain >= 1.0):
        raise DynspecError(f"min_gain {min_gain} must be at least 1")
    if not (math.isfinite(draft_margin) and draft_margin >= 1.0):
        raise DynspecError(f"draft_margin {draft_margin} must be at least 1")
    if max_draft_len is not None and max_draft_len < 0:
        raise DynspecError(f"max_draft_len {max_draft_len} must be at least 0")
    if max_num_tokens is not None and (isinstance(max_num_tokens, bool) or not isinstance(max_num_tokens, int)
                                       or max_num_tokens < 1):
        raise DynspecError(f"max_num_tokens {max_num_tokens!r} must be an integer of at least 1")
    bs, ks = _check_grid(iteration_ms)
    per_position = not isinstance(acceptance, (int, float))
    limit = max_draft_len if max_draft_len is not None else max(ks)
    if per_position:
        limit = min(limit, len(acceptance))
    cands = [k for k in ks if k <= limit]
    E = {k: expected_tokens(k, acceptance) for k in cands}
    B = bs[-1]
    curves = {k: {b: iteration_ms[b][k] for b in bs} for k in cands}
    ms = [[interpolate(curves[k], b) for k in cands] for b in range(1, B + 1)]        # [B][len(cands)]
    # gain(b, K) = E(K) * ms(b, 0) / ms(b, K)   (b cancels)
    gain = [[E[k] * row[0] / row[j] for j, k in enumerate(cands)] for row in ms]
    budget = max_num_tokens if max_num_tokens is not None else math.inf
    score = [[(g / (min_gain if k > 0 else 1.0) / draft_margin ** k) if k == 0 or b * (k + 1) <= budget else -math.inf
              for g, k in zip(row, cands)] for b, row in enumerate(gain, 1)]          # what is maximised
    best = [max(range(len(cands)), key=lambda j, g=g: (round(g[j], 12), -j)) for g in score]

    # DP over b = B..1: f[j] = best weighted sum of gains for b..B given K_b = cands[j], with
    # K non-increasing from b on. nxt_best[j] = max(f_{b+1}[:j+1]), reached at nxt_arg[j].
    f = [0.0] * len(cands)
    follow: list[list[int]] = [[]] * B          # follow[b-1][j]: index of K_{b+1} given K_b = cands[j]
    for b in range(B, 0, -1):
        nxt_best, nxt_arg, run, at = [], [], -math.inf, 0
        for j in range(len(cands)):
            if f[j] > run + 1e-12:              # ties keep the smaller K
                run, at = f[j], j
            nxt_best.append(run)
            nxt_arg.append(at)
        follow[b - 1] = nxt_arg
        f = [score[b - 1][j] / b + (nxt_best[j] if b < B else 0.0) for j in range(len(cands))]
    j = max(range(len(cands)), key=lambda j: (round(f[j], 12), -j))
    picks = []
    for b in range(1, B + 1):
        picks.append(j)
        if b < B:
            j = follow[b - 1][j]
    profiled = set(bs)
    rows = tuple(
        TuneRow(b, cands[picks[b - 1]], cands[best[b - 1]], ms[b - 1][picks[b - 1]], gain[b - 1][picks[b - 1]],
                b in profiled)
        for b in range(1, B + 1)
    )
    # one tier per b; DraftSchedule merges equal neighbours and drops the K=0 tail
    schedule = DraftSchedule(tuple((r.batch_size, r.k) for r in rows))
    label = f"{acceptance:g}" if not per_position else "per-position " + str([round(float(a), 4) for a in acceptance])
    return TuneResult(schedule, rows, label, tuple(cands), min_gain=min_gain, draft_margin=draft_margin,
                      max_num_tokens=max_num_tokens)


def per_position_rates(steps: Sequence[tuple[int, Sequence[int]]], k: int) -> tuple[float, ...]:
    """Conditional acceptance per draft position from per-row accepted counts of K=k steps.

    a_i = #(rows with n >= i) / #(rows with n >= i-1).  Rows [3, 1, 0, 3] at K=3:
        n>=0: 4, n>=1: 3, n>=2: 2, n>=3: 2  ->  (0.75, 0.667, 1.0)"""
    ns = [n for kk, rows in steps if kk == k for n in rows]
    if not ns:
        raise DynspecError(f"no K={k} steps to measure acceptance from")
    counts = [sum(1 for n in ns if n >= i) for i in range(k + 1)]
    return tuple(counts[i] / counts[i - 1] if counts[i - 1] else 0.0 for i in range(1, k + 1))


def with_chunks(cost, table, share: float, tokens: int) -> dict[int, dict[int, float]]:
    """The table's iteration_ms as served steps: a `share` of iterations carry a `tokens`-token
    prompt chunk, priced by the chunk axis of `cost` (the profile's CostModel: chunk_cost.py) at
    each profiled (b, K):
        ms'(b, K) = ms(b, K) + share x extra(b, K, tokens)     (K = 0: over plain decode, decode_ms)
    Example: ms(16, 0) 10.0, ms(16, 2) 12.0, extra 2.0 at every K, share 0.3 -> 10.6 and 12.6: drafting's
    cost relative to the step falls, so a larger K may pay."""
    if not 0.0 <= share <= 1.0 or tokens < 1:
        raise DynspecError(f"--chunk-share {share} must be in [0, 1] and --chunk-tokens {tokens} at least 1")
    if cost.chunk is None:
        raise DynspecError("--chunk-share needs a profile with a chunk axis (dynspec profile --chunk-lens 128,512)")
    out = {}
    for b, row in table.iteration_ms.items():
        extra = dict(zip(cost.draft_lens, cost.chunk.row(cost, b, table.context_len, tokens)))
        out[b] = {k: ms + share * extra.get(k, 0.0) for k, ms in row.items()}
    return out


def with_prefill(iteration_ms, acceptance: Acceptance, ratio: float, prices,
                 draft_at_k0: bool = False) -> dict[int, dict[int, float]]:
    """The table's iteration_ms as served under sustained load: every generated token brings `ratio`
    prompt tokens (mean prompt / mean output length), prefilled in chunks beside the decode rows and
    priced per token by the device's fitted step prices (step_prices.py). A step of b rows at K makes
    b x E(K) tokens, so it carries b x E(K) x ratio chunk tokens:
        ms'(b, K) = ms(b, K) + b E(K) ratio (chunk_ms_per_token + draft_chunk_ms_per_token [K > 0])
    The target's prefill costs the same per generated token at every K, which dilutes drafting's gain;
    the draft's pass over the chunk is paid by K > 0 steps only (lazy sync stores a K=0 step's chunk;
    draft_at_k0: warm sync, every step pays it).
    Worked example, H100 at context 256, a = 0.5, ratio 1, 0.030 + 0.0037 ms a chunk token:
        b=256: ms 12.03 (K=0), 17.42 (K=1); E(1) = 1.5
        ms'(256, 0) = 12.03 + 256 x 0.030 = 19.71;  ms'(256, 1) = 17.42 + 384 x 0.0337 = 30.36
        gain(256, 1) = 1.5 x 19.71 / 30.36 = 0.974 (decode steps alone: 1.5 x 12.03 / 17.42 = 1.036)"""
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio >= 0):
        raise DynspecError(f"--prefill-ratio {ratio!r} must be a number of at least 0 (prompt tokens per output token)")
    if prices.chunk_ms_per_token is None:
        raise DynspecError("--prefill-ratio needs step prices with chunk_ms_per_token (benchmarks/sim_fit.py)")
    target, draft = prices.chunk_ms_per_token, prices.draft_chunk_ms_per_token
    known = math.inf if isinstance(acceptance, (int, float)) else len(acceptance)    # K's tune may pick

    def served(b: int, k: int, ms: float) -> float:
        if k > known:
            return ms
        return ms + b * expected_tokens(k, acceptance) * ratio * (target + (draft if k > 0 or draft_at_k0 else 0.0))

    return {b: {k: served(b, k, ms) for k, ms in row.items()} for b, row in iteration_ms.items()}
