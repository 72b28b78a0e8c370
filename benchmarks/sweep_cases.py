"""Several sweeps on one engine: `python -m dynspec.benchmarks.sweep FLAGS --cases FILE --out DIR/NAME`.

FILE (benchmarks/suite.py writes it for a sweep stage with [[stages.cases]] tables):

    {"cases": [{"name": "p015", "args": ["--acceptance", "bernoulli:0.15", "--concurrency", "1,16,64,256"]},
               {"name": "p090", "args": ["--acceptance", "bernoulli:0.9", "--modes", "baseline,static:5"]}]}

Case p015 is the plain sweep `FLAGS --acceptance bernoulli:0.15 --concurrency 1,16,64,256 --out
DIR/NAME_p015` (a later flag wins), parsed and checked as that sweep would be. The flags that select
or size the engine (SHARED_FLAGS) are the same in every case. The engine is opened once, sized for
the largest case (max batch size: the largest --concurrency of any case; max K and cache length:
the largest any case needs), with every case's reachable CUDA graphs captured; the cases then run
in order on it, each writing DIR/NAME_<case>.json, .md and .png when it finishes.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dynspec.errors import DynspecError

# the flags that select the engine, size its cache or set up the process (attribute names): one
# value for every case. Batch size and K are sized from the cases (engine_sizes).
SHARED_FLAGS = ("engine", "engine_dir", "target", "draft", "device", "dtype", "graphs", "threads", "tp",
                "allreduce", "max_seq_len", "trtllm_options")
CASE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Case:
    """One entry of FILE: its name and its own flags (after the common ones)."""
    name: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class CaseRun:
    """What one sweep of the process runs: name None for a plain sweep (no --cases); args the
    parsed flags, argv the plain sweep's flags that ask for the same (the env block's command)."""
    name: str | None
    args: argparse.Namespace
    argv: tuple[str, ...]


def read_cases(path: str) -> tuple[Case, ...]:
    """FILE -> its cases, in order; one line naming FILE and the entry for anything malformed."""
    from dynspec.artifacts import read_json

    doc = read_json(path, "--cases file")
    cases = doc.get("cases")
    if not isinstance(cases, list) or not cases:
        raise DynspecError(f"--cases {path}: field 'cases' must be a non-empty list of {{\"name\", \"args\"}}")
    out: list[Case] = []
    for i, c in enumerate(cases):
        at = f"--cases {path}: cases[{i}]"
        if not isinstance(c, dict) or set(c) != {"name", "args"}:
            raise DynspecError(f"{at} must be an object with exactly the fields 'name' and 'args'")
        name, argv = c["name"], c["args"]
        if not isinstance(name, str) or not CASE_NAME.fullmatch(name):
            raise DynspecError(f"{at}: name {name!r} is not an identifier (letters, digits, _; e.g. p015)")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise DynspecError(f"{at} ({name}): args must be a list of strings (flags)")
        if name in [x.name for x in out]:
            raise DynspecError(f"{at}: case name {name!r} repeats")
        out.append(Case(name, tuple(argv)))
    return tuple(out)


def case_out(out: str, name: str) -> str:
    """--out res/sweep (or res/sweep.json), case p015 -> res/sweep_p015 (so res/sweep_p015.json, .md, .png)."""
    p = Path(out)
    if p.suffix in (".json", ".md", ".png"):              # as report.out_paths reads --out
        p = p.with_suffix("")
    return str(p.with_name(f"{p.name}_{name}"))


def common_flags(argv: Sequence[str]) -> list[str]:
    """argv less its --cases FILE and --out NAME (each case has its own out):
    ['--trials', '3', '--cases', 'c.json', '--out=r/s'] -> ['--trials', '3']."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--cases", "--out"):
            skip = True
        elif not a.startswith(("--cases=", "--out=")):
            out.append(a)
    return out


class _CaseParser(argparse.ArgumentParser):
    """The sweep's parser for a case's flags: a refusal is a DynspecError, not an exit."""

    def error(self, message: str):
        raise DynspecError(message)


def parse_case(argv: Sequence[str], case: Case, out: str) -> CaseRun:
    """The case's flags = the common argv + its own + --out DIR/NAME_<case>, by the sweep's parser."""
    from dynspec.benchmarks.sweep_args import make_parser

    full = [*common_flags(argv), *case.argv, "--out", case_out(out, case.name)]
    try:
        ns = make_parser(_CaseParser(prog="python -m dynspec.benchmarks.sweep", allow_abbrev=False)).parse_args(full)
    except DynspecError as e:
        raise DynspecError(f"case {case.name!r} ({shlex.join(case.argv)}): {e}") from None
    ns.cases = None
    return CaseRun(case.name, ns, tuple(full))


