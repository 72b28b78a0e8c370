"""Measure the engine's iteration time for each (context, batch size b, draft length K); K = 0 is
plain decode. One engine, its graphs captured once, times every context's grid in turn.

profile.json (the format and its reader: runtime/policy/cost_model.py):
    {"format": "dynspec-profile/2", "device": "cuda:0 (NVIDIA H200)", "context_lens": [512, 2048],
     "tables": [{"context_len": 512,
                 "iteration_ms": {"1": {"0": 4.4, "1": 4.9, "2": 5.3}, "8": {...}},   # median of repeats
                 "decode_ms": {"1": 4.2, ...}},      # K = 0 without the keep-warm draft extend
                {"context_len": 2048, ...}],
     "acceptance": {"per_position": [0.8, 0.7, 0.6]},      # optional: --measure-acceptance
     "target_weight_bytes": 16060522496, "keep_warm": true, "repeats": 20, "warmup": 5,
     "versions": {...}, "command": "dynspec profile ..."}

With --floor (run_profile(floor=True)) it also records, from the same engine in the same run:
     "gemm_floor_ms": 4.11,
     "floor": {"gemm_floor_ms": 4.11, "decode_ms": 6.21, "batch_size": 1, "context_len": 1024,
               "decode_vs_gemm_floor": 1.51, "method": "cuda graph of the GEMMs, 50 replays, median",
               "decode_graph_ms": 5.9, "decode_graph_vs_gemm_floor": 1.44,
               "decode_overlap_ms": 5.95, "decode_overlap_vs_gemm_floor": 1.45, "decode_overlap_vs_graph": 1.008,
               "decode_overlap": {"ms": 5.95, "mean_ms": 5.97, "steps": 20, "first_position": 999,
                                  "last_position": 1023}, ...}
gemm_floor_ms is the target's weight matrices multiplied alone, in the shapes of a b=1 decode
step (per layer qkv, o, gate_up, down; then the lm_head), with nothing between them: the time
weight streaming alone takes. decode_ms is plain decode (K=0, no keep-warm) at b=1 with 1024
tokens of context, timed like every other shape; decode_graph_ms is that step's CUDA graphs
replayed back to back (None without graphs: CPU, eager, TP leaders), the step less the host's
serial part. decode_overlap_ms (ms) is the same plain decode served by the overlapped executor loop
(Executor(loop=Loop.OVERLAPPED)): the median wall time between consecutive step results of one request
decoding up to position 1023, the host's planning hidden behind the GPU's step (overlap_decode_ms);
decode_overlap_vs_graph near 1.0 means nothing of the host's part is left. Every ratio is of two
times from the same engine in the same process; a None time gives a None ratio.

Each (b, K) runs engine.step on synthetic rows: b rows whose pending token sits at position
context_len (the KV cache contents do not change the cost), the same plan every repeat, so
the context length stays fixed; runs of consecutive steps per shape, spread over 3 passes,
median reported (see time_shapes). With CUDA graphs on, the graphs for every measured shape
are captured first, as serving would. On CPU the served spec step measured ~10% slower than
this synthetic one (executor work between steps evicts caches); on a GPU with graphs the
step does not depend on what runs between replays.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from dynspec.benchmarks.engines import open_sized
from dynspec.benchmarks.gemm_floor import FLOOR_CONTEXT, measure_floor
from dynspec.runtime.generate.session import target_positions
from dynspec.benchmarks.step_timing import Shape, time_shapes
from dynspec.config import GraphMode
from dynspec.errors import DynspecError
from dynspec.runtime.policy.cost_model import ContextTable, Profile
from dynspec.runtime.policy.tune import per_position_rates


def measure_iteration_ms(engine, batch_sizes: Sequence[int], draft_lens: Sequence[int], context_len: int, *,
                         keep_warm: bool = True, warmup: int = 3, repeats: int = 10,
                         progress=None, lazy: bool = False) -> tuple[dict[int, dict[int, float]], dict[int, float]]:
    """({b: {K: ms}}, {b: plain-decode ms without keep-warm}) for the engine as it is set up.

    K = 0 is timed as serving runs it: with keep-warm when the engine keeps the draft warm, with
    the features stored for a later catch-up under lazy draft sync (lazy); decode_ms is the bare
    target step, what a no-speculation server pays."""
    bad = [b for b in batch_sizes if not 1 <= b <= engine.max_batch_size]
    if bad:
        raise DynspecError(f"batch sizes {bad} are outside 1..{engine.max_batch_size} (the engine's max_batch_size)")
    badk = [k for k in draft_lens if not 0 <= k <= engine.max_draft_len]
    if badk:
        raise DynspecError(f"draft lengths {badk} are outside 0..{engine.max_draft_len} (the engine's max_draft_len)")
    need = context_len + max(draft_lens) + 1
    if need > engine.max_seq_len:
        raise DynspecError(f"--context-lens: context {context_len} + K {max(draft_lens)} + 1 = {need} exceeds "
                           f"max_seq_len {engine.max_seq_len}")
    def shape(b: int, k: int) -> Shape:
        return Shape(b, k, keep_warm and k == 0, lazy=lazy and not keep_warm and k == 0)

    # each b's plain decode timed beside its K grid, so their ratio is of neighbouring samples
    grid = [s for b in batch_sizes for s in (Shape(b, 0, False), *(shape(b, k) for k in draft_lens))]
    ms = time_shapes(engine, list(dict.fromkeys(grid)), context_len, warmup=warmup, repeats=repeats,
                     progress=progress)
    table = {b: {k: ms[shape(b, k)] for k in draft_lens} for b in batch_sizes}
    decode = {b: ms[Shape(b, 0, False)] for b in batch_sizes}
    return table, decode


def measure_chunk_ms(engine, batch_sizes: Sequence[int], draft_lens: Sequence[int], context_len: int,
                     chunk_lens: Sequence[int], *, warmup: int = 3, repeats: int = 10,
                     progress=None, lazy: bool = False) -> dict[int, dict[int, dict[int, float]]]:
    """{chunk: {b: {K: ms}}}: each (b, K) with one last prompt chunk of `chunk` tokens riding
    (profile.json's chunk_ms, runtime/policy/chunk_cost.py); K = 0 without keep-warm (a mixed K=0
    step prices over plain decode), under lazy draft sync as served: the chunk stored (plan.store_chunks)."""
    over = [(b, k, c) for c in chunk_lens for b in batch_sizes for k in draft_lens
            if b * (k + 1) + c > engine.max_num_tokens]
    if over:
        b, k, c = over[0]
        raise DynspecError(f"--chunk-lens: b={b} at K={k} with a {c}-token chunk is {b * (k + 1) + c} tokens, above "
                           f"the engine's max_num_tokens {engine.max_num_tokens}")
    def shape(b: int, k: int, c: int) -> Shape:
        return Shape(b, k, False, c, lazy=lazy and k == 0)

    grid = [shape(b, k, c) for c in chunk_lens for b in batch_sizes for k in draft_lens]
    ms = time_shapes(engine, grid, context_len, warmup=warmup, repeats=repeats, progress=progress)
    return {c: {b: {k: ms[shape(b, k, c)] for k in draft_lens} for b in batch_sizes} for c in chunk_lens}


def measure_catch_up_ms(engine, batch_sizes: Sequence[int], context_len: int, tokens: int, *, warmup: int = 3,
                        repeats: int = 10, progress=None) -> dict:
    """Lazy draft sync's resumption (docs/design.md, "Draft sync"): the K=1 step of b rows that each
    catch up `tokens` draft entries first (a K=0 stretch of that many steps), at every b whose
    catch-up and verify tokens fit the token budget. -> profile.json's "catch_up":
        {"tokens": 100, "k": 1, "context_len": 128, "ms": {"64": 9.1, ...}}
    Its cost is ms[b] - iteration_ms[b][1]; a plain decode step is decode_ms[b]."""
    from dynspec.runtime.serving.draft_sync import store_cap

    _check_catch_up(tokens, context_len)
    cap = store_cap(engine)                                     # (a TP leader keeps none)
    if cap < tokens:
        raise DynspecError(f"--catch-up {tokens}: the engine keeps {cap} tokens of features a row (draft_sync lazy, its cap)")
    bs = [b for b in batch_sizes if b * (tokens + 2) <= engine.max_num_tokens]
    shapes = [Shape(b, 1, False, catch_up=tokens) for b in bs]
    ms = time_shapes(engine, shapes, context_len, warmup=warmup, repeats=repeats, progress=progress)
    return {"tokens": tokens, "k": 1, "context_len": context_len, "ms": {str(sh.batch_size): ms[sh] for sh in shapes}}


def _check_catch_up(tokens: int, context_len: int) -> None:
    """--catch-up N (0: none) fits the first profiled context."""
    if tokens and not 1 <= tokens <= context_len:
        raise DynspecError(f"--catch-up {tokens} must be in 1..{context_len} (the first profiled context)")


def measure_acceptance(engine, requests, k: int, concurrency: int) -> tuple[float, ...]:
    """Real (greedy) per-position acceptance at a static K over the requests."""
    from dynspec.benchmarks.loadgen import closed_loop
    from dynspec.runtime.serving.executor import Executor
    from dynspec.runtime.policy import DraftSchedule

    from dynspec.runtime.generate.tune_at_start import AcceptanceRecorder

    rec = AcceptanceRecorder(engine)
    ex = Executor(rec, DraftSchedule.static(k, engine.max_batch_size), keep_warm=True)
    closed_loop(ex, requests, concurrency)
    return per_position_rates(rec.steps, k)


def weight_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def run_profile(cfg, *, device: str, batch_sizes: Sequence[int], draft_lens: Sequence[int], context_lens: Sequence[int],
                warmup: int = 3, repeats: int = 10, acceptance_requests=None, acceptance_concurrency: int = 4,
                meta: Mapping[str, object] | None = None, progress=None, max_seq_len: int | None = None,
                floor: bool = False, tp: int = 1, allreduce: str = "auto", chunk_lens: Sequence[int] = (),
                catch_up: int = 0) -> Profile | None:
    """Open cfg's reference engine sized for the grid, capture its graphs on CUDA once, time every
    (b, K) at each context in context_lens (ascending, one table each).

    max_seq_len: the cache length (default: just enough for the largest context). Give the sweep's
    when comparing with it: captured graphs are sized for the whole cache, so it sets part of their cost.
    floor: also measure_floor (gemm_floor_ms and decode at b=1, 1024 context, or as much as the target's
    max_position_embeddings leaves) on the same engine; under TP its GEMMs are one rank's shard, alone.
    tp: under `mpirun -n R*tp`, every rank loads its shard and the R leaders time (each step
    broadcast to its workers, as in serving); world rank 0 returns replica 0's profile with every
    replica's decode_ms in meta, the other ranks None (docs/tensor_parallel.md).
    chunk_lens: also time each (b, K) with a prompt chunk of each length riding (measure_chunk_ms);
    on CUDA under graphs "full" the mixed steps run their whole-forward graphs, as served.
    catch_up: also time the K=1 step after that many K=0 steps (lazy draft sync: measure_catch_up_ms)."""
    from dynspec.runtime.serving.loop import Loop
    from dynspec.runtime.serving.overlap import cache_slack

    batch_sizes, draft_lens, context_lens = sorted(set(batch_sizes)), sorted(set(draft_lens)), sorted(set(context_lens))
    if not context_lens or context_lens[0] < 1:
        raise DynspecError(f"--context-lens {context_lens} needs one or more contexts >= 1")
    draft_lens = [0] + draft_lens if 0 not in draft_lens else draft_lens   # plain decode: every gain's baseline
    kmax = max(draft_lens)
    max_b = max(batch_sizes + ([acceptance_concurrency] if acceptance_requests else []))
    max_b += 1 if chunk_lens else 0            # the chunk's prompt takes a slot beside the rows
    _check_catch_up(catch_up, context_lens[0])          # before the engine opens
    if (chunk_lens := sorted(set(chunk_lens))) and chunk_lens[0] < 1:
        raise DynspecError(f"--chunk-lens {chunk_lens} needs chunks of >= 1 tokens")
    seq = context_lens[-1] + max([kmax + 1] + chunk_lens)
    floor_context = FLOOR_CONTEXT
    if floor:                                  # the overlapped decode's verify windows past the floor's context
        slack = cache_slack(max(kmax, 1), Loop.OVERLAPPED)
        floor_context = min(FLOOR_CONTEXT, target_positions(cfg.target_dir) - slack)   # a short model: what fits
        if floor_context < 1:
            raise DynspecError(f"--floor: the target's max_position_embeddings leaves no context beside the "
                               f"overlapped loop's {slack} positions of slack")
        seq = max(seq, floor_context + slack)
    if acceptance_requests:
        seq = max(seq, max(r.input_len + r.output_tokens for r in acceptance_requests) + kmax + 1)
    if max_seq_len is not None:
        if max_seq_len < seq:
            raise DynspecError(f"--max-seq-len {max_seq_len} is below the {seq} positions this profile needs")
        seq = max_seq_len
    keep_warm = cfg.reference.keep_warm

    def load(ctx=None):
        engine = open_sized(cfg, device=device, tp=ctx, max_batch_size=max_b, max_seq_len=seq,
                            max_draft_len=max(kmax, 1))
        if device.startswith("cuda") and cfg.reference.graphs is GraphMode.FULL:
            _capture(engine, cfg, draft_lens, max_b, chunk_lens)
        return engine

    if tp == 1:
        return _measure(load(), cfg, device, batch_sizes, draft_lens, context_lens, keep_warm, seq, max_b, warmup,
                        repeats, acceptance_requests, acceptance_concurrency, meta, progress,
                        floor_context if floor else None, chunk_lens, catch_up)
    from dynspec.benchmarks.mpi import split_leaders, world
    from dynspec.runtime.tp.tp_lifecycle import run_replica

    leaders = split_leaders(world(), tp)                     # collective: every rank, before the groups
    meta = dict(meta or {}, tp=tp)
    ctx, _, prof = run_replica(tp, load, lambda engine, ctx: _measure(
        engine, cfg, device, batch_sizes, draft_lens, context_lens, keep_warm, seq, max_b, warmup, repeats,
        acceptance_requests, acceptance_concurrency, meta, progress, floor_context if floor else None, chunk_lens,
        catch_up),
        device=device,
        allreduce=allreduce)
    if leaders is None:
        return None
    every = leaders.gather([t.decode_ms for t in prof.tables])          # per replica: one dict per context
    if not leaders.is_root:
        return None
    used = {"allreduce": ctx.reducer.mode, "allreduce_requested": allreduce,   # auto may have fallen back
            "allreduce_fallback": ctx.reducer.fallback or None}
    return Profile(prof.device, prof.tables, prof.per_position,
                   dict(prof.meta, replicas=leaders.size, replica_decode_ms=every, **used))


def _capture(engine, cfg, draft_lens, max_b: int, chunk_lens) -> None:
    """The graphs of every timed shape: the decode graphs; with chunk_lens the serving capture
    sequence (runtime/generate/session.py capture: the whole-forward graphs of mixed steps too)."""
    from dynspec.runtime.engines.reference.engine import reachable_graphs
    from dynspec.runtime.policy import ConstantK

    keys = (set(reachable_graphs([ConstantK(k) for k in draft_lens], max_b, cfg.reference.draft_sync,
                                 engine.max_num_tokens))
            | set(reachable_graphs([ConstantK(0)], max_b, False, engine.max_num_tokens)))
    if chunk_lens:
        from dynspec.runtime.generate.session import capture

        capture(engine, keys, cfg.reference)
    else:
        engine.capture_decode_graphs(keys)


def _measure(engine, cfg, device, batch_sizes, draft_lens, context_lens, keep_warm, seq, max_b, warmup, repeats,
             acceptance_requests, acceptance_concurrency, meta, progress, floor: int | None,
             chunk_lens: Sequence[int] = (), catch_up: int = 0) -> Profile:
    """run_profile's measurements on an open engine (a TP leader's LeaderEngine under TP); floor:
    the context of measure_floor's decode step, or None (no floor)."""
    from dynspec.benchmarks.engines import device_name, graphs_run

    kmax = max(draft_lens)
    tables = []
    for ctx in context_lens:
        lazy = cfg.reference.draft_sync == "lazy"
        table, decode = measure_iteration_ms(engine, batch_sizes, draft_lens, ctx, keep_warm=keep_warm,
                                             warmup=warmup, repeats=repeats, progress=progress, lazy=lazy)
        chunk = measure_chunk_ms(engine, batch_sizes, draft_lens, ctx, chunk_lens, warmup=warmup, repeats=repeats,
                                 progress=progress, lazy=lazy) if chunk_lens else None
        tables.append(ContextTable(ctx, table, decode, chunk))
    pp = None
    if acceptance_requests and kmax > 0:
        pp = measure_acceptance(engine, acceptance_requests, kmax, acceptance_concurrency)
    info = {"max_seq_len": seq, "max_batch_size": max_b, "keep_warm": keep_warm,
            "draft_sync": cfg.reference.draft_sync, "dtype": cfg.reference.dtype, "warmup": warmup, "repeats": repeats,
            "statistic": "median", "target_weight_bytes": weight_bytes(engine.target),
            "graphs": graphs_run(cfg, device), "cuda_graphs": graphs_run(cfg, device) == GraphMode.FULL.value}
    budget = getattr(cfg.reference, "max_num_tokens", None)
    if budget is not None:
        info["max_num_tokens"] = budget          # the token budget `dynspec tune` must respect
    if catch_up:
        info["catch_up"] = measure_catch_up_ms(engine, batch_sizes, context_lens[0], catch_up, warmup=warmup,
                                               repeats=repeats, progress=progress)
    info["eager_fallbacks"] = getattr(engine, "eager_fallbacks", 0)   # steps timed outside their graphs
    if floor is not None:
        fl = measure_floor(engine, warmup=max(warmup, 3), repeats=max(repeats, 20), context_len=floor)
        info.update(gemm_floor_ms=fl["gemm_floor_ms"], floor=fl)
    info.update(meta or {})
    return Profile(device_name(device), tuple(tables), pp, info)
