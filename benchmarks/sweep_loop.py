"""One sweep's measurement on an open reference engine: every (load point, mode, trial) on
every rank of the world, the modes' order rotated per trial; rank 0 gathers the rows."""
from __future__ import annotations

import sys
from dataclasses import replace
from typing import Sequence

from dynspec.benchmarks.mpi import World, log
from dynspec.benchmarks.sweep_modes import COST_MODES, base_mode
from dynspec.benchmarks.sweep_plan import LoadPoint, SweepSpec
from dynspec.benchmarks.sweep_rows import (StepTrace, adaptive_fields, capture_fields, make_row, matched_rate, median_trial,
                                           padding_share, step_times, trial_fields)


def open_engine(specs: Sequence[SweepSpec], cfg, device: str, tp=None):
    """The reference engine sized for every spec (sweep_cases.engine_sizes; tp: this rank's
    TpContext, for its shard), with the union of every spec's modes' reachable CUDA graphs
    captured once (every mode's executor shares it). Under TP every rank of a replica captures
    the same keys in the same order."""
    from dynspec.benchmarks.engines import open_sized
    from dynspec.benchmarks.sweep_cases import engine_sizes, graph_keys
    from dynspec.runtime.generate.session import capture

    sizes = engine_sizes(specs)
    engine = open_sized(cfg, device=device, tp=tp, **sizes)
    log(f"opened the reference engine: max batch {sizes['max_batch_size']}, cache {sizes['max_seq_len']} positions,"
        f" K <= {sizes['max_draft_len']}" + (f", for {len(specs)} sweeps" if len(specs) > 1 else ""))
    if str(engine.device).startswith("cuda"):
        n = capture(engine, graph_keys(specs, engine.max_batch_size, engine.max_num_tokens), cfg.reference)
        log(f"captured {n} CUDA graphs per replica")
    return engine


def open_for_rank(specs: Sequence[SweepSpec], cfg, device: str, w: World, threads: int | None = None):
    """This rank's engine without TP: its device (cuda:<local rank> for --device cuda), its CPU threads."""
    import torch

    from dynspec.benchmarks.engines import device_for_rank, set_cpu_threads

    dev = device_for_rank(device, w.local_rank)
    set_cpu_threads(threads, dev)
    if dev.startswith("cuda"):
        torch.cuda.set_device(torch.device(dev))
    return open_engine(specs, cfg, dev)


def run_reference(spec: SweepSpec, cfg, device: str, w: World, progress: bool, threads: int | None = None,
                  on_rows=None, engine=None, label: str = "sweep") -> list[dict]:
    """Every rank of w: run every (load point, mode); w's rank 0 returns the rows (others return []).
    on_rows(rows so far) runs on rank 0 after each load point (a killed sweep keeps what finished).
    engine: already open (a TP leader's LeaderEngine, w then holds the leaders only; or one engine
    shared by several sweeps, open_engine). label: the progress bar's."""
    if engine is None:
        engine = open_for_rank([spec], cfg, device, w, threads)
    sweep = ReferenceSweep(spec, engine, w)
    sweep.warm_up()
    if progress and w.is_root:
        sweep.open_bar(label)
    try:
        return sweep.run(on_rows)
    finally:
        sweep.close_bar()


