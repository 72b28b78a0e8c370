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
from dynspec.runtime.engines.reference.draft_chain import decode_rows, draft_chain, draft_next, refresh
from dynspec.runtime.plan import StepPlan


@dataclass(frozen=True)
class MixedInputs:
    """An eager mixed iteration's device inputs (mixed_inputs)."""
    prompt: torch.Tensor          # [Nc] the chunks' tokens
    nxt: torch.Tensor             # [Nc] their draft inputs x_{p+1} (a last chunk's last: set to g0)
    last_idx: torch.Tensor        # [n_last] packed index of each last chunk's last token
    last_slot: torch.Tensor       # [n_last] its slot
    batch: RaggedBatch            # every row: B decode rows then the chunks
    c_batch: RaggedBatch          # the chunks alone (their own packing from 0)
    nd: int                       # B x T decode tokens ahead of the chunks


def eager_mixed(e, plan: StepPlan, read: int) -> torch.Tensor:
    """The iteration on engine e -> the first generated token of each last chunk [n_last]."""
    b, B, K = plan.batch_size, plan.bucket, plan.k
    m = e.mixed_inputs(plan)
    nd = m.nd
    if b and K and any(plan.stale):
        refresh(e, B, read)
    D = draft_chain(e, B, K, read) if b and K else None                  # [B, K]
    tokens = torch.cat([e.x[:B, None], D], 1).reshape(-1) if D is not None else e.x[:B]
    attention = e.decode_attention()                                     # one launch over every row
    if b and plan.carried_rows:          # the host laid the decode rows out at upper bounds
        m = replace(m, batch=with_device_rows(m.batch, e.pos, e.slot, e.block_tables, B, K + 1))
    logit_index = torch.cat([torch.arange(nd, device=e.device), m.last_idx])
    greedy, H = e.target.run(torch.cat([tokens, m.prompt]) if b else m.prompt, m.batch,
                             capture=e.capture if plan.draft else (), logit_index=logit_index,
                             attention=attention, greedy=True)           # [nd + n_last]
    firsts = greedy[nd:]
    m.nxt[m.last_idx - nd] = firsts          # draft entries (x_{p+1}, h_p): a last chunk's x_e is g0
    if b and K:
        mixed_catch_up(e, plan, D, greedy[:nd], H, m, attention)
    else:
        mixed_decode_end(e, plan, greedy[:nd], H, m, read)
    return firsts


def mixed_inputs(e, plan: StepPlan) -> MixedInputs:
    """The chunks' side of an eager mixed iteration, every host -> device copy issued before
    the first kernel (the draft's included): a copy from pageable memory waits for the stream,
    so one issued later would stall the host until the work queued before it ends; these are
    pinned (to_device, ragged_batch).
    One tensor, split: [prompt tokens Nc | their draft inputs Nc | last chunks' packed index |
    their slot]. Packed index of chunk token j: B*T + j."""
    b, B, T, chunks = plan.batch_size, plan.bucket, plan.k + 1, plan.chunks
    nd = i = plan.padded_decode_tokens
    ends = []
    for c in chunks:
        i += len(c.tokens)
        ends.append(i - 1)                                               # packed index of its last token
    last_rows = [j for j, c in enumerate(chunks) if c.last]
    host = [[t for c in chunks for t in c.tokens],
            [t for c in chunks for t in c.tokens[1:] + (c.next_token or 0,)],
            [ends[j] for j in last_rows], [chunks[j].slot for j in last_rows]]
    flat = to_device(torch.tensor([x for part in host for x in part], dtype=torch.long), e.device)
    prompt, nxt, last_idx, last_slot = flat.split([len(x) for x in host])
    pad = B - b                                                          # padding rows: slot pad_slot at 1
    slots = list(plan.slots) + [e.pad_slot] * pad + [c.slot for c in chunks]
    starts = list(plan.positions) + [1] * pad + [c.start for c in chunks]
    lens = [T] * B + [len(c.tokens) for c in chunks]
    c_batch = ragged_batch(e.block_tables, slots[B:], starts[B:], lens[B:], e.block_size)
    batch = ragged_batch(e.block_tables, slots, starts, lens, e.block_size) if B else c_batch
    return MixedInputs(prompt, nxt.clone(), last_idx, last_slot, batch, c_batch, nd)


def mixed_catch_up(e, plan: StepPlan, D, g, H, m: MixedInputs, attention) -> None:
    """K > 0: accept over the B rows (g [B*T]), then one draft pass over the rows' catch-up
    entries and the chunks' entries; the b real rows and the last chunks keep their heads."""
    b, B, T, dev = plan.batch_size, plan.bucket, plan.k + 1, e.device
    n, E = e.accept(D, g.view(B, T))
    e.out_tokens[:b, :T] = E[:b]
    e.out_n[:b] = n[:b]
    d, h = draft_next(e, torch.cat([E.reshape(-1), m.nxt]), H, m.batch, attention)
    rows, slot = torch.arange(b, device=dev), e.slot[:b]
    e.next_draft[slot] = d[: m.nd].view(B, T)[rows, n[:b]]
    e.draft_hidden[slot] = h[: m.nd].view(B, T, -1)[rows, n[:b]]
    e.last_capture[slot] = H[: m.nd].view(B, T, -1)[rows, n[:b]]
    last_heads(e, m, d, h, H, 0)


def mixed_decode_end(e, plan: StepPlan, g, H, m: MixedInputs, read: int) -> None:
    """K = 0: the b rows' outputs and keep-warm K/V, then the draft's pass over the chunks;
    without the draft (plan.draft False) the rows' outputs alone (H is None: nothing captured)."""
    b = plan.batch_size
    if b:
        if plan.keep_warm:
            e.draft.extend_kv(g[:b], H[:b], decode_rows(e, b, e.pos[:b, None], read))
        if plan.draft:
            e.last_capture[e.slot[:b]] = H[:b]
        e.out_tokens[:b, 0] = g[:b]
        e.out_n[:b] = 0
    if plan.draft:
        d, h = draft_next(e, m.nxt, H[m.nd:], m.c_batch, e.decode_attention())
        last_heads(e, m, d, h, H, m.nd)


def last_heads(e, m: MixedInputs, d, h, H, offset: int) -> None:
    """The carried state of each last chunk's slot, from its last token (d, h indexed from offset)."""
    if m.last_idx.numel():
        e.next_draft[m.last_slot] = d[m.last_idx - offset]
        e.draft_hidden[m.last_slot] = h[m.last_idx - offset]
        e.last_capture[m.last_slot] = H[m.last_idx]
