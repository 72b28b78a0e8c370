"""Graph capture and the warm-ups before serving, on a ReferenceEngine `e`: the pure-decode graph
chains per GraphKey, the whole-forward graphs of mixed iterations (mixed_graphs.py), and the
eager paths' kernels compiled ahead of the first served step."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

import torch

from dynspec.runtime.acceptance import Greedy
from dynspec.runtime.engines.reference.draft_chain import device_fn
from dynspec.runtime.engines.reference.graph_keys import GraphKey, capture_order
from dynspec.runtime.engines.reference.graphs import CaptureCost, GraphChain, capture_chain, chain_cuts, timed_capture
from dynspec.runtime.engines.reference.mixed_graphs import WholeMixed
from dynspec.runtime.engines.reference.mixed_layout import least_tokens, whole_keys
from dynspec.runtime.plan import PromptChunk, StepPlan, make_plan


def capture_graphs(e, keys: Iterable[GraphKey]) -> int:
    """Every graph of GraphMode.FULL for the pure-decode `keys` (reachable_graphs): their
    decode graphs, then (CUDA) the eager path's chunk attention compiled (warm_chunks: its
    chunk-only steps run before a whole graph could take them), then the whole-forward graphs
    of their row shapes (capture_whole_graphs), then mixed iterations at every speculative row
    shape (warm_mixed). Returns how many graphs."""
    keys = tuple(keys)
    n = e.capture_decode_graphs(keys)
    if e.device.type == "cuda":
        e.warm_chunks()
    n += e.capture_whole_graphs(keys)
    if e.device.type == "cuda":
        e.warm_mixed(keys)
    return n


def capture_decode_graphs(e, keys: Iterable[GraphKey]) -> int:
    """One graph chain per pure-decode key (CUDA; 0 on CPU), warmed up and captured in
    capture_order. Decode graphs read every row's whole block table (max_seq_len)."""
    if e.device.type != "cuda":
        return 0
    n, cost = timed_capture(lambda: _capture_decode(e, keys))
    e.capture_costs["decode"] = e.capture_costs.get("decode", CaptureCost()) + cost
    return n


def _capture_decode(e, keys: Iterable[GraphKey]) -> int:
    keys = capture_order(replace(k, draft=True) for k in keys)      # draft is the mixed graphs' concern
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    e.slots.flush()                 # not inside a capture: its copy and writes would be baked in
    e.pad_rows()
    with torch.inference_mode():
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for key in keys:                       # warm up every shape once (allocator, kernels)
                device_fn(e, key, None)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for key in keys:
            e.graph_chains[key] = capture_key(e, key, pool, stream)
    torch.cuda.synchronize()
    return len(keys)


def capture_key(e, key: GraphKey, pool, stream) -> GraphChain:
    """The key's device function captured as a graph chain (graphs.capture_chain)."""
    def fn(cut) -> None:
        e.target.layer_hook = cut
        try:
            device_fn(e, key, None)
        finally:
            e.target.layer_hook = None

    return capture_chain(fn, chain_cuts(len(e.target.layers)), pool, stream)


def capture_whole_graphs(e, keys: Iterable[GraphKey] = (), exact: Iterable[tuple] = ()) -> int:
    """Mixed iterations' whole target forward, attention included, as one graph chain per
    (token bucket, row bucket, T, draft) (mixed_graphs.py): for the row shapes of `keys` with every
    token bucket they can reach (mixed_layout.least_tokens), plus chunk-only iterations, plus
    the `exact` keys. Returns how many.
    CPU: WholeMixed is set up and its functions run uncaptured (tests check them there). CUDA with
    SDPA attention (attention="sdpa"): none; its batches are built on the host each step, so
    those iterations run eagerly."""
    if e.device.type == "cuda" and not e.triton:
        return 0
    if e.whole is None:
        e.whole = WholeMixed(e)
    if e.device.type != "cuda":
        return 0
    rows = {(g.bucket, g.k + 1 if g.kind == "spec" else 1, g.draft) for g in keys if g.kind != "refresh"}
    e.slots.flush()                 # not inside a capture (capture_decode_graphs)
    e.pad_rows()
    below = dict(zip(e.buckets, (0,) + e.buckets[:-1]))          # row bucket -> the one below it
    least = lambda B, T: least_tokens(B, T, below[B])    # noqa: E731
    wanted = set(whole_keys(rows, e.whole.buckets, least) if rows else ()) | set(exact)
    n, cost = timed_capture(lambda: e.whole.capture(wanted))
    e.capture_costs["whole"] = e.capture_costs.get("whole", CaptureCost()) + cost
    return n


def warm_chunks(e) -> int:
    """Run the eager chunk path before serving: chunk-only steps of 1 and min(300,
    max_num_tokens) packed tokens on the padding slot (its K/V go to the scratch block; rows of
    at most max_seq_len - 1 tokens), which compile the ragged kernel's item form (one version a
    pool layout: target, draft) and the glue at one token and at several. Without it the first
    mixed iterations of a run would compile inside the measurement. Returns the steps run."""
    per_row = max(1, e.max_seq_len - 1)
    sizes = sorted({1, min(300, e.max_num_tokens)})
    for n in sizes:
        rows = [min(per_row, n - i) for i in range(0, n, per_row)]
        plan = StepPlan(k=0, batch_size=0, bucket=0, positions=(), pending=(), stale=(), keep_warm=False,
                        slots=(), chunks=tuple(PromptChunk(e.pad_slot, 0, (0,) * r, None) for r in rows))
        e.step(plan, Greedy())
    e.warm_chunk_steps += len(sizes)
    return len(sizes)


def warm_mixed(e, keys: Iterable[GraphKey]) -> int:
    """Mixed iterations at every speculative row shape (bucket B, K) of `keys`, every row on
    the padding slot (K/V into the scratch block): B decode rows and one last chunk of 5
    tokens, one that makes the packed total a multiple of 16 (Triton specialises integer
    arguments on that), one of 300 tokens (many work items) and two chunks, one not last.
    Mixed iterations past the whole graphs (above the top token bucket, more than
    WholeMixed.CHUNKS chunks) run eagerly, and what that compiles on first use at a (B, K)
    would otherwise stall a served step for seconds. Chunks are capped to the token budget.
    Returns the steps run.
    Key spec (4, K=2) (3 tokens a row, budget 64): chunks [5], [4], [52], [7, 3]."""
    pad, steps = e.pad_slot, 0
    for bucket, k in sorted({(g.bucket, g.k) for g in keys if g.kind == "spec"}):
        rows = bucket * (k + 1)
        room = min(e.max_num_tokens - rows, e.max_seq_len - 1)
        shapes = [(5,), (16 - rows % 16,), (300,), (7, 3)]
        for sizes in shapes:
            if room < sum(sizes) and len(sizes) > 1 or room < 1:
                continue
            lens = [min(n, room) for n in sizes]
            chunks = tuple(PromptChunk(pad, 0, (0,) * n, None if j == len(lens) - 1 else 0)
                           for j, n in enumerate(lens))
            e.step(make_plan(k, positions=(1,) * bucket, pending=(0,) * bucket, stale=(False,) * bucket,
                             keep_warm=False, buckets=e.buckets, slots=(pad,) * bucket, chunks=chunks), Greedy())
            steps += 1
    e.warm_chunk_steps += steps
    return steps
