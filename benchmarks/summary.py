"""Headline figures from sweep results (and the profile measured with them). Pure + a thin CLI.

    python -m dynspec.benchmarks.summary --regime A=results/h200_A.json --regime B=results/h200_B.json \\
        --profile A=results/h200_A_profile.json --peak-bandwidth-tbps 4.8 --out results/h200_summary.json

Figures (per regime where it applies):
    crossover_concurrency        smallest C at which baseline out-runs static (null: never in the sweep)
    dynamic_ratio_by_concurrency dynamic / max(baseline, static) at each C
    max_dynamic_gain             the largest of those ratios, with its regime and C
    c1_speedup                   dynamic / baseline at C = 1 (first regime)
    decode_bandwidth_fraction    target weight bytes / plain decode step at b = 1 / peak bandwidth
    host_overhead_fraction       (policy + planning) / engine step time of dynamic at C = 1
"""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import Mapping, Sequence

from dynspec.errors import DynspecError


def _tps(rows: Sequence[Mapping], mode: str) -> dict[int, float]:
    return {int(r["concurrency"]): float(r["output_tok_per_s"]) for r in rows
            if r["mode"] == mode and r.get("concurrency") is not None}


def crossover_concurrency(rows: Sequence[Mapping]) -> int | None:
    """Smallest C where baseline's throughput is above static's; None if it never is."""
    base, stat = _tps(rows, "baseline"), _tps(rows, "static")
    for c in sorted(set(base) & set(stat)):
        if base[c] > stat[c]:
            return c
    return None


def dynamic_ratio_by_concurrency(rows: Sequence[Mapping]) -> dict[str, float]:
    """{"<C>": dynamic / max(baseline, static)} over the C's where dynamic and another mode ran."""
    dyn, base, stat = _tps(rows, "dynamic"), _tps(rows, "baseline"), _tps(rows, "static")
    out = {}
    for c in sorted(dyn):
        others = [x[c] for x in (base, stat) if c in x]
        if others and max(others) > 0:
            out[str(c)] = dyn[c] / max(others)
    return out


def c1_speedup(rows: Sequence[Mapping]) -> float | None:
    dyn, base = _tps(rows, "dynamic"), _tps(rows, "baseline")
    return dyn[1] / base[1] if 1 in dyn and 1 in base and base[1] > 0 else None


def host_overhead_fraction(rows: Sequence[Mapping], mode: str = "dynamic", concurrency: int = 1) -> float | None:
    for r in rows:
        if r["mode"] == mode and r.get("concurrency") == concurrency:
            return r.get("host_overhead_fraction")
    return None


def decode_bandwidth_fraction(profile: Mapping, peak_bytes_per_s: float, batch_size: int = 1) -> dict | None:
    """Weight streaming of the plain decode step at `batch_size` as a fraction of peak."""
    wb = profile.get("target_weight_bytes")
    dec = (profile.get("decode_ms") or {}).get(str(batch_size))
    if dec is None:
        dec = (profile.get("iteration_ms", {}).get(str(batch_size)) or {}).get("0")
    if not wb or not dec:
        return None
    bps = wb / (dec / 1e3)
    return {"fraction": bps / peak_bytes_per_s, "decode_ms": dec, "weight_bytes": wb,
            "achieved_tb_per_s": bps / 1e12, "peak_tb_per_s": peak_bytes_per_s / 1e12,
            "context_len": profile.get("context_len")}


