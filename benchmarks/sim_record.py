"""Records suite results of GPU sweeps as a data set the serving simulator replays
(benchmarks/simulate.py --validate; docs/design.md, "The serving simulator"):

    python -m dynspec.benchmarks.sim_record benchmarks/results/serving benchmarks/results/per_request_bimodal \\
        benchmarks/results/serving_256 --prices ../h100_prices.json --out benchmarks/sim_data/h100-823ad5c

OUT/runs.json holds one run per sweep (a config, or a config's case): its load flags, engine sizes,
Poisson rates and measured rows (the median trial of each mode and load), and the cost model it read,
copied beside it. Each sweep read ENGINE_DIR/cost_model.json, installed by the latest profile stage
that ended before it started among the given results (the suite's manifest.json says when):

    serving (profile installed 09:31) -> per_request_bimodal (09:40) -> serving_256
    => serving_256 read profile_per_request_bimodal.json

Flags the replay sets itself are dropped: the engine's (--engine-dir, --device, ...), --out, and
--step-prices (the data set names its prices); a --dynamic-schedule @FILE becomes the schedule run, a --prefill-k @FILE the cap.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Sequence

from dynspec.errors import DynspecError

DROP = {"--engine", "--engine-dir", "--device", "--dtype", "--graphs", "--no-progress", "--max-seq-len", "--out",
        "--cases", "--step-prices"}
MEASURED = ("output_tok_per_s", "tok_per_s_min", "tok_per_s_max", "iterations", "mean_step_ms",
            "mixed_iterations", "mean_k", "p50_ttft_s")


def load_flags(command: str, schedule: str | None, cap: object = None) -> list[str]:
    """The sweep's command -> the flags the replay takes ('--dynamic-schedule @F' -> the schedule,
    '--prefill-k @F' -> the cap recorded, env.prefill_k)."""
    words = shlex.split(command)
    words, out, i = words[words.index("dynspec.benchmarks.sweep") + 1:], [], 0
    while i < len(words):
        flag = words[i]
        takes = 0 if i + 1 == len(words) or words[i + 1].startswith("--") else 1
        value, i = words[i + 1:i + 1 + takes], i + 1 + takes
        if flag in DROP:
            continue
        if flag == "--dynamic-schedule" and value[0].startswith("@"):
            if not schedule:
                raise DynspecError(f"{command!r}: --dynamic-schedule {value[0]} but no schedule recorded")
            value = [schedule]
        if flag == "--prefill-k" and value[0].startswith("@"):
            if cap is None:
                raise DynspecError(f"{command!r}: --prefill-k {value[0]} but no cap recorded")
            value = [str(cap)]
        out += [flag, *value]
    return out


def load_label(row: dict) -> str:
    return f"C={row['concurrency']}" if not row.get("request_rate") else f"poisson~C={row['matched_concurrency']}"


def record_sweep(path: Path, config: str, case: str, cost_model: str) -> dict:
    """One sweep's JSON -> its run entry (median-trial rows of each mode and load)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    env, rows = doc["env"], doc["rows"]
    rates = {str(r["matched_concurrency"]): r["request_rate"] for r in rows
             if r.get("request_rate") and r["mode"] == rows[0]["mode"]}
    measured = [dict(load=load_label(r), mode=r["mode"], **{k: r[k] for k in MEASURED}) for r in rows]
    flags = load_flags(env["command"], env.get("schedules", {}).get("dynamic"), env.get("prefill_k"))
    weight = (env.get("adaptive") or {}).get("ttft_weight")     # None: recorded before it existed (replayed at 0)
    if "--ttft-weight" not in flags and weight is not None:
        flags += ["--ttft-weight", f"{weight:g}"]
    if "--prefill-k" not in flags and env.get("prefill_k") is not None:     # engine.json's cap, no flag
        flags += ["--prefill-k", str(env["prefill_k"])]
    syncs = {r["draft_sync"] for r in rows if r.get("draft_sync") not in (None, "off")}
    if len(syncs) > 1:
        raise DynspecError(f"{path}: its drafting modes ran under different draft syncs {sorted(syncs)}")
    return {"config": config, "case": case, "flags": flags, "draft_sync": syncs.pop() if syncs else "warm",
            "max_batch_size": env["max_batch_size"], "max_seq_len": env["max_seq_len"],
            "max_num_tokens": env.get("max_num_tokens", 8192),     # recorded since; the default before
            "poisson_rates": rates, "command": env["command"], "cost_model": cost_model, "measured": measured,
            **({"policy_prices": prices} if (prices := (env.get("adaptive") or {}).get("step_prices")) else {})}


