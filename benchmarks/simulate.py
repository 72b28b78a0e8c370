"""The serving simulator: the executor's serving loop on a measured cost model, on CPU in seconds
(docs/design.md, "The serving simulator").

    python -m dynspec.benchmarks.simulate --cost-model profile.json --max-batch-size 256 \\
        --modes baseline,adaptive,per-request,per-request-oracle --acceptance bernoulli-mix:0.95@0.3,0.05@0.7 \\
        --concurrency 16,64,256 --out sim
    python -m dynspec.benchmarks.simulate --validate benchmarks/sim_data --out validation
    python -m dynspec.benchmarks.simulate --fit benchmarks/sim_data/h100-6e9fc00 --out benchmarks/sim_data/h100_prices

What runs is the product's own code: the Executor (serial loop; --overlap: the overlapped loop, a
simulated device queuing the steps, as the GPU serves), the load generator (closed-loop
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
import sys
from pathlib import Path
from typing import Sequence

from dynspec.benchmarks.sim_run import SimRun, load_key, fit_prices, served_sync, simulate
from dynspec.errors import DynspecError

TOK_TOLERANCE = 0.05          # |simulated / measured - 1| per mode and load
RATIO_TOLERANCE = 0.03        # |simulated ratio / measured ratio - 1|, mode / baseline


# ---- validation against recorded GPU sweeps -------------------------------------------------------
NO_PROMPT_WEIGHT = ("--ttft-weight", "0")   # runs recorded before the weight existed ran without it
ADAPTIVE_RULE = {"price_catch_up": "--catch-up-price"}   # runs.json adaptive_rule: the sweep flag each field sets


def load_runs(data_dir: Path) -> list[tuple[dict, SimRun]]:
    """Every recorded run under data_dir (DIR/runs.json with its cost model beside it, and the step
    prices it names: fitted on runs of the same device, sim_fit.py), with `held_out` set in its meta
    where those prices were not fitted on it."""
    from dynspec.runtime.policy.step_prices import read

    out = []
    for f in sorted(Path(data_dir).glob("*/runs.json")):
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
            prices, fitted_on = None, []
            rule = tuple(sorted(doc.get("per_request_rule", {}).items()))
            if any(k not in SimRun.RULE_FIELDS for k, _ in rule):
                raise ValueError(f"per_request_rule may set {', '.join(SimRun.RULE_FIELDS)} only (got {dict(rule)})")
            served = _served_flags(doc.get("adaptive_rule", {}))
            if doc.get("prices"):
                prices, _, fitted_on = read(f.parent / doc["prices"])
            for r in doc["runs"]:
                rates = tuple((int(c), float(v)) for c, v in r.get("poisson_rates", {}).items())
                flags = tuple(r["flags"]) + (() if "--ttft-weight" in r["flags"] else NO_PROMPT_WEIGHT) + served
                out.append((dict(r, device=doc["device"], commit=doc["commit"], held_out=f.parent.name not in fitted_on,
                                 data_dir=f.parent.name),
                            SimRun(flags, str(f.parent / r.get("cost_model", doc["cost_model"])),
                                   int(r["max_batch_size"]), int(r["max_seq_len"]), int(r.get("max_num_tokens", 8192)),
                                   rates, prices, policy_prices=_served_prices(r), rule=rule,
                                   draft_sync=doc.get("draft_sync", "warm"),
                                   store_prompts=bool(doc.get("store_prompts", True)))))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DynspecError(f"{f}: not a recorded-runs file ({type(e).__name__}: {e})") from None
    if not out:
        raise DynspecError(f"{data_dir}: no */runs.json with recorded GPU runs")
    return out


def _served_flags(rule: dict) -> tuple[str, ...]:
    """The sweep flags of a data set's adaptive_rule (the cost-model policies as its runs served them,
    where the rule has changed since): {"price_catch_up": false} -> ("--catch-up-price", "off")."""
    if any(k not in ADAPTIVE_RULE for k in rule):
        raise ValueError(f"adaptive_rule may set {', '.join(ADAPTIVE_RULE)} only (got {rule})")
    return tuple(x for k, on in sorted(rule.items()) for x in (ADAPTIVE_RULE[k], "on" if on else "off"))


def _served_prices(run: dict):
    """The StepPrices a recorded run's cost-model policies ran with (sim_record: its env block's), None
    where it records none (runs before the policies took them: per-row vectors at 1.0, chunks unpriced)."""
    from dynspec.runtime.policy.step_prices import StepPrices

    doc = run.get("policy_prices")
    return None if doc is None else StepPrices(**doc)


def validate(data_dir: Path, progress: bool = False) -> list[dict]:
    """[{config, case, device, load, mode, measured_tok_per_s, simulated_tok_per_s, tok_error,
    measured_ratio, simulated_ratio, ratio_error}] for every recorded (load, mode)."""
    out = []
    for meta, run in load_runs(data_dir):
        sim = {(load_key(r), r["mode"]): r for r in simulate(run, progress)}
        measured = {(m["load"], m["mode"]): m["output_tok_per_s"] for m in meta["measured"]}
        spread = {(m["load"], m["mode"]): (m["tok_per_s_min"], m["tok_per_s_max"]) for m in meta["measured"]}
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
                        "simulated_mean_k": s["mean_k"],
                        **trial_errors(s["output_tok_per_s"], ratio_s, spread[load, mode], spread.get((load, "baseline")),
                                       mode == "baseline")})
    return out


def to_range(x: float, lo: float, hi: float) -> float:
    """x's relative distance from [lo, hi]: 0 inside, else to the nearer end (1.10 of [1.0, 1.08] -> +1.9%)."""
    return 0.0 if lo <= x <= hi else x / (lo if x < lo else hi) - 1.0


