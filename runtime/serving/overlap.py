"""The overlapped loop's planning rule (runtime/serving/loop.py OverlappedLoop; docs/design.md,
"The overlapped loop"): what the host knows of each decode row while the step before it runs.

At the moment the host plans iteration i+1, iteration i is in flight and every result up to i-1
is folded in. For a decode row r with host length L_r (= its position in iteration i):
    a row of iteration i at K_i          position in i+1 in [L_r + 1, L_r + 1 + K_i]
    a request whose last chunk ran in i  position P = L_r + 1 exactly (its L_r is P - 1)
and its pending token is on the device only. So the plan marks every row from_device, gives the
upper bound as its position (what sizes the blocks read and the cache bound) and the lower bound
to the policy as its context. With nothing in flight the host knows every row exactly.

Worked example, K_i = 3, rows A (L = 40, decoding) and B (prompt of 12, last chunk in i):
    positions (upper) = (44, 12)   context (lower) = (41, 12)   from_device = (True, True)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dynspec.runtime.serving.loop import STRATEGIES, Loop


@dataclass(frozen=True)
class RowInputs:
    positions: tuple[int, ...]       # [b] what the plan carries: exact, or an upper bound when from_device
    context: tuple[int, ...]         # [b] the lower bound: what the policy reads as each row's KV length
    pending: tuple[int, ...]         # [b] the last token the host has, or 0 when from_device
    from_device: tuple[bool, ...]    # [b]


def row_inputs(lengths: Sequence[int], last_tokens: Sequence[int | None],
               in_flight_k: Sequence[int] | None) -> RowInputs:
    """lengths: each row's host length L_r; last_tokens: its last folded token (None: none yet);
    in_flight_k: per row, the K it runs at in the step in flight (0 for a request whose last
    chunk runs there), or None when no step is in flight (then every row is exact)."""
    b = len(lengths)
    if in_flight_k is None:
        if any(t is None for t in last_tokens):
            raise ValueError("a decode row without a token while no step is in flight")
        return RowInputs(tuple(lengths), tuple(lengths), tuple(last_tokens), (False,) * b)
    if len(in_flight_k) != b:
        raise ValueError(f"{b} rows but {len(in_flight_k)} in-flight K values")
    return RowInputs(tuple(n + 1 + k for n, k in zip(lengths, in_flight_k)), tuple(n + 1 for n in lengths),
                     (0,) * b, (True,) * b)


def cache_slack(max_draft_len: int, loop: Loop) -> int:
    """Positions a request's cache needs past prompt + max_new_tokens under `loop`: its strategy's
    (runtime/serving/loop.py: SerialLoop one verify window of K+1, OverlappedLoop two).
    max_draft_len 4: Loop.SERIAL 5, Loop.OVERLAPPED 10."""
    return STRATEGIES[loop].cache_slack(max_draft_len)
