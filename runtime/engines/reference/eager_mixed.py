"""A mixed iteration (decode rows + prompt chunks in one target forward) run eagerly: what runs
above the top token bucket, past WholeMixed.CHUNKS chunks, or before capture_whole_graphs.
Packing: the B = plan.bucket decode rows' T tokens (rows b..B-1 padding; every row at T, its
acceptance capped at its own K_i), then the chunks' tokens; the whole graphs pack the rows
unpadded (mixed_graphs.py)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dynspec.runtime.engines.reference.attention import RaggedBatch, ragged_batch, to_device
from dynspec.runtime.engines.reference.carry import with_device_rows
from dynspec.runtime.engines.reference.draft_chain import accept, decode_rows, draft_chain, draft_next, refresh
from dynspec.runtime.engines.reference.mixed_layout import store_slots
from dynspec.runtime.engines.reference.step_state import StepParts
from dynspec.runtime.serving.plan import StepPlan


@dataclass(frozen=True)
class MixedInputs:
    """An eager mixed iteration's device inputs (mixed_inputs)."""
    prompt: torch.Tensor          # [Nc] the chunks' tokens
    nxt: torch.Tensor             # [Nc] their draft inputs x_{p+1} (a last chunk's last: set to g0)
    last_idx: torch.Tensor        # [n_last] packed index of each last chunk's last token
    last_slot: torch.Tensor       # [n_last] its slot
    store_slot: torch.Tensor      # [Nc] each chunk token's feature-store slot (mixed_layout.store_slots)
    batch: RaggedBatch            # every row: B decode rows then the chunks
    c_batch: RaggedBatch          # the chunks alone (their own packing from 0)
    nd: int                       # B x T decode tokens ahead of the chunks


def eager_mixed(s: StepParts, plan: StepPlan, read: int) -> torch.Tensor:
    """The iteration on the step's parts s -> the first generated token of each last chunk [n_last]."""
    b, B, K = plan.batch_size, plan.bucket, plan.k
    buf = s.buffers
    m = mixed_inputs(s, plan)
    nd = m.nd
    if b and K and any(plan.stale):
        refresh(s, B, read)
    D = draft_chain(s, B, K, read) if b and K else None                  # [B, K]
    tokens = torch.cat([buf.x[:B, None], D], 1).reshape(-1) if D is not None else buf.x[:B]
    if b and plan.carried_rows:          # the host laid the decode rows out at upper bounds
        m = replace(m, batch=with_device_rows(m.batch, buf.pos, buf.slot, s.slots.block_tables, B, K + 1))
    logit_index = torch.cat([torch.arange(nd, device=s.device), m.last_idx])
    greedy, H = s.target.run(torch.cat([tokens, m.prompt]) if b else m.prompt, m.batch,
                             capture=s.capture if plan.draft else (), logit_index=logit_index,
                             attention=s.attention, greedy=True)         # [nd + n_last], one launch a layer
    firsts = greedy[nd:]
    m.nxt[m.last_idx - nd] = firsts          # draft entries (x_{p+1}, h_p): a last chunk's x_e is g0
    if b and K:
        mixed_catch_up(s, plan, D, greedy[:nd], H, m)
    else:
        mixed_decode_end(s, plan, greedy[:nd], H, m, read)
    return firsts


