"""The pure-decode step's device functions: static buffers in, static buffers out, graph-capturable.
The draft chain, the target's verify, acceptance and the draft's catch-up, on a step's parts `s`
(step_state.StepParts: its buffers and carried heads).

Token/hidden bookkeeping for one row (x_j = token at position j, h_j = target capture at j):
    target cache   positions 0..L-1 hold x_0..x_{L-1};  x_L (pending) is not in it yet
    draft entry j  = (x_j, h_{j-1}) -> predicts x_{j+1}; stored at draft cache position j-1
    carried state  next_draft[r]   = draft's guess for x_{L+1} (from entry L)
                   draft_hidden[r] = that entry's output hidden (fed to the next chain step)
                   last_capture[r] = h_{L-1} (to rebuild entry L when the draft went stale)

Speculative step, K drafts, worked for K=2, accepted n=1:
    chain      entry L   -> d1 = next_draft     entry L+1 = (d1, draft_hidden) -> d2   [B, 1] each
    verify     target([x_L, d1, d2] @ L..L+2)  -> g0 g1 g2, H_L..H_{L+2}        [B, K+1]
    accept     d1 == g0, d2 != g1  -> n = 1;  emitted = [d1, g1]  (E[:, :n+1])
    catch-up   draft entries L+1..L+3 = (E_i, H_{L+i}) @ draft positions L..L+2   [B, K+1]
               entries up to L+n+1 are right; the one at index n is the next step's entry L'
               -> new next_draft, draft_hidden, last_capture = H_{L+n}.  Later entries are
               overwritten before they are read.
Plain decode (K=0): target([x_L]) -> g0. The draft sync (docs/design.md, "Draft sync"): warm
writes the draft K/V of entry L+1 only; lazy stores h_L in the feature store (step_state.FeatureStore),
and the step where the row drafts again writes the missed entries first (lazy_sync.py); off
writes nothing. The first speculative step after a K=0 stretch rebuilds the draft head from
(x_L, last_capture) first (refresh). Every speculative step stores each decode row's h_L too (a
row at K_r = 0 in a K > 0 step may still be catching up).
"""
from __future__ import annotations

import torch

from dynspec.runtime.policy.acceptance import accepted_prefix, draft_uniforms
from dynspec.runtime.engines.reference.attention import RaggedBatch, uniform_batch
from dynspec.runtime.engines.reference.step_state import StepParts


def device_fn(s: StepParts, key, read: int | None) -> None:
    """The device work of a pure-decode GraphKey (graph_keys.py), uncaptured."""
    B = key.bucket
    if key.kind == "spec":
        speculate(s, B, key.k, read)
    elif key.kind == "decode":
        decode(s, B, key.sync, read)
    else:
        refresh(s, B, read)


def decode_rows(s: StepParts, B: int, q_pos: torch.Tensor, read: int | None) -> RaggedBatch:
    """Decode rows 0..B-1, row r's tokens at q_pos[r] ([B, T]), over `read` blocks of their
    tables (None: all). Where Triton runs always all, as in the decode graphs: the paged
    kernel's launch constants (PER, SPLITS) follow the table width, so an eager step at its
    own `read` (a K > 0 mixed iteration's draft chain and decode rows) would compile a kernel of
    its own on first use, 1-2 s inside a served step on the H200; at the graphs' width it runs
    theirs. Tiles past a row's last position load nothing. SDPA (CPU) gathers `read` blocks."""
    width = s.max_blocks_per_seq if s.ragged or not read else read
    return uniform_batch(s.slots.block_tables, s.buffers.slot[:B], q_pos, width, s.block_size)


def draft_next(s: StepParts, tokens, hidden, batch):
    """Draft forward over packed tokens -> (target-vocab argmax [N], output hidden [N, h])."""
    ids, dh = s.draft.run(tokens, hidden, batch, s.attention, greedy=True)
    return s.draft.to_target_ids(ids), dh


def refresh(s: StepParts, B: int, read) -> None:
    """Rebuild entry L of stale rows: (x_L, h_{L-1}) at draft position L-1."""
    buf = s.buffers
    slot = buf.slot[:B]
    batch = decode_rows(s, B, (buf.pos[:B] - 1)[:, None], read)
    d, h = draft_next(s, buf.x[:B], s.heads.last_capture[slot], batch)
    s.heads.set_heads(slot, draft=d, hidden=h)


