"""The step's cost split into verify tokens and chain depth, for the per-request allocation
(runtime/policy/per_row.py; docs/design.md, "Per-request draft length"). Pure (numpy, no torch).

SplitCost: the step's time split into verify tokens and chain depth,
       ms(V, m) = f(V) + chain(m)      V = sum_i (K_i + 1) tokens verified, m = max_i K_i
   f(n) = the plain target step (CostModel's decode_ms, else K=0) at batch size n, interpolated in
   b and context as CostModel does, the last segment extended past the profiled b (slope >= 0);
   chain(m) = ms_uniform(b, m) - f(b * (m + 1)), chain(0) the keep-warm cost at K=0. At K_i = m for
   every row, ms(b(m+1), m) = ms_uniform(b, m): the profiled table, exactly. ms is floored at the
   cheapest profiled step at b (SplitCost.floor_ms), so a split gone negative prices nothing at <= 0.
   Example, f(n) = 10 + 0.5 n, b = 3, ms_uniform(3, K) = 12.0, 14.0, 16.5 for K = 0, 1, 2:
       chain = 12.0 - f(3), 14.0 - f(6), 16.5 - f(9) = 0.5, 1.0, 2.0
       K = (2, 2, 0): ms(7, 2) = f(7) + 2.0 = 15.5     (uniform K=2 verifies 9 tokens: 16.5)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dynspec.errors import DynspecError
from dynspec.runtime.policy.cost_calibration import EXTRA, KEEP_WARM, RAGGED
from dynspec.runtime.policy.cost_model import CostModel
from dynspec.runtime.policy.grid import segment as _segment


@dataclass(frozen=True, eq=False)
class SplitCost:
    """ms(V, m) = max(f(V) + chain(m), floor_ms) at one (b, context); see the module docstring.
    floor_ms, the cheapest profiled step at b, only bites where the split goes below it (a profile
    in which a K > 0 step verifies its tokens for less than f charges); the table is kept exactly."""
    b: int
    context: float
    f_ms: np.ndarray                 # [b * (max K + 1) + 1] plain step at n = 0.. tokens (read-only)
    chain_ms: np.ndarray             # [max K + 1] chain(m); inf where K=m was not profiled
    uniform_ms: tuple[float, ...]    # ms_uniform(b, K) for K in draft_lens
    draft_lens: tuple[int, ...]
    decode_ms: float | None          # plain step without keep-warm at b (None: not profiled)
    floor_ms: float
    extrapolated: bool = False       # the row at (b, context), or f up to b * (max K + 1), left the profile

    @classmethod
    def at(cls, cost_model: CostModel, b: int, context: float) -> "SplitCost":
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise DynspecError(f"split cost: batch size {b!r} is not an integer >= 1")
        uniform, decode, extrap = cost_model.row(b, context)
        ks, top = cost_model.draft_lens, b * (cost_model.draft_lens[-1] + 1)
        f = _plain_curve(cost_model, np.arange(top + 1, dtype=float), context)
        chain = np.full(ks[-1] + 1, np.inf)
        for k, ms in zip(ks, uniform):
            chain[k] = ms - f[b * (k + 1)]
        f.flags.writeable = chain.flags.writeable = False
        floor = min(float(f[b]), min(uniform))
        return cls(b, float(context), f, chain, tuple(uniform), ks, decode, floor,
                   extrap or top > cost_model.batch_sizes[-1])

    @property
    def max_depth(self) -> int:
        return len(self.chain_ms) - 1

    def calibrated(self, scales) -> "SplitCost":
        """Served / profiled step-time ratios (cost_calibration.CostCalibration.scales(): [K = 0..,
        keep-warm K=0, cold, ragged]) as an excess in ms on each depth's chain, chain(m) + (s_m - 1) x
        ms_uniform(b, m), so every uniform step costs s_m times its profile and allocate stays
        exact; plain decode (decode_ms) scales by s_0. Depth 0 takes the keep-warm slot.
        ms_uniform (12.0, 14.0), chain (0.5, 1.0), scales (1.0, 1.1, keep-warm 1.05, cold, ragged):
        chain -> (0.5 + 0.6, 1.0 + 1.4) = (1.1, 2.4)."""
        if not scales:
            return self
        chain = self.chain_ms.tolist()              # (lists: a few numpy calls, not one a depth)
        top = len(scales) - 1 - EXTRA               # slots: K = 0..top, keep-warm, cold, ragged
        for k, ms in zip(self.draft_lens, self.uniform_ms):
            s = scales[KEEP_WARM] if k == 0 else scales[min(k, top)]
            chain[k] += (s - 1.0) * ms
        arr = np.array(chain)
        arr.flags.writeable = False
        return self._with(chain_ms=arr, decode_ms=None if self.decode_ms is None else self.decode_ms * scales[0])

    def ragged(self, scales) -> "SplitCost":
        """The price of a step whose rows verify different K_i (the whole-forward path, not the
        decode graphs): the profile's split times the ragged slot's served / predicted ratio
        (scales[RAGGED]), the same factor for every vector, so allocate's choice among them is the
        profile's; plain decode (decode_ms) as calibrated, s_0.
        f (10.5, 11.0), chain (0.5, 1.0), ragged 1.2, s_0 1.02, decode 11.5 -> f (12.6, 13.2),
        chain (0.6, 1.2), decode 11.73."""
        if not scales:
            return self
        s = scales[RAGGED]
        f, chain = self.f_ms * s, self.chain_ms * s
        f.flags.writeable = chain.flags.writeable = False
        return self._with(f_ms=f, chain_ms=chain, uniform_ms=tuple(u * s for u in self.uniform_ms),
                          decode_ms=None if self.decode_ms is None else self.decode_ms * scales[0],
                          floor_ms=self.floor_ms * s)

    def scaled(self, factor: float) -> "SplitCost":
        """Every verify and chain price times `factor` (a per-row vector's known excess over the split,
        runtime/policy/step_prices.py ragged_factor); plain decode unchanged. f (10.5, 11.0) x 1.2 -> (12.6, 13.2)."""
        if factor == 1.0:
            return self
        f, chain = self.f_ms * factor, self.chain_ms * factor
        f.flags.writeable = chain.flags.writeable = False
        return self._with(f_ms=f, chain_ms=chain, uniform_ms=tuple(u * factor for u in self.uniform_ms),
                          floor_ms=self.floor_ms * factor)

    def plus(self, extra_ms) -> "SplitCost":
        """A prompt chunk's extra ms by depth (prefill_price.PromptSide.extra_ms, [K]) on each chain and on
        plain decode (depth 0's). chain (0.5, 1.0), decode 10.0, extra (2.0, 2.5) -> (2.5, 3.5), 12.0."""
        if not any(extra_ms):
            return self
        chain = self.chain_ms.copy()
        n = min(len(chain), len(extra_ms))
        chain[:n] += np.asarray(extra_ms[:n], dtype=float)
        chain.flags.writeable = False
        return self._with(chain_ms=chain, decode_ms=None if self.decode_ms is None else self.decode_ms + extra_ms[0],
                          uniform_ms=tuple(u + (extra_ms[k] if k < len(extra_ms) else 0.0)
                                           for k, u in zip(self.draft_lens, self.uniform_ms)),
                          floor_ms=self.floor_ms + min(extra_ms))

    def _with(self, **fields) -> "SplitCost":
        """A copy with `fields` replaced, unchecked (dataclasses.replace re-runs __init__: a
        tenth of a decision's host time)."""
        new = object.__new__(SplitCost)
        new.__dict__.update(self.__dict__, **fields)
        return new

    def ms(self, verify_tokens: int, depth: int) -> float:
        """Predicted step ms at V verify tokens, deepest chain m (inf: m not profiled)."""
        if not 0 <= depth <= self.max_depth or not self.b + depth <= verify_tokens <= self.b * (depth + 1):
            raise DynspecError(f"split cost: V={verify_tokens}, m={depth} is not a step of b={self.b} rows "
                               f"(b + m <= V <= b(m+1), m in 0..{self.max_depth})")
        return self.step_ms(verify_tokens, depth)

    def step_ms(self, verify_tokens: int, depth: int) -> float:
        """ms without the argument check."""
        return max(float(self.f_ms[verify_tokens] + self.chain_ms[depth]), self.floor_ms)


def _plain_curve(cm: CostModel, ns: np.ndarray, context: float) -> np.ndarray:
    """f(n) for every n in ns [N]: CostModel.row's interpolation of decode_ms (else K=0), vectorised."""
    grid = cm.decode if cm.decode is not None else tuple(tuple(r[0] for r in t) for t in cm.ms)
    xs = np.asarray(cm.batch_sizes, dtype=float)
    (ci, ct), _ = _segment(cm.context_lens, float(context), "context")

    def in_b(ys: Sequence[float]) -> np.ndarray:
        if len(xs) == 1:
            return np.full(ns.shape, float(ys[0]))
        i = np.clip(np.searchsorted(xs, ns, side="right") - 1, 0, len(xs) - 2)
        t = np.maximum((ns - xs[i]) / (xs[i + 1] - xs[i]), 0.0)
        y = np.asarray(ys, dtype=float)
        return _lerp(y[i], y[i + 1], t)

    y0 = in_b(grid[ci])
    return _lerp(y0, in_b(grid[ci + 1]), ct) if ct else y0


def _lerp(y0: np.ndarray, y1: np.ndarray, t) -> np.ndarray:
    """grid.lerp elementwise: past y1 (t > 1) the slope is floored at 0."""
    return np.where(t <= 1.0, y0 + t * (y1 - y0), y1 + (t - 1.0) * np.maximum(0.0, y1 - y0))
