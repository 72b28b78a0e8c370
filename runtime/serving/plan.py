"""Values that cross the executor/engine boundary once per iteration, and the pure rules
that shape an iteration under the token budget `max_num_tokens`.

K is decided once, from b = the number of decode rows, before anything is shaped. Each decode
row carries K+1 tokens; prompt chunks take what is left of the budget. A per-request policy gives
each row its own K_i <= K (`row_k`; K = max K_i): row i verifies at most K_i drafts and accepts
at most K_i of them (docs/design.md, "Per-request draft length").

Worked example, budget 16, decode rows b=3 at lengths (5, 9, 7), policy(3) = 4, a 20-token
prompt waiting:
    cap_k(4, 3, 16) = 4            3 x (4+1) = 15 <= 16
    decode tokens   15             row r: [pending_r, d1_r .. d4_r] at positions P_r .. P_r+4
    prompt chunk    16 - 15 = 1    prompt[0:1] at position 0; the other 19 ride in later iterations
A request joins the decode rows the iteration after its last chunk.

Rows carried on the device (docs/design.md, "The overlapped loop"): a row with from_device[r]
set continues from the step launched just before this one, whose result the
host has not read yet. Its pending token and position are the engine's per-slot copy written at
the end of that step (`carry`); the plan's `positions[r]` is an upper bound (the previous step's
position + its K + 1), used only to size what the step reads, and `pending[r]` is a placeholder.
Example: a row at position 40 in a K=3 step, then from_device in the next: positions[r] = 44,
the engine runs it at 40 + accepted + 1, one of 41..44.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

from dynspec.errors import DynspecError

if TYPE_CHECKING:
    from dynspec.runtime.policy.acceptance import AcceptanceModel


@dataclass(frozen=True)
class PromptChunk:
    """Prompt tokens start..start+len(tokens)-1 of the sequence in `slot`."""
    slot: int
    start: int                      # position of tokens[0]
    tokens: tuple[int, ...]
    next_token: int | None          # the prompt token after the chunk; None: this is the last chunk

    @property
    def last(self) -> bool:
        return self.next_token is None


DRAFT_SYNCS = ("lazy", "warm", "off")     # how the draft follows K=0 rows (docs/design.md, "Draft sync")


def sync_mode(draft_sync: str | bool, where: str = "draft_sync") -> str:
    """A draft sync mode, one of DRAFT_SYNCS; a bool is the older keep_warm (True "warm", False
    "off"). where: the field or flag named in the error. sync_mode(True) = "warm"."""
    if isinstance(draft_sync, bool):
        return "warm" if draft_sync else "off"
    if draft_sync not in DRAFT_SYNCS:
        raise DynspecError(f"{where}={draft_sync!r} is not one of {', '.join(DRAFT_SYNCS)}")
    return draft_sync


@dataclass(frozen=True)
class CatchUp:
    """Lazy draft sync (docs/design.md, "Draft sync"): the draft's K/V of draft positions
    start..start+len(tokens)-1 of the sequence in `slot`, written before the step's draft work.
    Draft position p holds entry (x_{p+1}, h_p): tokens[i] = x_{start+i+1} (the request's own
    tokens, from the host), h_p from the engine's feature store.
    Example: a row at pending position 50 after 6 lazy K=0 steps (positions 44..49) resumes K:
    CatchUp(slot, 44, (x45, .., x49)) writes draft positions 44..48, the refresh of its head 49."""
    slot: int
    start: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class StepPlan:
    k: int                          # drafted tokens per decode row (0 = plain decode)
    batch_size: int                 # b decode rows
    bucket: int                     # padded row count >= b (one CUDA graph per (bucket, K)); 0 if b = 0
    positions: tuple[int, ...]      # [b] KV length of each row = position of its pending token
    pending: tuple[int, ...]        # [b] last emitted token of each row, not yet seen by the target
    stale: tuple[bool, ...]         # [b] rows whose draft head must be rebuilt (after any K=0 step)
    keep_warm: bool                 # K=0 only: the draft extends its KV over the new token
    slots: tuple[int, ...] = ()     # [b] each row's cache slot (default: 0..b-1)
    chunks: tuple[PromptChunk, ...] = ()   # prompt chunks riding in the same forward
    from_device: tuple[bool, ...] = ()     # [b] rows whose pending token and position are the engine's
                                           # per-slot copy (positions[r]: an upper bound); default none
    carry: bool = False             # write each row's next pending token and position (and each last
                                    # chunk's first token and P) to the engine's per-slot copy
    draft: bool = True              # False: the target alone (a policy that never drafts): no draft
                                    # pass over prompt chunks, no draft state kept
    row_k: tuple[int, ...] = ()     # [b] each row's own K_i <= k (a per-request policy); default all k
    lazy: bool = False              # lazy draft sync: K=0 rows keep their target features in the engine's
                                    # store instead of extending the draft (keep_warm is False then)
    catch_up: tuple[CatchUp, ...] = ()   # lazy: the draft K/V to write before the step's draft work
    store_chunks: bool = False      # lazy, K=0 (rows or none): the chunks' draft pass is deferred (their
                                    # target features stored; the draft catches up when the row drafts)

    def __post_init__(self) -> None:
        if not self.slots:
            object.__setattr__(self, "slots", tuple(range(self.batch_size)))
        if not self.from_device:
            object.__setattr__(self, "from_device", (False,) * self.batch_size)
        if not self.row_k:
            object.__setattr__(self, "row_k", (self.k,) * self.batch_size)

    @property
    def per_row(self) -> bool:
        """Rows at different K (some K_i < k)."""
        return any(k != self.k for k in self.row_k)

    @property
    def sync(self) -> str:
        """The K=0 rows' draft sync: "warm" (extend the draft's K/V), "lazy" (store the features)
        or "off" (nothing)."""
        return "warm" if self.keep_warm else "lazy" if self.lazy else "off"

    @property
    def catch_up_tokens(self) -> int:
        """Draft entries the catch-up writes (they count against max_num_tokens)."""
        return sum(len(c.tokens) for c in self.catch_up)

    @property
    def carried_rows(self) -> int:
        """Rows read from the engine's per-slot copy (from_device)."""
        return sum(self.from_device)

    @property
    def tokens_per_row(self) -> int:
        return self.k + 1

    @property
    def decode_tokens(self) -> int:
        """Verify tokens of the decode rows: sum of K_i + 1 (b x (K+1) at one K)."""
        return sum(self.row_k) + self.batch_size

    @property
    def prefill_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    @property
    def padded_decode_tokens(self) -> int:
        """The decode rows' tokens padded to the row bucket, bucket x (K+1): where an eager mixed
        iteration's chunk tokens start (chunk token j at this + j; whole graphs start them at
        decode_tokens)."""
        return self.bucket * (self.k + 1)

    @property
    def last_chunks(self) -> int:
        """How many chunks end their prompt (each yields a first generated token)."""
        return sum(c.last for c in self.chunks)

    @property
    def max_position(self) -> int:
        """Highest cache position this step writes (target side)."""
        ends = [p + self.k for p in self.positions] + [c.start + len(c.tokens) - 1 for c in self.chunks]
        return max(ends)


