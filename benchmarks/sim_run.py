"""The serving simulator's replay: one sweep's flags run through the product's executor, load
generator and policies on a simulated engine (benchmarks/sim_engine.py); benchmarks/simulate.py is
its command line and the validation against recorded GPU runs (docs/design.md, "The serving
simulator"). fit_prices replays recorded runs to fit their step prices (benchmarks/sim_fit.py)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from dynspec.errors import DynspecError


@dataclass(frozen=True)
class SimRun:
    """One sweep to simulate: its flags (the sweep's own), the engine's sizes and its cost model."""
    flags: tuple[str, ...]
    cost_model: str
    max_batch_size: int
    max_seq_len: int
    max_num_tokens: int = 8192
    rates: tuple[tuple[int, float], ...] = ()    # Poisson rate per --poisson-at C (default: the baseline's simulated)
    prices: object = None                        # step_prices.StepPrices (None: unfitted)
    policy_prices: object = None                 # the cost-model policies' StepPrices as the run served (None: none)
    rule: tuple = ()                             # the per-request policies' settings as the run served them
    draft_sync: str = "warm"                     # the drafting modes' draft sync as served (baseline: none)
    store_prompts: bool = True                   # lazy sync stored K=0 steps' prompt chunks (Executor's option)
    overlap: bool = False                        # a mode without a loop suffix runs the overlapped loop, as the
                                                 # sweep's do on CUDA (sim_engine.py); False: the serial loop

    RULE_FIELDS = ("prior_weight", "optimism", "floor", "rated_floor")   # what a recorded rule may set

def _sweep_args(flags: Sequence[str]) -> argparse.Namespace:
    from dynspec.benchmarks.sweep_args import make_parser

    parser = make_parser()
    parser.exit_on_error = False
    try:
        return parser.parse_args([*flags, "--out", "-"])
    except (argparse.ArgumentError, SystemExit) as e:
        raise DynspecError(f"simulator: sweep flags {' '.join(flags)!r} do not parse: {e}") from None


def served_sync(flags: Sequence[str]) -> str:
    """The drafting modes' draft sync a sweep's flags ask for (sweep_plan.draft_sync_of), the engine
    dir's being engine.json's default."""
    from dynspec.benchmarks.sweep_plan import draft_sync_of
    from dynspec.config import ReferenceSettings

    return draft_sync_of(_sweep_args(flags), ReferenceSettings().draft_sync)


def policies(args: argparse.Namespace, cost_model: str, max_batch_size: int, prices=None,
             rule: tuple = ()) -> tuple[dict, int]:
    """({mode: the policy the sweep runs it with}, the engine's max_draft_len): sweep_modes.mode_policies
    on the sweep's flags (no engine dir), priced with `prices` (StepPrices, None: none); the
    per-request modes take `rule` ((name, value) pairs of PerRequestPolicy's settings: a recorded
    run's rule, where it ran an earlier one)."""
    from dynspec.benchmarks.sweep_modes import base_mode, mode_policies, parse_modes, price_catch_ups, read_schedule_arg
    from dynspec.runtime.policy import DraftSchedule

    modes = parse_modes(args.modes)
    dynamic = read_schedule_arg(args.dynamic_schedule) if args.dynamic_schedule else DraftSchedule()
    pols, kmax = mode_policies(modes, dynamic, args.static_k, max_batch_size, Path(cost_model), prices,
                               args.ttft_weight, args.prefill_k)
    price_catch_ups(pols, args.catch_up_price)
    for m, pol in pols.items():
        for name, value in rule if base_mode(m) in ("per-request", "per-request-oracle") else ():
            setattr(pol, name, value)
    return pols, kmax


def simulate(run: SimRun, progress: bool = False) -> list[dict]:
    """Every (load point, mode) of the run -> rows {mode, concurrency, request_rate, output_tok_per_s,
    iterations, mean_k, mixed_iterations, p50_ttft_s, ...}, the sweep's order."""
    from dynspec.benchmarks.sweep_plan import LoadPoint, load_plan, poisson_at
    from dynspec.benchmarks.workload import LengthDist, synthetic
    from dynspec.runtime.policy.acceptance import parse_acceptance
    from dynspec.runtime.policy.catch_up_price import CatchUpPrice
    from dynspec.runtime.policy.cost_model import CostModel

    args = _sweep_args(run.flags)
    conc, points, count = load_plan(args)
    pols, kmax = policies(args, run.cost_model, run.max_batch_size, run.policy_prices, run.rule)
    cost = CostModel.load(run.cost_model)
    line = cost.catch_up if run.draft_sync == "lazy" and cost.catch_up is not None else CatchUpPrice()
    acceptance = parse_acceptance(args.acceptance, seed=args.seed)
    n = max(count.at(p) for p in points)
    reqs = synthetic(n, LengthDist.parse(args.input_len, "--input-len"), LengthDist.parse(args.output_len, "--output-len"),
                     vocab_size=2, seed=args.seed)
    rates = dict(run.rates)
    rows: list[dict] = []
    bar = _bar((len(points) + len(poisson_at(args))) * len(pols), progress)
    for p in points:
        done = [_one(run, cost, line, pols[m], m, p, acceptance, reqs[:count.at(p)], kmax, args.seed) for m in pols]
        rows += done
        bar.update(len(done))
        if p.concurrency in poisson_at(args):
            ref = next((r for r in done if r["mode"] == "baseline"), done[0])
            rate = rates.get(p.concurrency, ref["requests_per_s"])
            q = LoadPoint(request_rate=rate, matched_concurrency=p.concurrency)
            rows += [_one(run, cost, line, pols[m], m, q, acceptance, reqs[:count.at(q)], kmax, args.seed) for m in pols]
            bar.update(len(pols))
    bar.close()
    return rows


def _one(run: SimRun, cost, line, policy, mode: str, p, acceptance, reqs, kmax: int, seed: int) -> dict:
    """One (load point, mode) on a fresh simulated engine and executor -> its row (line: the
    catch-up's price, CostModel.catch_up)."""
    from dynspec.benchmarks.loadgen import closed_loop, open_loop
    from dynspec.benchmarks.metrics import summarize
    from dynspec.benchmarks.sim_engine import SimClock, SimEngine, shape_of
    from dynspec.benchmarks.sweep_modes import base_mode, mode_loop
    from dynspec.benchmarks.sweep_rows import padding_share
    from dynspec.runtime.policy.acceptance import resolve
    from dynspec.runtime.engines.reference.engine import DRAFT_SYNC_CAP
    from dynspec.runtime.serving.executor import Executor
    from dynspec.runtime.serving.loop import Loop
    from dynspec.runtime.policy.step_prices import StepPrices

    clock = SimClock()
    lazy = run.draft_sync == "lazy"
    loop = mode_loop(mode, Loop.OVERLAPPED if run.overlap else Loop.SERIAL)
    engine = SimEngine(cost, shape_of(run.max_batch_size, run.max_seq_len, kmax, run.max_num_tokens,
                                      draft_sync_cap=DRAFT_SYNC_CAP if lazy else 0), clock, run.prices or StepPrices(), line,
                       overlapped=loop is Loop.OVERLAPPED)
    ex = Executor(engine, policy, draft_sync=run.draft_sync if base_mode(mode) != "baseline" else "off",
                  store_prompts=run.store_prompts, acceptance=resolve(acceptance, len(reqs)),
                  allow_lossy=True, clock=clock, stats_limit=0, loop=loop)
    if p.concurrency is not None:
        rec = closed_loop(ex, reqs, p.concurrency, clock=clock)
    else:
        rec = open_loop(ex, reqs, p.request_rate, seed=seed, clock=clock, sleep=clock.sleep)
    m = summarize([rec], p.concurrency)
    ks = [s.k for s in rec.steps if s.batch_size]
    return {"mode": mode, "concurrency": p.concurrency, "request_rate": p.request_rate,
            "matched_concurrency": p.matched_concurrency, "output_tok_per_s": m.output_tok_per_s,
            "requests_per_s": m.requests_per_s, "iterations": m.iterations, "mean_step_ms": m.mean_step_ms,
            "mixed_iterations": m.mixed_iterations, "mean_k": sum(ks) / len(ks) if ks else 0.0,
            "p50_ttft_s": m.p50_ttft_s, "p99_ttft_s": m.p99_ttft_s, "p50_tpot_s": m.p50_tpot_s,
            "duration_s": m.duration_s, "padding_share": padding_share(rec.steps, engine.forward_tokens),
            "base_ms": engine.base_ms, "features": list(engine.features)}


def _bar(total: int, progress: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="run", desc="simulate", disable=not progress, file=sys.stderr)


def load_key(row: dict) -> str:
    return f"C={row['concurrency']}" if row.get("concurrency") is not None else f"poisson~C={row['matched_concurrency']}"


def observations(runs, prices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(F [n, 5], S [n], measured [n]) of every closed-loop (run, load, mode), replayed at `prices`."""
    F, S, y = [], [], []
    for meta, run in runs:
        sim = {(load_key(r), r["mode"]): r for r in simulate(replace(run, prices=prices))}
        for m in meta["measured"]:
            if not m["load"].startswith("C="):
                continue
            r = sim[(m["load"], m["mode"])]
            F.append(r["features"])
            S.append(r["base_ms"])
            y.append(m["mean_step_ms"] * m["iterations"])
    return np.array(F, dtype=float), np.array(S, dtype=float), np.array(y, dtype=float)


def fit_prices(runs):
    """The step prices of recorded runs (sim_fit.py's module docstring): FIT_ROUNDS replays and fits."""
    from dynspec.benchmarks import sim_fit
    from dynspec.runtime.policy.step_prices import StepPrices

    prices = StepPrices(chunk_ms_per_token=0.0)
    for _ in range(sim_fit.FIT_ROUNDS):
        prices = sim_fit.solve(*observations(runs, prices))
    return prices
