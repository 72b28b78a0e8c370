"""Per-request draft length: each decode row i gets its own K_i, decided once per iteration.

Pure (numpy, no torch):

1. (The rows' rates: each request's counts shrunk toward the pool, runtime/policy/row_table.py.)

2. SplitCost (runtime/policy/split_cost.py): the step's time split into verify tokens and chain depth,
       ms(V, m) = f(V) + chain(m)      V = sum_i (K_i + 1) tokens verified, m = max_i K_i

3. allocate: maximise sum_i E_i(K_i) / ms(V, m), E_i(k) = 1 + sum_{j<=k} g_ij, g_ij = prod_{l<=j} r_il.
   g_ij falls with j within a row, so the best c positions of depth <= m are the top c gains in
   row-prefix order; for each m the sorted gains are scanned for every c with cumsums, each
   candidate priced at its own deepest position. Exact (any f) when chain(m) does not fall with
   m. Where it falls (chain(m) < chain(d), d < m: noise), a set of depth exactly m with fewer
   positions than the first top-c prefix reaching m is no prefix; those are scanned too, row q at
   K=m for the FORCED_ROWS rows of largest g_qm (exact for b <= FORCED_ROWS; beyond, the best
   forced row may be missed), and only when a bound says they can win.
   Worked example, split_cost.py's f(n) = 10 + 0.5 n and chain (0.5, 1.0, 2.0) at b = 3, rates
   (0.9, 0.9), (0.5, 0.5), (0.1, 0.1):
       gains, sorted: .9 (row 0, j 1), .81 (0, 2), .5 (1, 1), .25 (1, 2), .1 (2, 1), .01 (2, 2)
       c   ks         E      ms                    E / ms
       0   (0, 0, 0)  3      f(3) + 0.5  = 12.0   .250    (plain decode, 11.5 ms: .261)
       2   (1, 1, 0)  4.4    f(5) + 1.0  = 13.5   .326    (best at m = 1)
       4   (2, 2, 0)  5.46   f(7) + 2.0  = 15.5   .352    <- chosen
       5   (2, 2, 1)  5.56   f(8) + 2.0  = 16.0   .348    (row 2's .1 is not worth 0.5 ms)
       6   (2, 2, 2)  5.57   f(9) + 2.0  = 16.5   .338    (uniform K=2; uniform K=1: 4.5 / 14 = .321)
   Guarantees: K_i <= cap, V <= token_budget, and all zeros (plain decode) when b / decode_ms is
   at least the best. probe_rows at K=0 get K=1 afterwards (within the budget, priced in).
   Host time, b=256, cap 4, 2-core CPU host busy with other jobs (not asserted):
       >>> cost = SplitCost.at(cost_model, 256, 1024)      # ~50 us
       >>> allocate(rates, cost, 4, 4096, cost.decode_ms)  # ~150 us (rates [256, 4])
   A few rows (b x cap <= SMALL) scan in plain Python, numpy's calls costing more than the work:
   a b=1 decision (PerRequestPolicy.decide_rows) ~45 us, against ~75 with numpy.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dynspec.errors import DynspecError
from dynspec.runtime.policy.expected_tokens import expected_tokens
from dynspec.runtime.policy.split_cost import SplitCost

__all__ = ["Allocation", "SplitCost", "allocate", "brute_force", "uniform_allocation"]


# ---- 3. allocation --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Allocation:
    ks: tuple[int, ...]              # [b] K_i
    expected_tokens: float           # sum_i E_i(K_i)
    predicted_ms: float              # ms(V, m), or decode_ms for plain decode
    tokens_per_ms: float
    reason: str = "best"             # "best" | "plain decode" (b / decode_ms >= the best) | "probe"
    probed: tuple[int, ...] = ()     # rows raised from K=0 to K=1 by probe_rows

    @property
    def verify_tokens(self) -> int:
        return sum(self.ks) + len(self.ks)

    @property
    def depth(self) -> int:
        return max(self.ks, default=0)


def allocate(rates: np.ndarray, cost: SplitCost, cap: int, token_budget: int,
             decode_ms: float | None = None, probe_rows: Sequence[int] = ()) -> Allocation:
    """The K vector maximising predicted tokens per ms (module docstring, part 3).
    rates [b, L] per-row conditional rates, L >= cap; cap above the profiled K is lowered to it.
    Probes: the optimisation keeps one verify token per probe row in reserve (as far as the budget
    allows), then the probe rows still at K=0 take K=1 in the order given."""
    r = _check_rates(rates, cost.b, cap)
    b, cap = cost.b, min(cap, cost.max_depth)
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < b:
        raise DynspecError(f"allocate: token_budget {token_budget!r} is below b={b} (one token per row)")
    if decode_ms is not None and not (isinstance(decode_ms, (int, float)) and 0 < decode_ms < math.inf):
        raise DynspecError(f"allocate: decode_ms {decode_ms!r} is not a positive number of ms")
    probes = tuple(dict.fromkeys(_check_probes(probe_rows, b))) if cap >= 1 else ()
    ks, tokens, ms = _search(r, cost, cap, token_budget - min(len(probes), token_budget - b))
    reason = "best"
    if decode_ms is not None and b / decode_ms >= tokens / ms:
        ks, tokens, ms, reason = np.zeros(b, dtype=np.int64), float(b), float(decode_ms), "plain decode"
    room = token_budget - b - int(ks.sum())
    raised = tuple(i for i in probes if ks[i] == 0)[:max(room, 0)]
    if raised:
        ks = ks.copy()
        ks[list(raised)] = 1
        depth = int(ks.max())
        if not math.isfinite(cost.chain_ms[depth]):
            raise DynspecError(f"allocate: probes need K={depth} profiled (profiled K: {list(cost.draft_lens)})")
        tokens = tokens + float(r[list(raised), 0].sum())
        ms, reason = cost.ms(b + int(ks.sum()), depth), "probe"
    return Allocation(tuple(ks.tolist()), float(tokens), float(ms), float(tokens / ms), reason, raised)


def uniform_allocation(rates: np.ndarray, cost: SplitCost, cap: int, token_budget: int) -> Allocation | None:
    """The best K vector with every row at one K in 1..cap (the pure-decode graphs' speculative
    steps) within the token budget; None when no K >= 1 fits or is profiled.
    Worked example (the module docstring's rates and costs): K = 1, 2 -> 4.5 / 14.0, 5.57 / 16.5
    tokens a ms: K=2 (.338), where the per-row optimum (2, 2, 0) gives .352."""
    r = _check_rates(rates, cost.b, cap)
    b, cap = cost.b, min(cap, cost.max_depth)
    gains = [0.0] * cap                                            # [cap] sum_i g_ij
    if b * cap <= SMALL:                                           # a few rows: no numpy calls
        for row in r[:, :cap].tolist():
            g = 1.0
            for j, x in enumerate(row):
                g *= x
                gains[j] += g
    elif cap:
        gains = np.cumprod(r[:, :cap], axis=1).sum(axis=0).tolist()
    best, tokens = None, float(b)
    for k in range(1, cap + 1):
        tokens += gains[k - 1]
        if b * (k + 1) > token_budget or not math.isfinite(cost.chain_ms[k]):
            continue
        ms = cost.step_ms(b * (k + 1), k)
        if best is None or tokens / ms > best[1] / best[2]:
            best = (k, tokens, ms)
    if best is None:
        return None
    k, tokens, ms = best
    return Allocation((k,) * b, tokens, ms, tokens / ms, "uniform")


FORCED_ROWS = 16      # rows tried at the full depth m where chain(m) is below a shallower chain(d)
SMALL = 16            # b x cap at most this, and chain not falling: the scan in plain Python (no numpy calls)


def _search(r: np.ndarray, cost: SplitCost, cap: int, budget: int) -> tuple[np.ndarray, float, float]:
    """(ks [b], expected tokens, ms) of the best top-c prefix over depths m = 1..cap and all zeros,
    and of the forced sets (_forced) where chain falls with m."""
    b = r.shape[0]
    zero = cost.step_ms(b, 0)
    best = (b / zero, 0, 0, float(b), zero, None)          # (tokens/ms, m, c, E, ms, forced ks or None)
    if cap == 0 or budget <= b:
        return np.zeros(b, dtype=np.int64), best[3], best[4]
    chain = cost.chain_ms.tolist()
    if b * cap <= SMALL and all(not x > y for x, y in zip(chain[1:cap], chain[2:cap + 1])):
        return _search_small(r.tolist(), cost, chain, cap, budget, best)
    g2 = np.cumprod(r[:, :cap], axis=1)                            # [b, cap] gains g_ij
    order = np.argsort(-g2.ravel(), kind="stable")                 # descending; ties keep j ascending
    gs, js, rows = g2.ravel()[order], order % cap + 1, order // cap   # [b * cap] gain, j, row
    for m in range(1, cap + 1):
        if not math.isfinite(chain[m]):
            continue
        keep = js <= m if m < cap else slice(None)                 # the list filtered to depth <= m
        gm, jm = (gs[keep], js[keep]) if m < cap else (gs, js)
        n = min(len(gm), budget - b)
        gm, jm = gm[:n], jm[:n]
        tokens = b + np.cumsum(gm)                                 # [n] E at c = 1..n
        deepest = np.maximum.accumulate(jm)                        # [n] priced at the actual deepest j
        ms = np.maximum(cost.f_ms[b + 1:b + n + 1] + cost.chain_ms[deepest], cost.floor_ms)
        tpm = tokens / ms
        i = int(np.argmax(tpm))
        if tpm[i] > best[0]:
            best = (float(tpm[i]), m, i + 1, float(tokens[i]), float(ms[i]), None)
        if m > 1 and max(chain[1:m]) > chain[m] and n >= m:
            p = int(np.argmax(jm == m)) if deepest[-1] == m else n   # prefixes from p + 1 on reach m
            bound = tokens[m - 1:p] / np.maximum(cost.f_ms[b + m:b + p + 1] + chain[m], cost.floor_ms)
            if bound.size and bound.max() > best[0]:               # a forced set of c holds <= the top c
                forced = _forced(g2[:, m - 1], g2[:, :m].sum(axis=1), gm[:p], rows[keep][:p], m, cost, budget)
                if forced[0] > best[0]:
                    best = (forced[0], m, 0, forced[2], forced[3], forced[1])
    _, m, c, tokens, ms, ks = best
    if ks is None:
        ks = np.bincount(rows[js <= m][:c], minlength=b) if c else np.zeros(b, dtype=np.int64)
    return ks, tokens, ms


def _search_small(r: list, cost: SplitCost, chain: list, cap: int, budget: int,
                  best: tuple) -> tuple[np.ndarray, float, float]:
    """_search's top-c prefix scan for a few rows, in plain Python (the numpy calls' overhead is
    most of the decision at b <= 4); the same order and ties (rows, then positions, by falling
    gain), exact when chain does not fall with m (no forced sets)."""
    b, f, floor = len(r), cost.f_ms.tolist(), cost.floor_ms
    entries = []                                                   # (gain g_ij, j, row i), row-major
    for i, row in enumerate(r):
        g = 1.0
        for j in range(cap):
            g *= row[j]
            entries.append((g, j + 1, i))
    entries.sort(key=lambda e: -e[0])                              # stable: ties keep row-major order
    for m in range(1, cap + 1):
        if not math.isfinite(chain[m]):
            continue
        gained, deepest, c = 0.0, 0, 0
        for g, j, _ in entries:
            if j > m:
                continue
            if c == budget - b:
                break
            c, gained, deepest = c + 1, gained + g, max(deepest, j)
            tokens, ms = b + gained, max(f[b + c] + chain[deepest], floor)   # as numpy's b + cumsum
            if tokens / ms > best[0]:
                best = (tokens / ms, m, c, tokens, ms, None)
    _, m, c, tokens, ms, _ = best
    ks = np.zeros(b, dtype=np.int64)
    for _, _, i in [e for e in entries if e[1] <= m][:c]:
        ks[i] += 1
    return ks, tokens, ms


def _forced(deep: np.ndarray, whole: np.ndarray, gm: np.ndarray, rm: np.ndarray, m: int,
            cost: SplitCost, budget: int) -> tuple:
    """Sets of depth exactly m: row q at K=m plus the top k of the other rows' gains (gm, rm [p]:
    the list filtered to j <= m, up to its first j = m), for the FORCED_ROWS rows q of largest g_qm;
    whole [b] = sum_{j<=m} g_qj. A top-c prefix misses these only below its first j = m and only
    when chain(m) < chain(d) for some d < m; exact for b <= FORCED_ROWS."""
    b = len(whole)
    q = np.argsort(-deep, kind="stable")[:FORCED_ROWS]             # [R] rows forced to depth m
    others = rm[None, :] != q[:, None]                             # [R, n]
    count = m + np.cumsum(others, axis=1)                          # [R, n] c
    tokens = b + whole[q][:, None] + np.cumsum(np.where(others, gm, 0.0), axis=1)
    ms = np.maximum(cost.f_ms[b + np.minimum(count, budget - b)] + cost.chain_ms[m], cost.floor_ms)
    tpm = np.where(others & (count <= budget - b), tokens / ms, -np.inf)
    alone_ms = cost.step_ms(b + m, m)                              # k = 0: row q alone
    a = int(np.argmax(whole[q]))
    if tpm.size == 0 or (b + whole[q][a]) / alone_ms >= tpm.max():
        ks = np.zeros(b, dtype=np.int64)
        ks[q[a]] = m
        return (float((b + whole[q][a]) / alone_ms), ks, float(b + whole[q][a]), alone_ms)
    i, p = divmod(int(np.argmax(tpm)), tpm.shape[1])
    ks = np.bincount(rm[:p + 1][others[i, :p + 1]], minlength=b)
    ks[q[i]] = m
    return (float(tpm[i, p]), ks, float(tokens[i, p]), float(ms[i, p]))


def brute_force(rates: np.ndarray, cost: SplitCost, cap: int, token_budget: int) -> Allocation:
    """The optimum over every K vector in 0..cap^b (small b only): E by expected_tokens.py,
    ms by SplitCost.ms; the first best in lexicographic order of ks."""
    r = _check_rates(rates, cost.b, cap)
    b, cap = cost.b, min(cap, cost.max_depth)
    if (cap + 1) ** b > 1_000_000:
        raise DynspecError(f"brute force: {(cap + 1) ** b} K vectors is too many (b={b}, cap={cap})")
    best = None
    for ks in itertools.product(range(cap + 1), repeat=b):
        v = b + sum(ks)
        if v > token_budget or not math.isfinite(cost.chain_ms[max(ks)]):
            continue
        tokens = sum(expected_tokens(k, r[i].tolist()) for i, k in enumerate(ks))
        ms = cost.ms(v, max(ks))
        if best is None or tokens / ms > best.tokens_per_ms:
            best = Allocation(tuple(ks), tokens, ms, tokens / ms)
    if best is None:
        raise DynspecError(f"brute force: token_budget {token_budget} is below b={b}")
    return best


def _check_rates(rates: np.ndarray, b: int, cap: int) -> np.ndarray:
    r = np.asarray(rates, dtype=float)
    if r.ndim != 2 or r.shape[0] != b:
        raise DynspecError(f"allocate: rates has shape {r.shape}; it must be [b={b}, max_draft_len]")
    if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap <= r.shape[1]:
        raise DynspecError(f"allocate: cap {cap!r} is not an integer in 0..{r.shape[1]} (rates' positions)")
    if r.size and not (r.min() >= 0.0 and r.max() <= 1.0):     # nan fails both
        raise DynspecError("allocate: rates must all be in [0, 1] (nan included)")
    return r


def _check_probes(rows: Sequence[int], b: int) -> tuple[int, ...]:
    out = tuple(rows)
    for i in out:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < b:
            raise DynspecError(f"allocate: probe_rows entry {i!r} is not a row index in 0..{b - 1}")
    return tuple(int(i) for i in out)
