"""Graph capture and the warm-ups before serving: the pure-decode graph chains per GraphKey, the
whole-forward graphs of mixed iterations (mixed_graphs.py), and the eager paths' kernels compiled
ahead of the first served step. The one sequence that runs them, for serving, tests and
benchmarks alike, is runtime/generate/session.py `capture`:
    capture_decode_graphs -> warm_chunks -> capture_whole_graphs (CUDA: then warm_mixed)
Each function here takes what it uses: the step's parts (step_state.StepParts), the graph
tables it fills, and the engine's `step` for the warm-ups."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Sequence

import torch

from dynspec.runtime.policy.acceptance import Greedy
from dynspec.runtime.engines.reference.draft_chain import device_fn
from dynspec.runtime.engines.reference.graph_keys import GraphKey, capture_order
from dynspec.runtime.engines.reference.graphs import CaptureCost, GraphChain, capture_chain, chain_cuts, timed_capture
from dynspec.runtime.engines.reference.mixed_graphs import WholeMixed
from dynspec.runtime.engines.reference.mixed_layout import STORE, least_tokens, whole_keys
from dynspec.runtime.engines.reference.step_state import StepParts
from dynspec.runtime.serving.plan import PromptChunk, StepPlan, make_plan


def capture_decode_graphs(s: StepParts, chains: dict, keys: Iterable[GraphKey]) -> tuple[int, CaptureCost]:
    """One graph chain per pure-decode key into `chains`, warmed up and captured in capture_order
    (CUDA). Decode graphs read every row's whole block table (max_seq_len). -> (how many, cost)."""
    return timed_capture(lambda: _capture_decode(s, chains, keys))


def _capture_decode(s: StepParts, chains: dict, keys: Iterable[GraphKey]) -> int:
    keys = capture_order(replace(k, draft=True) for k in keys)      # draft is the mixed graphs' concern
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    s.slots.flush()                 # not inside a capture: its copy and writes would be baked in
    s.buffers.pad_rows()
    with torch.inference_mode():
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for key in keys:                       # warm up every shape once (allocator, kernels)
                device_fn(s, key, None)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for key in keys:
            chains[key] = capture_key(s, key, pool, stream)
    torch.cuda.synchronize()
    return len(keys)


def capture_key(s: StepParts, key: GraphKey, pool, stream) -> GraphChain:
    """The key's device function captured as a graph chain (graphs.capture_chain)."""
    def fn(cut) -> None:
        s.target.layer_hook = cut
        try:
            device_fn(s, key, None)
        finally:
            s.target.layer_hook = None

    return capture_chain(fn, chain_cuts(len(s.target.layers)), pool, stream)


def capture_whole_graphs(s: StepParts, whole: WholeMixed, row_buckets: Sequence[int], keys: Iterable[GraphKey] = (),
                         exact: Iterable[tuple] = ()) -> tuple[int, CaptureCost]:
    """Mixed iterations' whole target forward, attention included, as one graph chain per
    (token bucket, row bucket, T, draft) (mixed_graphs.py): for the row shapes of `keys` with every
    token bucket they can reach (mixed_layout.least_tokens), plus chunk-only iterations, plus
    the `exact` keys (CUDA). -> (how many, cost)."""
    rows = {(g.bucket, g.k + 1 if g.kind == "spec" else 1, STORE if g.sync == "lazy" and g.draft else g.draft)
            for g in keys if g.kind != "refresh"}                     # lazy K=0: chunks stored (mixed_layout.STORE)
    s.slots.flush()                 # not inside a capture (capture_decode_graphs)
    s.buffers.pad_rows()
    below = dict(zip(row_buckets, (0,) + tuple(row_buckets)[:-1]))   # row bucket -> the one below it
    least = lambda B, T: least_tokens(B, T, below[B])    # noqa: E731
    wanted = set(whole_keys(rows, whole.buckets, least) if rows else ()) | set(exact)
    return timed_capture(lambda: whole.capture(wanted))


def warm_chunks(step: Callable[[StepPlan, Greedy], object], pad_slot: int, max_seq_len: int,
                max_num_tokens: int) -> int:
    """Run the eager chunk path before serving: chunk-only steps of 1 and min(300,
    max_num_tokens) packed tokens on the padding slot (its K/V go to the scratch block; rows of
    at most max_seq_len - 1 tokens), which compile the ragged kernel's item form (one version a
    pool layout: target, draft) and the glue at one token and at several. Without it the first
    mixed iterations of a run would compile inside the measurement. Returns the steps run."""
    per_row = max(1, max_seq_len - 1)
    sizes = sorted({1, min(300, max_num_tokens)})
    for n in sizes:
        rows = [min(per_row, n - i) for i in range(0, n, per_row)]
        plan = StepPlan(k=0, batch_size=0, bucket=0, positions=(), pending=(), stale=(), keep_warm=False,
                        slots=(), chunks=tuple(PromptChunk(pad_slot, 0, (0,) * r, None) for r in rows))
        step(plan, Greedy())
    return len(sizes)


def warm_mixed(step: Callable[[StepPlan, Greedy], object], keys: Iterable[GraphKey], pad_slot: int,
               row_buckets: Sequence[int], max_seq_len: int, max_num_tokens: int) -> int:
    """Mixed iterations at every speculative row shape (bucket B, K) of `keys`, every row on
    the padding slot (K/V into the scratch block): B decode rows and one last chunk of 5
    tokens, one that makes the packed total a multiple of 16 (Triton specialises integer
    arguments on that), one of 300 tokens (many work items) and two chunks, one not last.
    Mixed iterations past the whole graphs (above the top token bucket, more than
    WholeMixed.CHUNKS chunks) run eagerly, and what that compiles on first use at a (B, K)
    would otherwise stall a served step for seconds. Chunks are capped to the token budget.
    Returns the steps run.
    Key spec (4, K=2) (3 tokens a row, budget 64): chunks [5], [4], [52], [7, 3]."""
    pad, steps = pad_slot, 0
    for bucket, k in sorted({(g.bucket, g.k) for g in keys if g.kind == "spec"}):
        rows = bucket * (k + 1)
        room = min(max_num_tokens - rows, max_seq_len - 1)
        shapes = [(5,), (16 - rows % 16,), (300,), (7, 3)]
        for sizes in shapes:
            if room < sum(sizes) and len(sizes) > 1 or room < 1:
                continue
            lens = [min(n, room) for n in sizes]
            chunks = tuple(PromptChunk(pad, 0, (0,) * n, None if j == len(lens) - 1 else 0)
                           for j, n in enumerate(lens))
            step(make_plan(k, positions=(1,) * bucket, pending=(0,) * bucket, stale=(False,) * bucket,
                           keep_warm=False, buckets=row_buckets, slots=(pad,) * bucket, chunks=chunks), Greedy())
            steps += 1
    return steps
