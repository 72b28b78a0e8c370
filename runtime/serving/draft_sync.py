"""Lazy draft sync on the host (docs/design.md, "Draft sync"): which rows catch their draft up
this iteration, within the token budget, and which wait at K = 0 until they have.

Each request counts `draft_behind`: the draft positions just below its pending position L whose
draft K/V is missing, L - behind .. L - 1 (one a lazy K = 0 step: a row at K = 0 advances one
position a step). The engine's feature store holds a slot's captures of its newest `cap`
positions (L - cap .. L - 1 at planning), so a row more than cap behind drops the oldest: their
draft K/V stays stale (counted: stale_draft_tokens). When a row's K turns > 0 the catch-up writes
positions L - behind .. L - 2 (plan.CatchUp, its tokens the request's own x_{p+1}) and the step's
refresh rebuilds L - 1 and the head. A catch-up that does not fit what the budget leaves (budget
- b x (K+1), first come first served) writes what fits; the row runs at K_r = 0 meanwhile (and
where that leaves every row at K = 0, the catch-up takes what b x 1 leaves instead).

Worked example, cap 8, budget 20, two rows at K=3 wanted (8 decode tokens, 12 left):
    row A  L = 50, behind 6    catch-up 44..48 (5 tokens)      K_A = 3, behind after 0
    row B  L = 70, behind 11   drop 3 (stale), behind 8;       catch-up 62..68 (7 tokens: 12 - 5)
                                                                K_B = 3, behind after 0
    with budget 16 (8 left): A as above, B writes 62..64 (3), K_B = 0, behind after 8 - 3 + 1 = 6.

Prompts (store_chunks): a lazy K=0 step with decode rows stores its chunks' features instead of
running the draft over them, and so does a step without rows whose rows would not draft (the
policy's K at the prompts it ends: Executor._drafts_next) or whose chunks find no room beside their
catch-ups; each chunk's request falls behind by its tokens (a stored last
chunk leaves the row with a stale head). A later chunk that does run the draft first catches up
its request's newest min(behind, cap) positions below it (chunk_catch_up), within the budget.
Example, cap 256: a 300-token prompt in chunks 0..99 (stored) and 100..299 (drafted) -> the second
step writes draft positions 0..99 (CatchUp(slot, 0, x1..x100)), then its chunk's 100..299.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dynspec.runtime.serving.plan import CatchUp
from dynspec.runtime.serving.requests import Request


@dataclass(frozen=True)
class RowSync:
    """The draft sync of an iteration's decode rows (plan_sync)."""
    ks: tuple[int, ...]             # [b] each row's K: the decision's, 0 where a catch-up is unfinished
    stale: tuple[bool, ...]         # [b] rows whose draft head the step rebuilds (plan.stale)
    catch_up: tuple[CatchUp, ...]   # the K/V written before the step's draft work
    behind: tuple[int, ...]         # [b] each row's draft_behind once the step ran (lazy; else ())
    dropped: int = 0                # draft positions past the store's cap this iteration: stale for good

    @property
    def k(self) -> int:
        return max(self.ks, default=0)

    @property
    def tokens(self) -> int:
        return sum(len(c.tokens) for c in self.catch_up)


def store_cap(engine) -> int:
    """The engine's feature store's tokens a slot (draft_sync_cap); an engine without one: 0."""
    return getattr(engine, "draft_sync_cap", 0)


def plan_sync(mode: str, rows: Sequence[Request], lengths: Sequence[int], ks: Sequence[int], engine) -> RowSync:
    """The rows' RowSync under draft sync `mode`. lengths: each row's exact pending position
    where it is behind (the overlapped loop's lower bound: a row behind ran at K_r = 0 in the step
    in flight); ks: the decision's K of each row; engine: its max_num_tokens (the budget) and
    draft_sync_cap (its feature store's tokens a slot; an engine without one: 0, every missed
    position stale). The catch-up takes what b x (K+1) leaves; where that leaves every row at
    K = 0, it takes what b x 1 leaves (so a catch-up always moves on)."""
    if mode != "lazy":
        return RowSync(tuple(ks), tuple(not r.draft_warm for r in rows), (), ())
    b, budget, cap = len(rows), engine.max_num_tokens, store_cap(engine)
    sync = _rows(rows, lengths, ks, cap, budget - b * (max(ks, default=0) + 1), True)
    if max(ks, default=0) and not sync.k:
        sync = _rows(rows, lengths, ks, cap, budget - b, False)
    return sync


def _rows(rows: Sequence[Request], lengths: Sequence[int], ks: Sequence[int], cap: int, left: int,
          drafting: bool) -> RowSync:
    """plan_sync's pass over the rows with `left` catch-up tokens, first come first served;
    drafting False: every row runs at K = 0 (catching up all the same)."""
    out_k, stale, spans, behind, dropped = list(ks), [], [], [], 0
    for i, (req, L) in enumerate(zip(rows, lengths)):
        n = min(req.draft_behind, cap)
        dropped += req.draft_behind - n
        stale.append(not req.draft_warm or n > 0)
        if not out_k[i]:
            behind.append(n + 1)                      # a lazy K=0 step: position L missed too
            continue
        need = max(n - 1, 0)                          # L - n .. L - 2; the refresh writes L - 1
        c = max(min(need, left), 0)
        if c:
            seq = req.prompt + tuple(req.out)         # x_j = seq[j]
            start = L - n
            spans.append(CatchUp(req.slot, start, seq[start + 1:start + 1 + c]))
            left -= c
        if c < need or not drafting:
            out_k[i] = 0                              # drafts once caught up
            behind.append(n - c + 1)
        else:
            behind.append(0)
    return RowSync(tuple(out_k), tuple(stale), tuple(spans), tuple(behind), dropped)


def chunk_catch_up(chunked: Sequence[Request], starts: Sequence[int], cap: int) -> tuple[tuple[CatchUp, ...], int]:
    """The catch-ups of prompt chunks that run the draft (module docstring, "Prompts"): for each
    request behind, starting a chunk at position starts[i], its newest min(behind, cap) positions
    below it -> (spans, positions dropped past the cap: stale for good)."""
    spans, dropped = [], 0
    for req, start in zip(chunked, starts):
        n = min(req.draft_behind, cap)
        dropped += req.draft_behind - n
        if n:
            spans.append(CatchUp(req.slot, start - n, req.prompt[start - n + 1:start + 1]))
    return tuple(spans), dropped
