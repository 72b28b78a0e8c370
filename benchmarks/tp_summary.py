"""TP=2 against TP=1 on two GPUs: decode step, floors, crossover and replica scaling, from tp_decode, tune and sweep JSON.

    python -m dynspec.benchmarks.tp_summary --decode tp1=tp1_decode.json --decode tp2=tp2_decode.json \\
        --tune tp1=a_tp1_tune.json --scaling-one scaling_1gpu.json --scaling-two scaling_2rep.json \\
        --out tp_summary.json

    tp2_vs_tp1_decode       TP=2 decode / TP=1 decode at b=1, 1024 context (benchmarks/tp_decode.py),
                            with the all-reduce TP=2 serves with ('auto': one-shot where it runs);
                            per mode under tp2_vs_tp1_decode_by_mode
    tp2_vs_floor            TP=2 decode / TP=2's GEMMs alone (one rank's shard, no collectives)
    tp_comm_fraction        1 - step without collectives / step, per all-reduce mode
    crossover_concurrency   {"tp1": b, "tp2": b}: the first batch size whose tuned K is 0 (regime A's
                            tune report); null where speculation still paid at the largest profiled
                            batch (see crossover_note) or where no tune report was given
    replica_scaling         {mode: tok/s of `mpirun -n 2` TP=1 replicas / (2 x one GPU's)}, medians of
                            the trials; replica_scaling_spread gives min..max over trial pairs
    replica_step_scaling    {mode: one GPU's mean step ms / the replicas' mean step ms}. Not a
                            controlled figure: the runs' mean batch sizes differ (each replica
                            serves its own shard of a seeded draw, the one-GPU run another draw),
                            and smaller batches step faster. A trial lasts as long as its slower
                            replica, so with few requests tok/s scaling also carries the shards'
                            different tails
    replica_scaling_steady  {mode: the replicas' summed steady_tok_per_s / (2 x one GPU's)}: tokens
                            per second over the iterations with >= 0.9 C decode rows, so neither the
                            shards' tails nor their ramp-up enter; the controlled figure
"""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import Mapping

from dynspec.errors import DynspecError


def decode_figures(tp1: Mapping, tp2: Mapping, serve_mode: str = "one-shot") -> dict:
    """{"tp2_vs_tp1_decode": .., "tp2_vs_tp1_decode_by_mode": {mode: r}, "tp2_vs_floor": ..,
    "tp_comm_fraction": ..} from two tp_decode.py documents. serve_mode falls back to nccl when
    the one-shot kernel did not run. 6.14 ms at TP=1, 4.93 ms at TP=2 -> 0.80."""
    if tp1.get("tp") != 1 or tp2.get("tp") != 2:
        raise DynspecError(f"--decode: expected a tp=1 and a tp=2 document, got tp={tp1.get('tp')} and "
                           f"tp={tp2.get('tp')}")
    base = next(iter(tp1["decode_ms"].values()))
    by_mode = {m: d / base for m, d in tp2["decode_ms"].items() if m != "skip"}
    mode = serve_mode if serve_mode in by_mode else "nccl"
    return {
        "tp2_vs_tp1_decode": by_mode.get(mode), "tp2_all_reduce": mode,
        "tp2_vs_tp1_decode_by_mode": by_mode,
        "tp1_decode_ms": base, "tp2_decode_ms": tp2["decode_ms"],
        "tp1_gemm_floor_ms": tp1.get("gemm_floor_ms"), "tp2_gemm_floor_ms": tp2.get("gemm_floor_ms"),
        "tp2_gemm_floor_allreduce_ms": tp2.get("gemm_floor_allreduce_ms"),
        "tp2_vs_floor": tp2["decode_ms"][mode] / tp2["gemm_floor_ms"],
        "tp1_vs_floor": base / tp1["gemm_floor_ms"],
        "tp_comm_fraction": (tp2.get("comm_fraction") or {}).get(mode),
        "tp_comm_fraction_by_mode": tp2.get("comm_fraction"),
    }


def crossover(tune: Mapping) -> tuple[int | None, str]:
    """(first profiled batch size whose best K is 0, note). rows: tune --report's."""
    rows = sorted((r for r in tune.get("rows", ()) if r.get("profiled")), key=lambda r: r["batch_size"])
    if not rows:
        raise DynspecError("tune report has no profiled rows")
    for r in rows:
        if r["best_k"] == 0:
            return int(r["batch_size"]), f"K=0 from b={r['batch_size']} (schedule {tune.get('schedule')})"
    last = rows[-1]
    return None, (f"none up to b={last['batch_size']}: K={last['best_k']} still gains "
                  f"{last['gain']:.2f}x there (schedule {tune.get('schedule')})")