@dataclass(frozen=True)
class StepResult:
    accepted: tuple[int, ...]              # [b] accepted draft tokens per row, 0..K
    emitted: tuple[tuple[int, ...], ...]   # [b] new tokens per row: accepted drafts + 1 target token
    draft_warm: bool                       # each row's draft head (next first draft) is ready
    first_tokens: tuple[int | None, ...] = ()   # [chunks] a last chunk's first generated token, else None
    # where the engine can tell without an extra sync (reference engine: CUDA events, else its clock)
    device_s: float | None = None   # the step's device time: its first enqueued work to its last
    idle_s: float | None = None     # device idle before it: the previous step's end to this step's start


def cap_k(k: int, b: int, max_num_tokens: int) -> int:
    """Largest K' <= k with b x (K'+1) <= max_num_tokens (b decode rows at K+1 tokens each).
    cap_k(4, 3, 16) = 4 (15 tokens); cap_k(4, 4, 16) = 3 (16); cap_k(4, 9, 16) = 0 (9)."""
    if b < 1:
        return k
    return max(0, min(k, max_num_tokens // b - 1))


def chunk_sizes(left: int, remaining: Sequence[int]) -> tuple[int, ...]:
    """First come, first served: each prompt in order takes what it still needs of `left`.
    chunk_sizes(10, [4, 9, 3]) = (4, 6, 0)."""
    out = []
    for need in remaining:
        n = max(0, min(need, left))
        out.append(n)
        left -= n
    return tuple(out)


def bucket_for(b: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= b. buckets=(1, 2, 4, 8): b=3 -> 4, b=8 -> 8."""
    i = bisect.bisect_left(buckets, b)
    if i == len(buckets):
        raise ValueError(f"batch size {b} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


def batch_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to max_batch_size, plus max_batch_size itself: 6 -> (1, 2, 4, 6)."""
    out, b = [], 1
    while b < max_batch_size:
        out.append(b)
        b *= 2
    out.append(max_batch_size)
    return tuple(out)


def make_plan(
    k: int,
    positions: Sequence[int],
    pending: Sequence[int],
    stale: Sequence[bool],
    keep_warm: bool,
    buckets: Sequence[int],
    slots: Sequence[int] | None = None,
    chunks: Sequence[PromptChunk] = (),
    from_device: Sequence[bool] | None = None,
    carry: bool = False,
    draft: bool = True,
    row_k: Sequence[int] | None = None,
    lazy: bool = False,
    catch_up: Sequence[CatchUp] = (),
    store_chunks: bool = False,
) -> StepPlan:
    """Pure: the whole iteration's shape from (b, K), each row's length and the prompt chunks.
    from_device / carry: the overlapped loop's rows carried on the device (module docstring).
    draft False: K must be 0 and keep_warm False (the target alone).
    row_k: each row's K_i (a per-request policy), K = max(row_k); None: every row at K.
    lazy / catch_up / store_chunks: lazy draft sync (StepPlan; keep_warm False with it)."""
    b = len(positions)
    row_k = (k,) * b if row_k is None or not b else tuple(int(x) for x in row_k)
    if b and (len(row_k) != b or min(row_k) < 0 or max(row_k) != k):
        raise ValueError(f"row_k {row_k} must give each of the {b} rows a K_i in 0..K with max K = {k}")
    slots = tuple(range(b)) if slots is None else tuple(slots)
    from_device = (False,) * b if from_device is None else tuple(bool(f) for f in from_device)
    if not (b == len(pending) == len(stale) == len(slots) == len(from_device)):
        raise ValueError(f"row arrays disagree: {b} positions, {len(pending)} pending, {len(stale)} stale, "
                         f"{len(slots)} slots, {len(from_device)} from_device")
    if b < 1 and not chunks:
        raise ValueError("a plan needs at least one decode row or prompt chunk")
    if not draft and (k and b or keep_warm):
        raise ValueError(f"a plan without the draft runs K=0 without keep-warm (K={k}, keep_warm={keep_warm})")
    if lazy and keep_warm:
        raise ValueError("a plan's draft sync is one of warm (keep_warm) and lazy, not both")
    if store_chunks and not (lazy and draft and not k and chunks):
        raise ValueError(f"store_chunks is a lazy K=0 step's with chunks (lazy={lazy}, K={k}, "
                         f"chunks={len(chunks)})")
    return StepPlan(
        k=k if b else 0,
        batch_size=b,
        bucket=bucket_for(b, buckets) if b else 0,
        positions=tuple(positions),
        pending=tuple(pending),
        stale=tuple(bool(s) for s in stale),
        keep_warm=keep_warm,
        slots=slots,
        chunks=tuple(chunks),
        from_device=from_device,
        carry=carry,
        draft=draft,
        row_k=row_k,
        lazy=lazy and draft,
        catch_up=tuple(catch_up),
        store_chunks=store_chunks,
    )


class Engine(Protocol):
    """What the executor asks of an engine (the reference engine, TP's LeaderEngine)."""
    max_batch_size: int
    max_seq_len: int
    max_draft_len: int          # largest K the engine was set up for
    max_num_tokens: int         # tokens per iteration: decode rows x (K+1) + prompt chunks
    max_reservation: int        # the most tokens one request's cache can ever hold (pool and table)
    vocab_size: int             # prompt ids must lie in 0..vocab_size-1
    buckets: tuple[int, ...]
    packs_rows: bool            # per-row K (StepPlan.row_k) verifies each row's K_i + 1 tokens, packed
                                # (reference engine on CUDA: where its whole-forward graph is captured);
                                # False: every row runs max K_i tokens and row_k only caps acceptance
    packs_rows_alone: bool      # ... in a step that carries no prompt chunk too (False: the reference
                                # engine on CUDA, where such a vector runs the decode graph at max K_i)
    async_launch: bool          # launch returns before the device has run the step (reference engine on
                                # CUDA): the serial loop defers its estimate update behind it (runtime/serving/loop.py)

    def reserve(self, tokens: int, key: int = 0) -> int | None: ...   # a cache slot for positions 0..tokens-1, or None;
                                                                      # key: the request's id (Bernoulli draws)
    def release(self, slot: int) -> None: ...
    def step(self, plan: StepPlan, acceptance: "AcceptanceModel") -> StepResult: ...    # = result(launch(plan))
    def launch(self, plan: StepPlan, acceptance: "AcceptanceModel") -> object: ...      # queue the step -> a handle
    def result(self, handle: object) -> StepResult: ...                               # wait for that step's result


def packs_vector(engine: Engine, with_chunk: bool) -> bool:
    """Whether the engine verifies each row's K_i + 1 tokens, packed, in a step that does
    (with_chunk) or does not carry a prompt chunk; False: every row runs max K_i tokens. The one
    rule for the planner (RowInputs.packed) and the simulator's prices (docs/design.md)."""
    return bool(engine.packs_rows and (with_chunk or engine.packs_rows_alone))


def launches_async(engine: Engine | None) -> bool:
    """engine.async_launch, which every engine declares (the stand-ins of the tests and the
    simulator too: False, their launch runs the step). None: no engine yet (Executor(None, ...),
    made before any engine is), False."""
    return engine is not None and bool(engine.async_launch)