def summarize(regimes: Mapping[str, Mapping], profiles: Mapping[str, Mapping] | None = None,
              peak_bytes_per_s: float | None = None, bandwidth_profile: str | None = None,
              tunes: Mapping[str, Mapping] | None = None) -> dict:
    """regimes: {"A": sweep NAME.json doc}; profiles: {"A": profile.json doc}; tunes: {"A": tune.json doc}.
    The bandwidth figure comes from profiles[bandwidth_profile] (default: the first regime's, else the first)."""
    if not regimes:
        raise DynspecError("no regimes to summarize")
    profiles = profiles or {}
    first = next(iter(regimes))
    ratios = {name: dynamic_ratio_by_concurrency(doc["rows"]) for name, doc in regimes.items()}
    best = max(((r, name, c) for name, rs in ratios.items() for c, r in rs.items()), default=None)
    bw = None
    if peak_bytes_per_s and profiles:
        pname = bandwidth_profile or (first if first in profiles else next(iter(profiles)))
        if pname not in profiles:
            raise DynspecError(f"bandwidth profile {pname!r} is not one of the profiles {sorted(profiles)}")
        bw = decode_bandwidth_fraction(profiles[pname], peak_bytes_per_s)
        if bw is not None:
            bw["profile"] = pname
    commands = []
    for name, doc in profiles.items():
        if doc.get("command"):
            commands.append({"what": f"profile {name}", "command": doc["command"]})
    for name, doc in (tunes or {}).items():
        commands.append({"what": f"tune {name}", "command": doc.get("command"), "schedule": doc.get("schedule")})
    for name, doc in regimes.items():
        commands.append({"what": f"sweep {name}", "command": doc["env"].get("command")})
    return {
        "decode_bandwidth_fraction": None if bw is None else bw["fraction"],
        "decode_bandwidth": bw,
        "dynamic_ratio_by_concurrency": ratios,
        "min_dynamic_ratio": {name: (min(rs.values()) if rs else None) for name, rs in ratios.items()},
        "crossover_concurrency": {name: crossover_concurrency(doc["rows"]) for name, doc in regimes.items()},
        "max_dynamic_gain": None if best is None else best[0],
        "max_dynamic_gain_at": None if best is None else {"regime": best[1], "concurrency": int(best[2])},
        "c1_speedup": c1_speedup(regimes[first]["rows"]),
        "c1_speedup_regime": first,
        "host_overhead_fraction": host_overhead_fraction(regimes[first]["rows"]),
        "acceptance_model": {name: doc["env"].get("acceptance_model") for name, doc in regimes.items()},
        "schedules": {name: doc["env"].get("schedules") for name, doc in regimes.items()},
        "commands": commands,
    }


def _named(items: Sequence[str], flag: str) -> dict[str, str]:
    out = {}
    for it in items or ():
        name, sep, path = it.partition("=")
        if not sep or not name or not path:
            raise DynspecError(f"{flag} {it!r} is not NAME=PATH (e.g. A=results/h200_A.json)")
        out[name] = path
    return out


def make_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="python -m dynspec.benchmarks.summary", description=__doc__.splitlines()[0])
    p.add_argument("--regime", action="append", required=True, metavar="NAME=SWEEP.json")
    p.add_argument("--profile", action="append", metavar="NAME=PROFILE.json")
    p.add_argument("--tune", action="append", metavar="NAME=TUNE.json", help="`dynspec tune --report` output")
    p.add_argument("--bandwidth-profile", metavar="NAME", help="which --profile gives decode_bandwidth_fraction")
    p.add_argument("--peak-bandwidth-tbps", type=float, help="device memory bandwidth, e.g. 4.8 for an H200")
    p.add_argument("--out", required=True, help="summary JSON path")
    return p


def run(args: argparse.Namespace) -> int:
    from dynspec.artifacts import read_json, write_json

    regimes = {n: read_json(p, f"sweep result {n}") for n, p in _named(args.regime, "--regime").items()}
    for n, doc in regimes.items():
        if "rows" not in doc or "env" not in doc:
            raise DynspecError(f"sweep result {n}: missing 'env' or 'rows'")
    profiles = {n: read_json(p, f"profile {n}") for n, p in _named(args.profile, "--profile").items()}
    tunes = {n: read_json(p, f"tune report {n}") for n, p in _named(args.tune, "--tune").items()}
    peak = args.peak_bandwidth_tbps * 1e12 if args.peak_bandwidth_tbps else None
    doc = summarize(regimes, profiles, peak, args.bandwidth_profile, tunes)
    cmd = getattr(args, "command_line", None) or "python -m dynspec.benchmarks.summary " + shlex.join(sys.argv[1:])
    doc["commands"].append({"what": "summary", "command": cmd})
    write_json(args.out, doc)
    import json

    print(json.dumps({k: doc[k] for k in ("decode_bandwidth_fraction", "crossover_concurrency", "max_dynamic_gain",
                                          "c1_speedup", "host_overhead_fraction", "min_dynamic_ratio")}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return run(args)
    except DynspecError as e:
        print(f"dynspec summary: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