def replica_scaling(one: Mapping, two: Mapping) -> tuple[dict, dict, dict, dict]:
    """({mode: two / (2 x one)}, {mode: [min, max]}, {mode: one's mean step ms / two's},
    {mode: two's steady_tok_per_s / (2 x one's)}) over the modes and loads both sweeps ran; the
    last leaves out modes whose rows lack steady_tok_per_s."""
    if two["env"].get("replicas") != 2:
        raise DynspecError(f"--scaling-two: expected 2 replicas, got {two['env'].get('replicas')}")
    eff, spread, step, steady = {}, {}, {}, {}
    base = {(r["mode"], r.get("concurrency"), r.get("request_rate")): r for r in one["rows"]}
    for r in two["rows"]:
        o = base.get((r["mode"], r.get("concurrency"), r.get("request_rate")))
        if o is None:
            continue
        if r["mode"] in eff:
            raise DynspecError(f"--scaling-two has mode {r['mode']} at more than one load; replica_scaling "
                               f"is one figure per mode: give sweeps of one load point")
        eff[r["mode"]] = r["output_tok_per_s"] / (2 * o["output_tok_per_s"])
        lo, hi = min(r["trial_tok_per_s"]) / (2 * max(o["trial_tok_per_s"])), \
            max(r["trial_tok_per_s"]) / (2 * min(o["trial_tok_per_s"]))
        spread[r["mode"]] = [lo, hi]
        if r.get("mean_step_ms") and o.get("mean_step_ms"):
            step[r["mode"]] = o["mean_step_ms"] / r["mean_step_ms"]
        if r.get("steady_tok_per_s") and o.get("steady_tok_per_s"):
            steady[r["mode"]] = r["steady_tok_per_s"] / (2 * o["steady_tok_per_s"])
    if not eff:
        raise DynspecError("--scaling-one / --scaling-two share no (mode, concurrency)")
    return eff, spread, step, steady


def _named(items, flag: str) -> dict[str, str]:
    """summary's NAME=PATH reader, with the names tp1 and tp2 only."""
    from dynspec.benchmarks.figures_common import _named as named

    out = named(items, flag)
    for name, path in out.items():
        if name not in ("tp1", "tp2"):
            raise DynspecError(f"{flag} {name}={path} is not tp1=PATH or tp2=PATH")
    return out


def run(args) -> int:
    import json

    from dynspec.artifacts import read_json, write_json

    dec = {n: read_json(p, f"tp_decode {n}") for n, p in _named(args.decode, "--decode").items()}
    tunes = {n: read_json(p, f"tune report {n}") for n, p in _named(args.tune, "--tune").items()}
    if set(dec) != {"tp1", "tp2"}:
        raise DynspecError("--decode needs tp1=PATH and tp2=PATH")
    doc = {"version": 1, **decode_figures(dec["tp1"], dec["tp2"])}
    cross, notes = {}, {}
    for n in ("tp1", "tp2"):
        if n in tunes:
            cross[n], notes[n] = crossover(tunes[n])
        else:
            cross[n], notes[n] = None, "not measured (no tune report)"
    doc.update(crossover_concurrency=cross, crossover_note=notes)
    commands = [{"what": f"decode {n}", "command": d.get("command")} for n, d in dec.items()]
    commands += [{"what": f"tune {n}", "command": t.get("command")} for n, t in tunes.items()]
    if args.scaling_one and args.scaling_two:
        one, two = read_json(args.scaling_one, "one-GPU sweep"), read_json(args.scaling_two, "two-replica sweep")
        (doc["replica_scaling"], doc["replica_scaling_spread"], doc["replica_step_scaling"],
         doc["replica_scaling_steady"]) = replica_scaling(one, two)
        commands += [{"what": "scaling, one GPU", "command": one["env"].get("command")},
                     {"what": "scaling, mpirun -n 2 replicas", "command": two["env"].get("command")}]
    else:
        doc["replica_scaling"] = None
    commands.append({"what": "summary", "command": "python -m dynspec.benchmarks.tp_summary " + shlex.join(
        sys.argv[1:] if args.argv is None else args.argv)})
    doc["commands"] = commands
    write_json(args.out, doc)
    print(json.dumps({k: doc[k] for k in ("tp2_vs_tp1_decode", "tp2_vs_floor", "tp_comm_fraction",
                                          "crossover_concurrency", "replica_scaling")}, indent=1))
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.tp_summary", description=__doc__.splitlines()[0],
                                allow_abbrev=False)
    p.add_argument("--decode", action="append", required=True, metavar="tpN=TP_DECODE.json")
    p.add_argument("--tune", action="append", metavar="tpN=TUNE.json", help="regime A's `dynspec tune --report`")
    p.add_argument("--scaling-one", metavar="SWEEP.json", help="the sweep on one GPU")
    p.add_argument("--scaling-two", metavar="SWEEP.json", help="the same sweep under mpirun -n 2 (TP=1 replicas)")
    p.add_argument("--out", required=True, help="the figures, JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    p = make_parser()
    args = p.parse_args(argv)
    args.argv = argv
    try:
        return run(args)
    except DynspecError as e:
        print(f"dynspec tp_summary: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