def trial_errors(tok: float, ratio: float | None, trials: tuple, base: tuple | None, is_base: bool) -> dict:
    """The simulated point against the measured trials' spread: tok/s against [min, max] of the mode's
    trials, the ratio against [min / baseline max, max / baseline min]. A measurement whose trials
    spread wider than the tolerance (adaptive's pooled estimate settling at K=0 in one trial and K=1
    in another) bounds what any simulator can match: TOK / RATIO_TOLERANCE hold the medians, these the spread."""
    out = {"trial_tok_error": to_range(tok, *trials), "trial_ratio_error": None}
    if ratio is not None and base is not None and not is_base:
        out["trial_ratio_error"] = to_range(ratio, trials[0] / base[1], trials[1] / base[0])
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
    p.add_argument("--step-prices", metavar="FILE", help="the device's fitted step prices (runtime/policy/step_prices.py):"
                                                         " the steps' prices and the cost-model policies' (per-row vectors, prompt chunks)")
    p.add_argument("--overlap", action="store_true",
                   help="modes without a loop suffix run the overlapped loop, as the sweep's do on CUDA: the next step"
                        " planned while one runs, so a prompt waits about one step more (default: the serial loop)")
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
            from dynspec.runtime.policy.step_prices import read

            prices = read(args.step_prices)[0] if args.step_prices else None
            run = SimRun(tuple(sweep_flags), args.cost_model, args.max_batch_size, args.max_seq_len, args.max_num_tokens,
                         prices=prices, policy_prices=prices, draft_sync=served_sync(sweep_flags), overlap=args.overlap)
            rows = simulate(run, not args.no_progress)
            doc, md = {"rows": rows, "flags": sweep_flags}, _rows_table(rows)
        _write(Path(args.out), doc, md)
    except DynspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(md)
    return 0


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
        lines.append(f"| {load_key(r)} | {r['mode']} | {r['output_tok_per_s']:.0f} | {r['mean_k']:.2f} |"
                     f" {r['iterations']} | {r['mixed_iterations']} | {ttft} |")
    return "\n".join(lines)


def _write(out: Path, doc: dict, md: str) -> None:
    """NAME.json and NAME.md, each written whole under a temporary name, then renamed."""
    from dynspec.artifacts import write_text

    write_text(out.with_name(out.name + ".json"), json.dumps(doc, indent=1))
    write_text(out.with_name(out.name + ".md"), md + "\n")


if __name__ == "__main__":
    sys.exit(main())