def case_runs(args: argparse.Namespace, argv: Sequence[str]) -> tuple[CaseRun, ...]:
    """--cases FILE -> one CaseRun per case, each checked as its plain sweep (sweep_plan.check_flags) and
    SHARED_FLAGS equal across them; no --cases -> the one plain sweep of args."""
    from dynspec.benchmarks.sweep_plan import check_flags

    if not args.cases:
        check_flags(args)
        return (CaseRun(None, args, tuple(argv)),)
    if args.engine != "reference":
        raise DynspecError(f"--cases {args.cases}: cases share one reference engine; --engine {args.engine} runs alone")
    runs = tuple(parse_case(argv, c, args.out) for c in read_cases(args.cases))
    for r in runs:
        try:
            check_flags(r.args)
        except DynspecError as e:
            raise DynspecError(f"case {r.name!r}: {e}") from None
    check_shared(runs)
    return runs


def check_shared(runs: Sequence[CaseRun]) -> None:
    """Every SHARED_FLAGS value is the first case's: case 'p090' with --max-seq-len 512 where
    'p015' has 424 -> "case 'p090': --max-seq-len 512 differs from case 'p015''s 424 ..."."""
    first = runs[0]
    for r in runs[1:]:
        for attr in SHARED_FLAGS:
            mine, theirs = getattr(r.args, attr, None), getattr(first.args, attr, None)
            if mine != theirs:
                flag = "--" + attr.replace("_", "-")
                raise DynspecError(f"case {r.name!r}: {flag} {mine!r} differs from case {first.name!r}'s {theirs!r};"
                                   f" the cases share one engine, so {flag} must be the same in every case")


def engine_sizes(specs: Sequence) -> dict:
    """The one engine's sizes for every SweepSpec: the largest max batch size, cache length and K
    of any: (64, 424, 5) and (256, 424, 3) -> max_batch_size 256, max_seq_len 424, max_draft_len 5."""
    return {"max_batch_size": max(s.max_batch_size for s in specs),
            "max_seq_len": max(s.max_seq_len for s in specs),
            "max_draft_len": max(s.max_draft_len for s in specs)}


def graph_keys(specs: Sequence, max_batch_size: int, max_num_tokens: int | None) -> tuple:
    """The CUDA graphs every spec's modes reach on an engine of max_batch_size, in capture order:
    per spec, its schedules' and policies' reachable graphs (reachable_graphs) in the engine's
    batch buckets, up to the bucket of the spec's own largest batch; the union over specs.
    Engine 256 (buckets 1, 2, 4, ..., 256), a spec of C <= 64: its graphs of buckets 1..64."""
    from dynspec.runtime.engines.reference.engine import capture_order, reachable_graphs
    from dynspec.runtime.serving.plan import batch_buckets, bucket_for

    buckets = batch_buckets(max_batch_size)
    keys: set = set()
    for spec in specs:
        top = bucket_for(spec.max_batch_size, buckets)
        schedules, sync = dict(spec.schedules), dict(spec.draft_sync)
        for m in spec.modes:
            keys |= {g for g in reachable_graphs([schedules[m]], max_batch_size, sync[m], max_num_tokens)
                     if g.bucket <= top}
    return capture_order(keys)


def shared_engine_block(runs: Sequence[CaseRun], index: int, sizes: dict, graphs: int, launch: str,
                        open_s: float | None) -> dict | None:
    """The env block's record of the engine the cases shared (None for a plain sweep): the case
    names in order, this case's, the engine's sizes, the CUDA graph keys it captured for all of
    them (on CUDA), the seconds opening and capturing took, the command that launched the process."""
    if runs[0].name is None:
        return None
    return {"cases": [r.name for r in runs], "case": runs[index].name, **sizes, "graph_keys": graphs,
            "open_s": None if open_s is None else round(open_s, 3), "launch_command": launch}


def cases_json(cases: Sequence[tuple[str, Sequence[str]]]) -> str:
    """[("p015", ["--acceptance", "bernoulli:0.15"])] -> FILE's text, as read_cases reads it."""
    return json.dumps({"cases": [{"name": n, "args": list(a)} for n, a in cases]}) + "\n"