class ReferenceSweep:
    """One SweepSpec on an open engine, on every rank of w (each rank its own shard of the requests)."""

    def __init__(self, spec: SweepSpec, engine, w: World):
        self.spec, self.engine, self.w = spec, engine, w
        self.schedules, self.sync, self.loops = dict(spec.schedules), dict(spec.draft_sync), dict(spec.loops)
        self.bar = None

    def executor(self, mode: str, n: int) -> StepTrace:
        """A fresh executor (its request ids, the acceptance keys, count from 0) for a run of n
        requests, through the mode's executor loop (SweepSpec.loops)."""
        from dynspec.runtime.policy.acceptance import resolve as resolve_acceptance
        from dynspec.runtime.serving.executor import Executor

        return StepTrace(Executor(self.engine, self.schedules[mode], draft_sync=self.sync[mode],
                                  acceptance=resolve_acceptance(self.spec.acceptance, n), allow_lossy=True,
                                  loop=self.loops[mode]), adaptive=base_mode(mode) in COST_MODES)

    def warm_up(self) -> None:
        """Untimed: every mode at batch 1 and at the largest concurrency (short outputs), so
        first-use costs (allocator growth, kernel selection) stay out of the first timed run."""
        from dynspec.benchmarks.loadgen import closed_loop
        from dynspec.benchmarks.workload import take

        spec = self.spec
        if spec.warmup_requests <= 0:
            return

        def closed(ex, reqs, c):
            closed_loop(ex, reqs, c)
            ex.run_until_idle()          # overlapped: the iteration still in flight read back

        top = max([p.concurrency for p in spec.points if p.concurrency is not None] + [1])
        short = [replace(r, output_tokens=min(r.output_tokens, 8)) for r in spec.requests]
        for m in spec.modes:
            closed(self.executor(m, spec.warmup_requests), take(short, spec.warmup_requests), 1)
            if top > 1:
                closed(self.executor(m, top), take(short, top), top)
        log(f"warmed up: {spec.warmup_requests} requests at C=1" + (f" and {top} at C={top}" if top > 1 else "")
            + " per mode")

    def open_bar(self, label: str) -> None:
        """A tqdm bar over every request of every (load point, mode, trial) on this rank."""
        from tqdm import tqdm

        spec = self.spec
        total = (sum(spec.count.at(p) for p in spec.points)
                 + sum(spec.count.at(LoadPoint(concurrency=c)) for c in spec.poisson_at)) * len(spec.modes) * spec.trials
        self.bar = tqdm(total=total, unit="req", desc=label, dynamic_ncols=True, file=sys.stderr)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def run_point(self, p: LoadPoint) -> list:
        """Every trial of every mode at p on this rank: [(p, mode, trial, RunRecord, steps, overlapped)],
        steps the adaptive mode's per-iteration records (ADAPTIVE_FIELDS), () for the other modes."""
        import torch

        from dynspec.benchmarks.loadgen import closed_loop, open_loop
        from dynspec.benchmarks.workload import take
        from dynspec.runtime.serving.gc_heap import freeze_heap

        spec, w, bar = self.spec, self.w, self.bar
        n = spec.count.at(p)
        mine = take(spec.requests, n, w.rank * n)
        out = []
        for t in range(spec.trials):
            # rotate the mode order per trial, so drift over time does not favour one mode
            for m in spec.modes[t % len(spec.modes):] + spec.modes[: t % len(spec.modes)]:
                if bar is not None:
                    bar.set_postfix_str(f"{p.label} {m}" + (f" trial {t + 1}" if spec.trials > 1 else ""))
                torch.manual_seed(spec.seed + w.rank)     # Bernoulli draws: the same stream for every run
                traced = self.executor(m, n)
                freeze_heap()       # untimed: earlier runs' records out of the collector's walk (runtime/serving/gc_heap.py)
                w.barrier()
                cb = bar.update if bar is not None else None
                if p.concurrency is not None:
                    rec = closed_loop(traced, mine, p.concurrency, progress=cb)
                else:
                    rec = open_loop(traced, mine, p.request_rate, seed=spec.seed + w.rank, progress=cb)
                traced.run_until_idle()          # overlapped: the last launch read back, after the timing
                out.append((p, m, t, rec, traced.steps, traced.overlapped))
        return out

    def point_rows(self, records: list) -> list[dict]:
        """Rows of the finished load points (rank 0; [] elsewhere): the median trial + spread per mode."""
        from dynspec.benchmarks.metrics import request_table, summarize
        from dynspec.runtime.policy.acceptance import resolve as resolve_acceptance

        spec, w = self.spec, self.w
        gathered = w.gather(records)
        if not w.is_root:
            return []
        trials: dict[tuple, list] = {}
        steps: dict[tuple, list] = {}
        overlapped_its: dict[tuple, list] = {}
        pads: dict[tuple, list] = {}
        tables: dict[tuple, list] = {}          # per trial: request_table over the replicas
        times: dict[tuple, list] = {}           # per trial: step_times over the replicas
        forward = getattr(self.engine, "forward_tokens", None)
        for i, (p, m, t, *_) in enumerate(records):
            if forward is not None:
                pads.setdefault((p, m), []).append(
                    padding_share([s for rank_records in gathered for s in rank_records[i][3].steps], forward))
            trials.setdefault((p, m), []).append(summarize((rank_records[i][3] for rank_records in gathered),
                                                           p.concurrency))
            steps.setdefault((p, m), []).append([list(rank_records[i][4]) for rank_records in gathered])
            overlapped_its.setdefault((p, m), []).append(sum(rank_records[i][5] for rank_records in gathered))
            tables.setdefault((p, m), []).append(request_table(rank_records[i][3] for rank_records in gathered))
            times.setdefault((p, m), []).append(step_times([rank_records[i][3].steps for rank_records in gathered]))
        rows = []
        for p in dict.fromkeys(p for p, _ in trials):
            for m in spec.modes:
                mets = trials[(p, m)]
                med = median_trial(mets)
                row = make_row(p, m, spec, self.schedules[m], self.sync[m], med, w.size)
                row.update(trial_fields(mets), overlapped_iterations=overlapped_its[(p, m)][mets.index(med)],
                           per_request=tables[(p, m)][mets.index(med)],    # the median trial's requests
                           step_times=times[(p, m)][mets.index(med)])      # ... and iterations
                if forward is not None:
                    row["padding_share"] = pads[(p, m)][mets.index(med)]
                row.update(capture_fields(self.engine))
                if base_mode(m) in COST_MODES:
                    row.update(adaptive_fields(steps[(p, m)], resolve_acceptance(spec.acceptance, spec.count.at(p))))
                rows.append(row)
        return rows

    def run(self, on_rows=None) -> list[dict]:
        """Every load point in order (a --poisson-at C's open loop right after its closed loop);
        on_rows(rows so far) on rank 0 after each."""
        from dynspec.benchmarks.metrics import summarize

        spec, w = self.spec, self.w
        rows: list[dict] = []
        ref_mode = "baseline" if "baseline" in spec.modes else spec.modes[0]
        for p in spec.points:
            done = self.run_point(p)
            if p.concurrency in spec.poisson_at:
                # rate = what the reference mode sustained here, agreed on by every rank
                ref = w.gather([rec for q, m, _, rec, *_ in done if m == ref_mode])
                rate = w.bcast(matched_rate([summarize(trial) for trial in zip(*ref)], w.size) if w.is_root else None)
                done += self.run_point(LoadPoint(request_rate=rate, matched_concurrency=p.concurrency))
            rows += self.point_rows(done)
            if on_rows is not None and w.is_root:
                on_rows(rows)
        return rows
