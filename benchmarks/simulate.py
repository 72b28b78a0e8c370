"""The serving simulator: the executor's serving loop on a measured cost model, on CPU in seconds
(docs/design.md, "The serving simulator").

    python -m dynspec.benchmarks.simulate --cost-model profile.json --max-batch-size 256 \\
        --modes baseline,adaptive,per-request,per-request-oracle --acceptance bernoulli-mix:0.95@0.3,0.05@0.7 \\
        --concurrency 16,64,256 --out sim
    python -m dynspec.benchmarks.simulate --validate benchmarks/sim_data --out validation
    python -m dynspec.benchmarks.simulate --fit benchmarks/sim_data/h100-6e9fc00 --out benchmarks/sim_data/h100_prices

What runs is the product's own code: the Executor (serial loop), the load generator (closed-loop
waves, Poisson arrivals), chunked prefill under max_num_tokens, and every policy object exactly as
a sweep builds it (sweep_modes), on the sweep's own flags and seeded workload. Only the engine is
simulated (benchmarks/sim_engine.py): acceptance drawn as the GPU engine draws it, time from the cost
model. --validate replays recorded GPU sweeps (benchmarks/sim_data/*/runs.json: each run's flags,
engine sizes and measured tok/s) on the cost model of the device that ran them, and reports
simulated against measured tok/s and every mode / baseline ratio (sim_validate's summary).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from dynspec.errors import DynspecError

TOK_TOLERANCE = 0.05          # |simulated / measured - 1| per mode and load
RATIO_TOLERANCE = 0.03        # |simulated ratio / measured ratio - 1|, mode / baseline


@dataclass(frozen=True)
class SimRun:
    """One sweep to simulate: its flags (the sweep's own), the engine's sizes and its cost model."""
    flags: tuple[str, ...]
    cost_model: str
    max_batch_size: int
    max_seq_len: int
    max_num_tokens: int = 8192
    rates: tuple[tuple[int, float], ...] = ()    # Poisson rate per --poisson-at C (default: the baseline's simulated)
    prices: object = None                        # sim_engine.StepPrices (None: unfitted)


def _sweep_args(flags: Sequence[str]) -> argparse.Namespace:
    from dynspec.benchmarks.sweep_args import make_parser

    parser = make_parser()
    parser.exit_on_error = False
    try:
        return parser.parse_args([*flags, "--out", "-"])
    except (argparse.ArgumentError, SystemExit) as e:
        raise DynspecError(f"simulator: sweep flags {' '.join(flags)!r} do not parse: {e}") from None


def policies(args: argparse.Namespace, cost_model: str, max_batch_size: int) -> dict:
    """mode -> the policy object the sweep runs it with (sweep_plan.resolve's rule, no engine dir)."""
    from dynspec.benchmarks.sweep_modes import (COST_MODES, adaptive_policy, base_mode, cost_policy, mode_schedules,
                                                parse_modes, read_schedule_arg)
    from dynspec.runtime.policy import DraftSchedule

    modes = parse_modes(args.modes)
    dynamic = read_schedule_arg(args.dynamic_schedule) if args.dynamic_schedule else DraftSchedule()
    out = mode_schedules(modes, dynamic, args.static_k, max_batch_size)
    kmax = max([s.max_draft_len for s in out.values()] + [1])
    if any(base_mode(m) in COST_MODES for m in modes):
        kmax = max([kmax, *adaptive_policy(Path(cost_model), None).candidates])
        out.update({m: cost_policy(m, Path(cost_model), kmax) for m in modes if base_mode(m) in COST_MODES})
    return {m: out[m] for m in modes}


def simulate(run: SimRun, progress: bool = False) -> list[dict]:
    """Every (load point, mode) of the run -> rows {mode, concurrency, request_rate, output_tok_per_s,
    iterations, mean_k, mixed_iterations, p50_ttft_s, ...}, the sweep's order."""
    from dynspec.benchmarks.sweep_modes import base_mode
    from dynspec.benchmarks.sweep_plan import LoadPoint, load_plan, poisson_at
    from dynspec.benchmarks.workload import LengthDist, synthetic
    from dynspec.runtime.acceptance import parse_acceptance
    from dynspec.runtime.cost_model import CostModel

    args = _sweep_args(run.flags)
    conc, points, count = load_plan(args)
    pols = policies(args, run.cost_model, run.max_batch_size)
    cost = CostModel.load(run.cost_model)
    acceptance = parse_acceptance(args.acceptance, seed=args.seed)
    n = max(count.at(p) for p in points)
    reqs = synthetic(n, LengthDist.parse(args.input_len, "--input-len"), LengthDist.parse(args.output_len, "--output-len"),
                     vocab_size=2, seed=args.seed)
    kmax = max(getattr(p, "max_draft_len", 0) for p in pols.values())
    rates = dict(run.rates)
    rows: list[dict] = []
    todo = [(p, m) for p in points for m in pols]
    bar = _bar(len(todo) + len(poisson_at(args)) * len(pols), progress)
    for p in points:
        done = [_one(run, cost, pols[m], m, p, acceptance, reqs[:count.at(p)], kmax, base_mode(m)) for m in pols]
        rows += done
        bar.update(len(done))
        if p.concurrency in poisson_at(args):
            ref = next((r for r in done if r["mode"] == "baseline"), done[0])
            rate = rates.get(p.concurrency, ref["requests_per_s"])
            q = LoadPoint(request_rate=rate, matched_concurrency=p.concurrency)
            rows += [_one(run, cost, pols[m], m, q, acceptance, reqs[:count.at(q)], kmax, base_mode(m)) for m in pols]
            bar.update(len(pols))
    bar.close()
    return rows


def _one(run: SimRun, cost, policy, mode: str, p, acceptance, reqs, kmax: int, base: str) -> dict:
    from dynspec.benchmarks.loadgen import closed_loop, open_loop
    from dynspec.benchmarks.metrics import summarize
    from dynspec.benchmarks.sim_engine import SimClock, SimEngine, StepPrices, shape_of
    from dynspec.runtime.acceptance import resolve
    from dynspec.runtime.executor import Executor

    clock = SimClock()
    engine = SimEngine(cost, shape_of(run.max_batch_size, run.max_seq_len, kmax, run.max_num_tokens), clock,
                       run.prices or StepPrices())
    ex = Executor(engine, policy, keep_warm=base != "baseline", acceptance=resolve(acceptance, len(reqs)),
                  allow_lossy=True, clock=clock, stats_limit=0)
    if p.concurrency is not None:
        rec = closed_loop(ex, reqs, p.concurrency, clock=clock)
    else:
        rec = open_loop(ex, reqs, p.request_rate, seed=_seed(run), clock=clock, sleep=clock.sleep)
    m = summarize([rec], p.concurrency)
    ks = [s.k for s in rec.steps if s.batch_size]
    return {"mode": mode, "concurrency": p.concurrency, "request_rate": p.request_rate,
            "matched_concurrency": p.matched_concurrency, "output_tok_per_s": m.output_tok_per_s,
            "requests_per_s": m.requests_per_s, "iterations": m.iterations, "mean_step_ms": m.mean_step_ms,
            "mixed_iterations": m.mixed_iterations, "mean_k": sum(ks) / len(ks) if ks else 0.0,
            "p50_ttft_s": m.p50_ttft_s, "p99_ttft_s": m.p99_ttft_s, "p50_tpot_s": m.p50_tpot_s,
            "duration_s": m.duration_s, "base_ms": engine.base_ms, "features": list(engine.features)}


def _seed(run: SimRun) -> int:
    return _sweep_args(run.flags).seed


def _bar(total: int, progress: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="run", desc="simulate", disable=not progress, file=sys.stderr)


# ---- validation against recorded GPU sweeps -------------------------------------------------------
def load_runs(data_dir: Path) -> list[tuple[dict, SimRun]]:
    """Every recorded run under data_dir (DIR/runs.json with its cost model beside it, and the step
    prices it names: fitted on runs of the same device, sim_fit.py), with `held_out` set in its meta
    where those prices were not fitted on it."""
    from dynspec.benchmarks import sim_fit

    out = []
    for f in sorted(Path(data_dir).glob("*/runs.json")):
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
            prices, fitted_on = None, []
            if doc.get("prices"):
                prices, _, fitted_on = sim_fit.read(f.parent / doc["prices"])
            for r in doc["runs"]:
                rates = tuple((int(c), float(v)) for c, v in r.get("poisson_rates", {}).items())
                out.append((dict(r, device=doc["device"], commit=doc["commit"], held_out=f.parent.name not in fitted_on,
                                 data_dir=f.parent.name),
                            SimRun(tuple(r["flags"]), str(f.parent / r.get("cost_model", doc["cost_model"])),
                                   int(r["max_batch_size"]), int(r["max_seq_len"]), int(r.get("max_num_tokens", 8192)),
                                   rates, prices)))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DynspecError(f"{f}: not a recorded-runs file ({type(e).__name__}: {e})") from None
    if not out:
        raise DynspecError(f"{data_dir}: no */runs.json with recorded GPU runs")
    return out


def _load_key(row: dict) -> str:
    return f"C={row['concurrency']}" if row.get("concurrency") is not None else f"poisson~C={row['matched_concurrency']}"


def validate(data_dir: Path, progress: bool = False) -> list[dict]:
    """[{config, case, device, load, mode, measured_tok_per_s, simulated_tok_per_s, tok_error,
    measured_ratio, simulated_ratio, ratio_error}] for every recorded (load, mode)."""
    out = []
    for meta, run in load_runs(data_dir):
        sim = {(_load_key(r), r["mode"]): r for r in simulate(run, progress)}
        measured = {(m["load"], m["mode"]): m["output_tok_per_s"] for m in meta["measured"]}
        for (load, mode), tok in measured.items():
            s = sim.get((load, mode))
            if s is None:
                raise DynspecError(f"{meta['config']}/{meta['case']}: the simulator ran no {mode} at {load}")
            base_m, base_s = measured.get((load, "baseline")), sim.get((load, "baseline"))
            ratio_m = tok / base_m if base_m else None
            ratio_s = s["output_tok_per_s"] / base_s["output_tok_per_s"] if base_s else None
            out.append({"config": meta["config"], "case": meta["case"], "device": meta["device"],
                        "commit": meta["commit"], "held_out": meta["held_out"], "load": load, "mode": mode, "measured_tok_per_s": tok,
                        "simulated_tok_per_s": s["output_tok_per_s"],
                        "tok_error": s["output_tok_per_s"] / tok - 1.0,
                        "measured_ratio": ratio_m, "simulated_ratio": ratio_s,
                        "ratio_error": None if ratio_m is None or mode == "baseline" else ratio_s / ratio_m - 1.0,
                        "simulated_mean_k": s["mean_k"]})
    return out


def within(rows: Sequence[dict]) -> bool:
    """Every tok/s within TOK_TOLERANCE and every mode / baseline ratio within RATIO_TOLERANCE."""
    return all(abs(r["tok_error"]) <= TOK_TOLERANCE and (r["ratio_error"] is None or abs(r["ratio_error"])
                                                           <= RATIO_TOLERANCE) for r in rows)


def validation_figures(doc: dict) -> dict:
    """The sim_validate suite figures: values.validation (one row per recorded mode and load), the
    share within tolerance, held out and in all; a table row per point; measured against simulated."""
    rows = doc["validation"]
    held = [r for r in rows if r["held_out"]]
    values = {"validation": rows, "within_tolerance": within(rows), "points": len(rows),
              "points_within": sum(within([r]) for r in rows), "held_out_points": len(held),
              "held_out_within": sum(within([r]) for r in held)}
    header = ["config", "case", "device", "load", "mode", "measured tok/s", "simulated tok/s", "error",
              "ratio error", "prices"]
    body = [[r["config"], r["case"], r["device"], r["load"], r["mode"], f"{r['measured_tok_per_s']:.0f}",
             f"{r['simulated_tok_per_s']:.0f}", f"{r['tok_error']:+.1%}",
             "-" if r["ratio_error"] is None else f"{r['ratio_error']:+.1%}", "held out" if r["held_out"] else "fitted"]
            for r in rows]
    pts = [[r["measured_tok_per_s"], r["simulated_tok_per_s"], r["simulated_tok_per_s"], r["simulated_tok_per_s"]]
           for r in rows]
    plot = {"title": "simulated against measured tok/s (one point per recorded mode and load)",
            "x": "measured tok/s", "y": "simulated tok/s", "series": {"validation": pts}}
    return {"values": values, "table": {"header": header, "rows": body}, "plot": plot}


def table(rows: Sequence[dict]) -> str:
    """Markdown: one line per (run, load, mode)."""
    lines = ["| config | case | device | load | mode | measured tok/s | simulated tok/s | error | ratio measured |"
             " ratio simulated | ratio error |", "|" + "---|" * 11]
    for r in rows:
        ratio = ("-", "-", "-") if r["ratio_error"] is None else (
            f"{r['measured_ratio']:.3f}", f"{r['simulated_ratio']:.3f}", f"{r['ratio_error']:+.1%}")
        lines.append(f"| {r['config']} | {r['case']} | {r['device']} | {r['load']} | {r['mode']} |"
                     f" {r['measured_tok_per_s']:.0f} | {r['simulated_tok_per_s']:.0f} | {r['tok_error']:+.1%} |"
                     f" {' | '.join(ratio)} |")
    return "\n".join(lines)


# ---- CLI --------------------------------------------------------------------------------------------
def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.simulate", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__,
                                allow_abbrev=False)
    p.add_argument("--validate", metavar="DIR", help="replay the recorded GPU runs under DIR (*/runs.json)")
    p.add_argument("--fit", metavar="RUNS_DIR", help="fit step prices on the recorded runs of RUNS_DIR (its runs.json)"
                                                    " -> OUT.json (benchmarks/sim_fit.py)")
    p.add_argument("--cost-model", metavar="FILE", help="the engine's cost model (a profile.json)")
    p.add_argument("--max-batch-size", type=int, default=256, help="the engine's max batch size (default 256)")
    p.add_argument("--max-seq-len", type=int, default=432, help="the engine's cache positions per row (default 432)")
    p.add_argument("--max-num-tokens", type=int, default=8192, help="tokens per iteration (default 8192)")
    p.add_argument("--out", required=True, help="results/NAME -> NAME.json and NAME.md")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, sweep_flags = make_parser().parse_known_args(argv)
    try:
        if args.fit:
            return _fit(Path(args.fit), Path(args.out), sweep_flags)
        if args.validate:
            if sweep_flags:
                raise DynspecError(f"--validate replays recorded runs; it takes no sweep flags ({' '.join(sweep_flags)})")
            rows = validate(Path(args.validate), not args.no_progress)
            doc, md = {"validation": rows, "within_tolerance": within(rows)}, table(rows)
        else:
            if not args.cost_model:
                raise DynspecError("give --cost-model FILE (the engine's profile.json) or --validate DIR")
            run = SimRun(tuple(sweep_flags), args.cost_model, args.max_batch_size, args.max_seq_len, args.max_num_tokens)
            rows = simulate(run, not args.no_progress)
            doc, md = {"rows": rows, "flags": sweep_flags}, _rows_table(rows)
        _write(Path(args.out), doc, md)
    except DynspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(md)
    return 0


def observations(runs, prices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(F [n, 5], S [n], measured [n]) of every closed-loop (run, load, mode), replayed at `prices`."""
    F, S, y = [], [], []
    for meta, run in runs:
        sim = {(_load_key(r), r["mode"]): r for r in simulate(replace(run, prices=prices))}
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
    from dynspec.benchmarks.sim_engine import StepPrices

    prices = StepPrices(chunk_ms_per_token=0.0)
    for _ in range(sim_fit.FIT_ROUNDS):
        prices = sim_fit.solve(*observations(runs, prices))
    return prices


def _fit(runs_dir: Path, out: Path, sweep_flags: Sequence[str]) -> int:
    """--fit: the step prices of RUNS_DIR's runs, written to OUT.json."""
    from dynspec.benchmarks import sim_fit

    if sweep_flags:
        raise DynspecError(f"--fit reads recorded runs; it takes no sweep flags ({' '.join(sweep_flags)})")
    runs = [x for x in load_runs(runs_dir.parent) if x[0]["data_dir"] == runs_dir.name]
    if not runs:
        raise DynspecError(f"{runs_dir}: no recorded runs (runs.json)")
    prices = fit_prices(runs)
    sim_fit.write(out.with_name(out.name + ".json"), prices, runs[0][0]["device"], [runs_dir.name])
    print(prices)
    return 0


def _rows_table(rows: Sequence[dict]) -> str:
    lines = ["| load | mode | tok/s | mean K | iterations | mixed | p50 TTFT ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ttft = "-" if r["p50_ttft_s"] is None else f"{r['p50_ttft_s'] * 1e3:.1f}"
        lines.append(f"| {_load_key(r)} | {r['mode']} | {r['output_tok_per_s']:.0f} | {r['mean_k']:.2f} |"
                     f" {r['iterations']} | {r['mixed_iterations']} | {ttft} |")
    return "\n".join(lines)


def _write(out: Path, doc: dict, md: str) -> None:
    """NAME.json and NAME.md, each written whole under a temporary name, then renamed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(doc, indent=1, default=_finite)), (".md", md + "\n")):
        tmp = out.with_name(out.name + suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out.with_name(out.name + suffix))


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


if __name__ == "__main__":
    sys.exit(main())