def draft_chain(s: StepParts, B: int, K: int, read: int | None = None) -> torch.Tensor:
    """K-1 chain steps from the carried head -> drafts [B, K]."""
    slot, pos = s.buffers.slot[:B], s.buffers.pos[:B]
    drafts, h = [s.heads.next_draft[slot]], s.heads.draft_hidden[slot]
    for i in range(1, K):                                                # entries L+1..L+K-1
        d, h = draft_next(s, drafts[-1], h, decode_rows(s, B, (pos + i - 1)[:, None], read))
        drafts.append(d)
    return torch.stack(drafts, dim=1)                                    # [B, K]


def accept(s: StepParts, D, g):
    """drafts D [B, K] of rows 0..B-1, target greedy g [B, K+1] -> (accepted n [B], tokens
    E [B, K+1]): E[:, i] = d_{i+1} for i < n, else the target's token; emitted = E[:, :n+1].
    n <= row_k[r]: a row at K_r < K takes the target's token at index K_r at the latest, which
    followed only accepted drafts (lossless; the drafts past K_r are verified and dropped).
    Bernoulli models: d_i (at position pos + i) is accepted iff draft_uniforms(...) < p of the
    row's request (slot_p[slot], set from rate_of(model, key)). TraceReplay: d_i is accepted iff
    i <= r, r the request's recorded run length at its pending position (wrapping at its length)."""
    B, K = D.shape
    st, buf = s.slots, s.buffers
    steps = torch.arange(K + 1, device=D.device)
    slot, pos = buf.slot[:B], buf.pos[:B]
    u = draft_uniforms(st.accept_seed, st.slot_key[slot], pos[:, None] + steps[None, 1:])
    rand = u < st.slot_p[slot][:, None]                                              # [B, K]
    r = st.slot_trace[slot, pos % st.slot_trace_len[slot]]                          # [B] recorded run
    rand = torch.where(st.replay, steps[None, 1:] <= r[:, None], rand)
    n = accepted_prefix(torch.where(st.bernoulli, rand, D == g[:, :K]))             # [B]
    n = torch.minimum(n, buf.row_k[:B])          # row r accepts at most its own K_r (plan.row_k)
    return n, torch.where(steps[None] < n[:, None], torch.cat([D, g[:, -1:]], 1), g)


def speculate(s: StepParts, B: int, K: int, read) -> None:
    buf = s.buffers
    D = draft_chain(s, B, K, read)                                       # [B, K]
    vpos = buf.pos[:B, None] + torch.arange(K + 1, device=D.device)      # [B, K+1]
    batch = decode_rows(s, B, vpos, read)
    tokens = torch.cat([buf.x[:B, None], D], 1)                          # [B, K+1]
    g, H = s.target.run(tokens.reshape(-1), batch, capture=s.capture, attention=s.attention, greedy=True)
    n, E = accept(s, D, g.view(B, K + 1))
    catch_up(s, E, H.view(B, K + 1, -1), batch, n)
    buf.out_tokens[:B, : K + 1] = E
    buf.out_n[:B] = n


def decode(s: StepParts, B: int, sync: str, read) -> None:
    """Plain decode under draft sync `sync` (plan.StepPlan.sync). "warm" writes only the draft's
    K/V for the new entry (no draft attention, MLP or lm_head); "lazy" stores the capture h_L
    (no draft work: the catch-up writes the entry later); "off" neither. The draft head
    (next_draft, draft_hidden) is rebuilt by `refresh` when speculation resumes."""
    buf = s.buffers
    batch = decode_rows(s, B, buf.pos[:B, None], read)
    g, H = s.target.run(buf.x[:B], batch, capture=s.capture, attention=s.attention, greedy=True)   # [B]
    if sync == "warm":
        s.draft.extend_kv(g, H, batch)                                   # entry L+1 @ draft pos L
    elif sync == "lazy":
        s.features.write(buf.slot[:B], buf.pos[:B], H)                  # h_L, for entry L+1
    s.heads.set_heads(buf.slot[:B], capture=H)
    buf.out_tokens[:B, 0] = g
    buf.out_n[:B] = 0


def catch_up(s: StepParts, E, H, batch, n) -> None:
    """Draft entries L+1..L+T from (E_i, H_i) at draft positions L..L+T-1; keep index n; h_L into
    the feature store (lazy sync). E [B, T], H [B, T, w]."""
    B, T = E.shape
    d, h = draft_next(s, E.reshape(-1), H.reshape(B * T, -1), batch)
    rows, slot = torch.arange(B, device=E.device), s.buffers.slot[:B]
    s.heads.set_heads(slot, d.view(B, T)[rows, n], h.view(B, T, -1)[rows, n], H[rows, n])
    s.features.write(slot, s.buffers.pos[:B], H[:, 0])
