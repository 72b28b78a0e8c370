"""Lazy draft sync's catch-up (docs/design.md, "Draft sync"): the draft's K/V of the entries a row
missed while it ran at K=0, written when it drafts again, before the step's draft work.

The draft is one layer, so the K/V of draft entry j = (x_j, h_{j-1}), at draft position j-1,
depends on that entry alone: what Eagle3Draft.extend_kv computes (keep-warm's own write). The
tokens come from the host (plan.CatchUp: the request's emitted tokens), the captures h_p from
the feature store (step_state.FeatureStore), where every decode row's step left them.
Example, spans (slot 2, draft positions 44..46) and (slot 0, 10..11): one extend_kv over 5
entries, tokens (x45 x46 x47 | x11 x12), features ring[2, 44..46 % cap] and ring[0, 10..11 % cap].
Runs eagerly (it happens on the iterations where rows resume), before any graph replay; every
TP rank runs it from the same broadcast plan.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from dynspec.runtime.engines.reference.attention import ragged_batch, to_device
from dynspec.runtime.engines.reference.step_state import StepParts
from dynspec.runtime.serving.plan import CatchUp


def catch_up(s: StepParts, spans: Sequence[CatchUp]) -> None:
    """Write the draft K/V of every span's entries, as one ragged batch: one extend_kv."""
    if not spans:
        return
    slots = [c.slot for c in spans]
    starts = [c.start for c in spans]
    lens = [len(c.tokens) for c in spans]
    batch = ragged_batch(s.slots.block_tables, slots, starts, lens, s.block_size)
    n = sum(lens)
    host = np.empty(3 * n, dtype=np.int64)            # [tokens | their slots | their draft positions]
    host[:n] = [t for c in spans for t in c.tokens]
    host[n:2 * n] = np.repeat(slots, lens)
    host[2 * n:] = np.concatenate([np.arange(c.start, c.start + len(c.tokens)) for c in spans])
    tokens, slot, pos = to_device(torch.from_numpy(host), s.device).split(n)
    s.draft.extend_kv(tokens, s.features.read(slot, pos), batch)