def commit_of(tree: str) -> str | None:
    """The commit of this checkout whose tree is the one the results ran (a run from a working tree
    records its HEAD and the tree it ran), as its first 7 hex digits whatever git's own abbreviation
    would be in this clone, None where none is."""
    import subprocess

    log = subprocess.run(["git", "log", "--all", "--format=%H %T"], capture_output=True, text=True,
                         cwd=Path(__file__).parent).stdout
    return next((h[:7] for h, t in (line.split() for line in log.splitlines()) if t == tree), None)


def record(results: Sequence[Path], out: Path, prices: str) -> dict:
    """The data set of `results` (suite result folders, in any order) -> OUT/runs.json + cost models."""
    dirs = sorted(((json.loads((Path(d) / "manifest.json").read_text(encoding="utf-8")), Path(d)) for d in results),
                  key=lambda md: md[0]["start"])
    devices = {m["gpus"][0]["name"] for m, _ in dirs}
    commits = {m.get("git_worktree_tree") or m["git_tree"] for m, _ in dirs}
    if len(devices) != 1 or len(commits) != 1:
        raise DynspecError(f"{', '.join(map(str, results))}: one device and one tree only (got {devices}, {commits})")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    runs, installed = [], None
    for m, d in dirs:
        if (d / "profile.json").is_file():
            installed = f"profile_{m['config']}.json"
            shutil.copyfile(d / "profile.json", tmp / installed)
        if installed is None:
            raise DynspecError(f"{d}: its sweep read a cost model no given result installed")
        cases = m.get("cases", {}).get("sweep") or [{"name": "sweep"}]
        for c in cases:
            name = c["name"].removeprefix("sweep_") if c["name"] != "sweep" else "-"
            runs.append(record_sweep(d / f"{c['name']}.json", m["config"], name, installed))
    tree = commits.pop()
    doc = {"device": devices.pop(), "commit": commit_of(tree) or dirs[0][0]["git_commit"][:7] + "+", "tree": tree,
           "source": f"benchmarks/results/{{{','.join(m['config'] for m, _ in dirs)}}}: one suite run per config on one"
                     " GPU; measured tok/s = the median trial of 3",
           "cost_model": runs[0]["cost_model"], "prices": prices, "runs": runs}
    syncs = {r.pop("draft_sync") for r in runs}
    if len(syncs) > 1:
        raise DynspecError(f"{', '.join(map(str, results))}: sweeps under different draft syncs {sorted(syncs)}")
    doc["draft_sync"] = syncs.pop()                 # the replay's (simulate.py); rows without one: warm
    (tmp / "runs.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.sim_record", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__, allow_abbrev=False)
    p.add_argument("results", nargs="+", type=Path, help="suite result folders (benchmarks/results/CONFIG)")
    p.add_argument("--prices", required=True, help="the step prices the replay uses, relative to OUT")
    p.add_argument("--out", required=True, type=Path, help="the data set's folder (benchmarks/sim_data/DEVICE-COMMIT)")
    args = p.parse_args(argv)
    try:
        doc = record(args.results, args.out, args.prices)
    except DynspecError as e:
        print(f"sim_record: {e}", file=sys.stderr)
        return 2
    except (OSError, KeyError, ValueError) as e:
        print(f"sim_record: {', '.join(map(str, args.results))}: not suite results of GPU sweeps"
              f" ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/runs.json: {len(doc['runs'])} runs of {doc['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
