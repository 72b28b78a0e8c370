"""Lazy draft sync's catch-up, as the cost-model policies price it (docs/design.md, "Draft sync",
"The resumption's price"). Pure but for numpy's least squares.

Under lazy sync a K=0 step runs no draft work: its rows fall one position behind and a prompt
chunk riding in it is stored. The first step that drafts again writes the draft's K/V of what was
missed first (runtime/serving/draft_sync.py), one extend_kv over all its entries:
    catch_up_ms(n) = fixed_ms + ms_per_entry x n      (n > 0 entries; 0 ms for none)
the line through the profile's catch_up record (`profile --catch-up N`: the K=1 step of b rows that
each catch up N entries first, less the plain K=1 step, against b x N entries).
Worked example, the H100's 0f964d7 profile: about 0.98 ms + 0.00031 ms an entry, so a 128-token
prompt stored in a K=0 step costs 1.02 ms to catch up, about 0.14 of a b=16 plain decode step.
"""
from __future__ import annotations

from dataclasses import dataclass

from dynspec.errors import DynspecError


@dataclass(frozen=True)
class CatchUpPrice:
    fixed_ms: float = 0.0
    ms_per_entry: float = 0.0

    def ms(self, entries: int, horizon: float = 1.0) -> float:
        """catch_up_ms(n), its entries' part shared by `horizon` steps: CatchUpPrice(1.0, 0.001).ms(100)
        = 1.1; .ms(100, 8) = 1.0125; .ms(0) = 0."""
        return self.fixed_ms + self.ms_per_entry * entries / horizon if entries > 0 else 0.0


def catch_up_price(profile, where: str = "profile") -> CatchUpPrice | None:
    """The least-squares line through a Profile's catch_up record, both terms clamped at 0; None
    without a record (or without the table of its context). The H100's fec0955 profile: b=1 0.67 ms
    for 100 entries, ..., b=64 2.65 ms for 6400 -> about CatchUpPrice(0.70, 0.0003)."""
    import numpy as np

    rec = profile.meta.get("catch_up")
    if not rec:
        return None
    table = next((t for t in profile.tables if isinstance(rec, dict) and t.context_len == rec.get("context_len")), None)
    if table is None:
        return None
    try:
        pts = [(int(b) * int(rec["tokens"]), float(ms) - table.iteration_ms[int(b)][int(rec["k"])])
               for b, ms in rec["ms"].items()]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DynspecError(f"{where}: field 'catch_up' must be {{tokens, k, context_len, ms: {{b: ms}}}} over the "
                           f"profiled batch sizes and K ({type(e).__name__}: {e})") from None
    if len(pts) < 2:
        return CatchUpPrice(max(pts[0][1], 0.0) if pts else 0.0)
    slope, fixed = np.polyfit([x for x, _ in pts], [y for _, y in pts], 1)
    return CatchUpPrice(max(float(fixed), 0.0), max(float(slope), 0.0))
