"""Interpolation on a profiled grid, shared by the cost model (cost_model.py), its chunk axis
(chunk_cost.py) and the split cost (split_cost.py). Pure."""
from __future__ import annotations

import bisect
from typing import Sequence


def lerp(y0: float, y1: float, t: float) -> float:
    """y0 + t * (y1 - y0) for t <= 1; past y1 (t > 1) the slope is floored at 0, so a noisy last
    segment that falls never predicts a time below its end: (12, 16, 2) -> 20; (16, 12, 2) -> 12."""
    if t <= 1.0:
        return y0 + t * (y1 - y0)
    return y1 + (t - 1.0) * max(0.0, y1 - y0)


def segment(xs: Sequence[int], x: float, name: str) -> tuple[tuple[int, float], str]:
    """((i, t), note): value = lerp(y[i], y[i+1], t). Inside: 0 <= t <= 1. Below xs[0]: (0, 0),
    clamped. Above xs[-1]: the last segment with t > 1, or (0, 0) for one point.
    xs (1, 5): 3 -> (0, 0.5); 9 -> (0, 2.0); 0.5 -> (0, 0)."""
    lo, hi = xs[0], xs[-1]
    shown = f"{x:g}"
    if x < lo:
        return (0, 0.0), f"{name} {shown} below the profiled {_span(xs)}: {name}={lo}'s time"
    if x > hi:
        if len(xs) == 1:
            return (0, 0.0), f"{name} {shown} above the profiled {hi}: {name}={hi}'s time"
        i = len(xs) - 2
        return (i, (x - xs[i]) / (hi - xs[i])), \
            f"{name} {shown} above the profiled {_span(xs)}: the segment {xs[i]}..{hi} extended"
    if len(xs) == 1:
        return (0, 0.0), ""
    i = min(bisect.bisect_right(xs, x) - 1, len(xs) - 2)
    return (i, (x - xs[i]) / (xs[i + 1] - xs[i])), ""


def _span(xs: Sequence[int]) -> str:
    return f"{xs[0]}..{xs[-1]}" if len(xs) > 1 else f"{xs[0]}"
