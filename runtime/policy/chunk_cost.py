"""What a prompt chunk riding in an iteration adds to its decode rows' time, from the profile's
chunk axis (profile.json tables' `chunk_ms`, `dynspec profile --chunk-lens 128,512`; the reader:
runtime/policy/cost_model.py). Pure: no torch.

    extra(b, K, ctx, T) = ms of the step with b rows at K and a T-token chunk - ms of the rows alone
    the rows alone: iteration_ms(b, K) for K > 0; decode_ms(b) (plain decode) for K = 0, the chunk
    step at K = 0 being timed without keep-warm (a mixed K=0 step runs the draft over the chunk, not
    over the rows).
Interpolated as CostModel.row does in b and context (bilinear on the profiled grid, clamped below,
the last segment extended above), then linearly in T between the profiled chunk lengths: below the
shortest, its extra (the whole-forward step's fixed part is paid by any chunk); above the longest,
the last segment extended (one chunk length: in proportion to T).
Worked example, b=64, context 128, chunk lengths 128 and 512:
    extra K=0: 2.0 ms at 128, 6.8 ms at 512     T=320 -> 4.4;  T=32 -> 2.0;  T=1024 -> 13.2
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from dynspec.errors import DynspecError
from dynspec.runtime.policy.grid import lerp as _lerp, segment as _segment


@dataclass(frozen=True)
class ChunkCost:
    chunk_lens: tuple[int, ...]                          # ascending
    extra: tuple                                         # [context][chunk][batch size][K index] ms

    @classmethod
    def from_tables(cls, tables, batch_sizes, draft_lens, where: str = "profile") -> "ChunkCost | None":
        """The grid from a profile's ContextTables (None where no table has chunk_ms); every table
        needs the same chunk lengths, each with iteration_ms's batch sizes and K's, and decode_ms."""
        timed = [t.chunk_ms for t in tables if t.chunk_ms is not None]
        if not timed:
            return None
        lens = tuple(sorted(timed[0]))
        grid = []
        for i, t in enumerate(tables):
            at = f"{where}: tables[{i}]"
            if t.chunk_ms is None or tuple(sorted(t.chunk_ms)) != lens:
                raise DynspecError(f"{at}: chunk_ms has chunks {sorted(t.chunk_ms or ())}, the first table "
                                   f"{list(lens)}; every table needs the same chunk lengths")
            if t.decode_ms is None:
                raise DynspecError(f"{at}: chunk_ms needs decode_ms (a K=0 chunk step is priced over plain decode)")
            per_chunk = []
            for c in lens:
                rows = t.chunk_ms[c]
                if tuple(sorted(rows)) != tuple(batch_sizes) or any(tuple(sorted(r)) != tuple(draft_lens)
                                                                     for r in rows.values()):
                    raise DynspecError(f"{at}: chunk_ms[{str(c)!r}] must time every batch size {list(batch_sizes)} "
                                       f"at every K {list(draft_lens)}, as iteration_ms does")
                per_chunk.append(tuple(tuple(rows[b][k] - (t.decode_ms[b] if k == 0 else t.iteration_ms[b][k])
                                             for k in draft_lens) for b in batch_sizes))
            grid.append(tuple(per_chunk))
        return cls(lens, tuple(grid))

    def row(self, cost, b: float, context: float, tokens: int) -> tuple[float, ...]:
        """[K index] extra ms of a `tokens`-token chunk at (b, context) on `cost`'s grid (a CostModel);
        all zero for tokens <= 0."""
        n = len(cost.draft_lens)
        if tokens <= 0:
            return (0.0,) * n
        (ci, ct), _ = _segment(cost.context_lens, float(context), "context")
        (bi, bt), _ = _segment(cost.batch_sizes, float(b), "b")

        def at(c: int, j: int) -> tuple[float, ...]:        # [K] at (b, context c, chunk j)
            ys = self.extra[c][j]
            return tuple(_lerp(y0, y1, bt) for y0, y1 in zip(ys[bi], ys[bi + 1])) if bt else ys[bi]

        def in_ctx(j: int) -> tuple[float, ...]:
            y0 = at(ci, j)
            return tuple(_lerp(a, z, ct) for a, z in zip(y0, at(ci + 1, j))) if ct else y0

        lens = self.chunk_lens
        if len(lens) == 1:
            return tuple(max(0.0, y) * max(1.0, tokens / lens[0]) for y in in_ctx(0))
        (ji, jt), _ = _segment(lens, float(tokens), "chunk")
        return tuple(max(0.0, _lerp(y0, y1, jt)) for y0, y1 in zip(in_ctx(ji), in_ctx(ji + 1)))


@dataclass(frozen=True)
class FittedChunk:
    """A chunk's extra from the device's fitted step prices (step_prices.py), for a profile without
    the chunk axis; the same row() as ChunkCost:
        extra(K, T) = max(0, chunk_fixed_ms + chunk_ms_per_token T) + draft_chunk_ms_per_token T [K > 0]
    The draft's pass over the chunk is paid by K > 0 steps only: lazy draft sync (the default) stores
    a K=0 step's chunk for a later catch-up (plan.store_chunks).
    Worked example, the H100's prices (-2.015, 0.0301, 0.00367), T = 256: K=0 5.68 ms; K>0 6.62 ms."""
    fixed_ms: float
    ms_per_token: float
    draft_ms_per_token: float

    def row(self, cost, b: float, context: float, tokens: int) -> tuple[float, ...]:
        """[K index of cost.draft_lens] extra ms of a `tokens`-token chunk (b, context: unused)."""
        if tokens <= 0:
            return (0.0,) * len(cost.draft_lens)
        target = max(0.0, self.fixed_ms + self.ms_per_token * tokens)
        return tuple(target + (self.draft_ms_per_token * tokens if k else 0.0) for k in cost.draft_lens)


def with_fitted_chunks(cost, prices):
    """`cost` (a CostModel) with its chunks priced by `prices` (a StepPrices or None) where its profile
    has no chunk axis and the prices fit a chunk token; otherwise `cost` itself."""
    if cost.chunk is not None or prices is None or prices.chunk_ms_per_token is None:
        return cost
    return replace(cost, chunk=FittedChunk(prices.chunk_fixed_ms, prices.chunk_ms_per_token,
                                           prices.draft_chunk_ms_per_token))
