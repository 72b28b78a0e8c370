"""The host layout of a mixed iteration's whole-forward graphs (mixed_graphs.py): the token
buckets, which keys an iteration can reach, and the packed layout's cell map and work items.
Pure functions of shapes."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from dynspec.runtime.engines.reference.attention import ITEM_TOKENS

Key = tuple[int, int, int, int]        # (Np, B, T, draft): draft False (0), True (1) or STORE
STORE = 2     # draft of a lazy K=0 key: the chunks' target features stored, no draft pass (plan.store_chunks)

# Token buckets up to 1024 (above that a forward is GEMM-bound and the launches a graph saves are
# a small share of it), 16 apart up to 384, 32 up to 512, 64 up to 1024: at most a gap of 1/8 past
# 128 tokens (129 -> 144, 513 -> 576). On the serving loads (regime B, C = 16, 64, 256, closed loop
# and Poisson) that pads 3-4% of the mixed steps' tokens, against 4-7% with 32 apart from 128 (the
# simulator's plans; the H100 measured 4.0-7.2% with those). All multiples of 16 (Triton
# specialises integer arguments on that). A whole graph costs ~35 ms to capture (H200, 8B pair)
# and shares one memory pool with the rest.
BUCKETS = tuple(range(16, 385, 16)) + tuple(range(416, 513, 32)) + tuple(range(576, 1025, 64))


def mixed_buckets(max_num_tokens: int, top: int = BUCKETS[-1]) -> tuple[int, ...]:
    """The buckets up to min(max_num_tokens, top), that bound included: 72 -> (16, 32, 48, 64, 72)."""
    cap = min(max_num_tokens, top)
    return tuple(b for b in BUCKETS if b < cap) + (cap,)


def token_bucket(n: int, buckets: Sequence[int]) -> int | None:
    """Pure. The smallest token bucket >= n, or None above the largest: 15, (16, 32) -> 16."""
    return next((b for b in buckets if b >= n), None)


def forward_tokens(decode_rows: int, k: int, prefill_tokens: int, verify_tokens: int | None,
                   row_buckets: Sequence[int], token_buckets: Sequence[int], packs_rows_alone: bool) -> int:
    """Pure. Tokens the target forward of an iteration runs, padding included. A pure-decode step
    at one K, and on CUDA a per-row step without a prompt chunk (packs_rows_alone False: it runs
    the decode graph at max K_i): the rows padded to their row bucket at K+1 tokens each. An
    iteration through a whole-forward graph (mixed iterations; per-row K with packs_rows_alone): the
    rows' own tokens (verify_tokens, default rows x (K+1)) plus prompt tokens, padded to the token
    bucket; no token buckets (eager), or above the top: the rows padded to their bucket, plus the prompt.
    Row buckets (1, 2, 4, 8), token buckets (16, 32, 64): 3 rows at K=2 -> 4 x 3 = 12; 3 rows at
    K=1 and 9 prompt tokens -> 3 x 2 + 9 = 15 -> 16; rows at K (1, 0, 0), no prompt -> 16 packed,
    4 x 2 = 8 on the decode graph."""
    from dynspec.runtime.serving.plan import bucket_for

    verify = decode_rows * (k + 1) if verify_tokens is None else verify_tokens
    if token_buckets and (prefill_tokens or (verify != decode_rows * (k + 1) and packs_rows_alone)):
        n = token_bucket(verify + prefill_tokens, token_buckets)
        if n is not None:
            return n
    return (bucket_for(decode_rows, row_buckets) * (k + 1) if decode_rows else 0) + prefill_tokens


def least_tokens(B: int, T: int, below: int) -> int:
    """Pure. The fewest packed tokens an iteration of row bucket B (the bucket below it: `below`)
    at T = K+1 can have: b = below + 1 rows at K each plus one chunk token.
    least_tokens(8, 3, 4) = 5 x 3 + 1 = 16. A per-row plan (rows at their own K_i <= K) may pack
    fewer: it pads up to the least captured bucket (engine._whole_key), so per-row K adds no graphs."""
    if B == 0:
        return 1
    return (below + 1) * T + 1


def whole_keys(rows: Iterable[tuple[int, int, bool]], token_buckets: Iterable[int],
               least=lambda B, T: B * T + 1) -> tuple[Key, ...]:
    """Every (Np, B, T, draft) some iteration can reach, for each row shape (B, T, draft) and
    chunk-only iterations (0, 1, bool(draft), and (0, 1, STORE) beside a STORE shape: a step
    without rows stores where the rows it leaves would not draft): the token buckets from
    least(B, T) (least_tokens) up.
    ((1, 2, True),), buckets (16, 32) -> (16,0,1,T) (16,1,2,T) (32,0,1,T) (32,1,2,T)."""
    shapes = set(rows) | {(0, 1, bool(d)) for _, _, d in rows} | {(0, 1, d) for _, _, d in rows if d == STORE}
    buckets = sorted(token_buckets)
    out = set()
    for B, T, d in shapes:
        lo = least(B, T) if B else 1
        first = next((n for n in buckets if n >= lo), None)
        out.update((n, B, T, d) for n in buckets if first is not None and n >= first)
    return tuple(sorted(out))


def item_cap(Np: int, B: int, T: int, max_chunks: int) -> int:
    """Pure. Work items a key's launch holds: each decode row's (at most T tokens), the other
    tokens (chunks and pad, at most Np) cut at most once more per chunk, and the pad's tail.
    item_cap(16, 4, 2, 8) = 4 + 4 + 8 + 1 = 17 (ITEM_TOKENS 4)."""
    return B * -(-T // ITEM_TOKENS) + -(-Np // ITEM_TOKENS) + min(Np, max_chunks) + 1


def store_slots(chunks: Sequence, cap: int, pad_slot: int) -> np.ndarray:
    """Pure. The feature-store slot of each chunk token, packed in chunk order, for a step that stores
    its chunks (STORE): a chunk's newest `cap` tokens go to its slot (the ring holds that many), the
    older ones to the pad slot. Chunks of 3 and 2 tokens in slots 5 and 6, cap 2, pad 9: [9 5 5 6 6]."""
    return np.concatenate([[pad_slot] * max(len(c.tokens) - cap, 0) + [c.slot] * min(len(c.tokens), cap)
                           for c in chunks]).astype(np.int64) if chunks else np.zeros(0, dtype=np.int64)


def cell_map(row_k: Sequence[int], B: int, T: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Pure. The decode rows' packing: (cell of each packed decode token [n], packed token of each
    cell [B*T] (cells that verify nothing: 0), n). row_k (2, 0, 1), B 4, T 3:
    cells [0 1 2 3 6 7], packed [0 1 2 3 0 0 4 5 0 0 0 0], n 6."""
    lens = np.asarray(row_k, dtype=np.int64) + 1
    n = int(lens.sum())
    row = np.repeat(np.arange(len(lens)), lens)                             # [n] row of each token
    j = np.arange(n) - (np.cumsum(lens) - lens)[row]                        # [n] its index in the row
    cells = row * T + j
    packed = np.zeros(B * T, dtype=np.int64)
    packed[cells] = np.arange(n)
    return cells, packed, n