def mixed_inputs(s: StepParts, plan: StepPlan) -> MixedInputs:
    """The chunks' side of an eager mixed iteration, every host -> device copy issued before
    the first kernel (the draft's included): a copy from pageable memory waits for the stream,
    so one issued later would stall the host until the work queued before it ends; these are
    pinned (to_device, ragged_batch).
    One tensor, split: [prompt tokens Nc | their draft inputs Nc | last chunks' packed index |
    their slot | each token's store slot Nc]. Packed index of chunk token j: B*T + j."""
    b, B, T, chunks = plan.batch_size, plan.bucket, plan.k + 1, plan.chunks
    nd = i = plan.padded_decode_tokens
    ends = []
    for c in chunks:
        i += len(c.tokens)
        ends.append(i - 1)                                               # packed index of its last token
    last_rows = [j for j, c in enumerate(chunks) if c.last]
    host = [[t for c in chunks for t in c.tokens],
            [t for c in chunks for t in c.tokens[1:] + (c.next_token or 0,)],
            [ends[j] for j in last_rows], [chunks[j].slot for j in last_rows],
            store_slots(chunks, s.features.cap, s.buffers.pad_slot).tolist()]
    flat = to_device(torch.tensor([x for part in host for x in part], dtype=torch.long), s.device)
    prompt, nxt, last_idx, last_slot, store_slot = flat.split([len(x) for x in host])
    pad = B - b                                                          # padding rows: slot pad_slot at 1
    slots = list(plan.slots) + [s.buffers.pad_slot] * pad + [c.slot for c in chunks]
    starts = list(plan.positions) + [1] * pad + [c.start for c in chunks]
    lens = [T] * B + [len(c.tokens) for c in chunks]
    tables, bs = s.slots.block_tables, s.block_size
    c_batch = ragged_batch(tables, slots[B:], starts[B:], lens[B:], bs)
    batch = ragged_batch(tables, slots, starts, lens, bs) if B else c_batch
    return MixedInputs(prompt, nxt.clone(), last_idx, last_slot, store_slot, batch, c_batch, nd)


def mixed_catch_up(s: StepParts, plan: StepPlan, D, g, H, m: MixedInputs) -> None:
    """K > 0: accept over the B rows (g [B*T]), then one draft pass over the rows' catch-up
    entries and the chunks' entries; the b real rows and the last chunks keep their heads."""
    b, B, T, buf = plan.batch_size, plan.bucket, plan.k + 1, s.buffers
    n, E = accept(s, D, g.view(B, T))
    s.features.write(buf.slot[:B], buf.pos[:B], H[: m.nd].view(B, T, -1)[:, 0])      # h_L (lazy sync)
    buf.out_tokens[:b, :T] = E[:b]
    buf.out_n[:b] = n[:b]
    d, h = draft_next(s, torch.cat([E.reshape(-1), m.nxt]), H, m.batch)
    rows, at = torch.arange(b, device=s.device), n[:b]
    s.heads.set_heads(buf.slot[:b], d[: m.nd].view(B, T)[rows, at], h[: m.nd].view(B, T, -1)[rows, at],
                      H[: m.nd].view(B, T, -1)[rows, at])
    last_heads(s, m, d, h, H, 0)


def mixed_decode_end(s: StepParts, plan: StepPlan, g, H, m: MixedInputs, read: int) -> None:
    """K = 0: the b rows' outputs and their draft sync (warm: the K/V; lazy: the features), then the
    draft's pass over the chunks (plan.store_chunks: their captures stored instead, each last chunk's
    carried for its refresh); without the draft (plan.draft False) the rows' outputs alone
    (H is None: nothing captured)."""
    b, buf = plan.batch_size, s.buffers
    if b:
        if plan.keep_warm:
            s.draft.extend_kv(g[:b], H[:b], decode_rows(s, b, buf.pos[:b, None], read))
        elif plan.lazy:
            s.features.write(buf.slot[:b], buf.pos[:b], H[:b])
        if plan.draft:
            s.heads.set_heads(buf.slot[:b], capture=H[:b])
        buf.out_tokens[:b, 0] = g[:b]
        buf.out_n[:b] = 0
    if plan.store_chunks:
        s.features.write(m.store_slot, m.c_batch.positions, H[m.nd:])
        s.heads.set_heads(m.last_slot, capture=H[m.last_idx])
    elif plan.draft:
        d, h = draft_next(s, m.nxt, H[m.nd:], m.c_batch)
        last_heads(s, m, d, h, H, m.nd)


def last_heads(s: StepParts, m: MixedInputs, d, h, H, offset: int) -> None:
    """The carried state of each last chunk's slot, from its last token (d, h indexed from offset)."""
    if m.last_idx.numel():
        s.heads.set_heads(m.last_slot, d[m.last_idx - offset], h[m.last_idx - offset], H[m.last_idx])
