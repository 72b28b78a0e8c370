"""What lets one step's outputs feed the next on the device, and the host read of a step's result
apart from its launch: the reference engine's side of the executor's overlapped loop
(docs/design.md, "The overlapped loop").

Per-slot carried copy, written at the end of a step whose plan has `carry` set:
    slot_tok[s]   the row's next pending token: E[r, n_r] (the last emitted), or a last chunk's g0
    slot_pos[s]   its position: pos[r] + n_r + 1, or a last chunk's prompt length P
A row of the next plan with from_device set takes x / pos from there (`gather_carried`), so the
host never needs the accepted count n_r before launching the next step.
Example, K=2: row at pos 40 in slot 3 accepts n=1, E = [a, b, c] -> slot_tok[3] = b, slot_pos[3] = 42.

Results: `ResultReader.stage` queues one device -> host copy of [b accepted | b x (K+1) tokens |
first tokens] into one of two host buffers (pinned on CUDA) and records an event; `read` waits on
that event only (the step's one host sync) and unpacks it. Two buffers: step i+1's copy is queued
while step i's buffer is still to be read; the executor reads i before it launches i+2.

Timing without extra syncs, per step: an event (CUDA, timing enabled) at the start of the launch
and one after its result copy; on CPU the engine's clock at the same two points (the CPU runs the
step inside the launch). device_s = end - start; idle_s = start - previous step's end, i.e. the
time the device had nothing of ours queued between two steps (0 when the launch came first).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from dynspec.runtime.engines.reference.attention import RaggedBatch
from dynspec.runtime.engines.reference.step_state import StepBuffers
from dynspec.runtime.serving.plan import StepPlan, StepResult


def gather_carried(buf: StepBuffers, B: int) -> None:
    """Rows 0..B-1 with from_dev set take their pending token and position from the per-slot
    copy, in place (x, pos are the graphs' static inputs) [B] each."""
    carried = buf.from_dev[:B] != 0
    s = buf.slot[:B]
    buf.x[:B].copy_(torch.where(carried, buf.slot_tok[s], buf.x[:B]))
    buf.pos[:B].copy_(torch.where(carried, buf.slot_pos[s], buf.pos[:B]))


def save_carried(plan: StepPlan, buf: StepBuffers, firsts) -> None:
    """The per-slot copy after a step of `plan` in buf: decode rows from out_tokens / out_n,
    last chunks from their first tokens `firsts` [n_last] and staged (slot, P)."""
    b, nl = plan.batch_size, plan.last_chunks
    if b:
        s, n = buf.slot[:b], buf.out_n[:b]
        buf.slot_tok[s] = buf.out_tokens[:b].gather(1, n[:, None]).squeeze(1)
        buf.slot_pos[s] = buf.pos[:b] + n + 1
    if nl:
        ls = buf.last_slot[:nl]
        buf.slot_tok[ls] = firsts[:nl]
        buf.slot_pos[ls] = buf.last_pos[:nl]


def last_chunk_rows(plan: StepPlan) -> tuple[list[int], list[int]]:
    """(slots, prompt lengths P) of the plan's last chunks, in plan order."""
    last = [c for c in plan.chunks if c.last]
    return [c.slot for c in last], [c.start + len(c.tokens) for c in last]


def with_device_rows(batch: RaggedBatch, pos, slot, block_tables, B: int, T: int) -> RaggedBatch:
    """A mixed iteration's host-built batch with its B decode rows (packed first, T tokens each)
    moved to the device positions pos[:B] + 0..T-1: positions, K/V write index and query
    positions. The chunks' part and the blocks read (an upper bound) stay."""
    bs = batch.block_size
    q = pos[:B, None] + torch.arange(T, device=pos.device)                    # [B, T]
    blk = torch.gather(block_tables[slot[:B]], 1, q // bs)                      # [B, T]
    positions, write, q_pos = batch.positions.clone(), batch.write_index.clone(), batch.q_pos.clone()
    positions[:B * T] = q.reshape(-1)
    write[:B * T] = (blk * bs + q % bs).reshape(-1)
    q_pos[:B, :T] = q
    return replace(batch, positions=positions, write_index=write, q_pos=q_pos)


@dataclass(frozen=True)
class StepHandle:
    """A launched step: where its result will be, and how to tell it is there."""
    b: int
    k: int
    last: tuple[bool, ...]      # [chunks] which chunks end their prompt
    buffer: torch.Tensor        # host buffer the result copy lands in
    size: int                   # its used length: b + b*(K+1) + n_last
    start: object               # CUDA event, or the engine's clock (CPU)
    end: object
    prev_end: object            # the previous step's end (None: the first step)


class ResultReader:
    """Two alternating host buffers for step results, and the step timing (module docstring)."""

    def __init__(self, device: torch.device, size: int):
        self.cuda = device.type == "cuda"
        self._bufs = [self._alloc(size), self._alloc(size)]
        self._turn = 0
        self._prev_end = None

    def _alloc(self, size: int) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.long, pin_memory=self.cuda)

    def mark(self):
        """A point on the device timeline (CUDA: an event recorded now), else the clock."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stage(self, plan: StepPlan, out: torch.Tensor, start) -> StepHandle:
        """Queue the copy of `out` [size] (device) into the next host buffer -> its handle."""
        i, n = self._turn, out.numel()
        if self._bufs[i].numel() < n:          # more last chunks than sized for (warm-ups)
            self._bufs[i] = self._alloc(n)
        buf = self._bufs[i]
        buf[:n].copy_(out, non_blocking=self.cuda)
        end = self.mark()
        self._turn ^= 1
        handle = StepHandle(plan.batch_size, plan.k, tuple(c.last for c in plan.chunks), buf, n, start, end,
                            self._prev_end)
        self._prev_end = end
        return handle

    def read(self, h: StepHandle) -> StepResult:
        """Wait for h's copy (the one host sync of a step), then unpack it."""
        if self.cuda:
            h.end.synchronize()
            device_s = h.start.elapsed_time(h.end) / 1e3
            idle_s = None if h.prev_end is None else max(0.0, h.prev_end.elapsed_time(h.start) / 1e3)
        else:
            device_s = h.end - h.start
            idle_s = None if h.prev_end is None else max(0.0, h.start - h.prev_end)
        host = h.buffer[:h.size].tolist()
        b, T = h.b, h.k + 1
        n, toks = host[:b], host[b: b + b * T]
        it = iter(host[b + b * T:])
        return StepResult(
            accepted=tuple(n),
            emitted=tuple(tuple(toks[r * T: r * T + a + 1]) for r, a in enumerate(n)),
            draft_warm=h.k > 0,                    # after K=0 the draft head is rebuilt on resume
            first_tokens=tuple(next(it) if last else None for last in h.last),
            device_s=device_s,
            idle_s=idle_s,
        )
