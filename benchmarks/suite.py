"""The benchmark suite: named configs (benchmarks/configs/NAME.toml) -> OUT_ROOT/NAME/.

    python -m dynspec.benchmarks.suite cpu_tiny                       # CPU, the embedded tiny pair
    python -m dynspec.benchmarks.suite cpu_tiny --out-root benchmarks/results   # replace the committed results
    python -m dynspec.benchmarks.suite decode_floor mixed_step      # one H200
    python -m dynspec.benchmarks.suite regime_b                     # reuses the prepared engine
    python -m dynspec.benchmarks.suite regime_a --dry-run             # print every stage's command

A config names an engine ([engine]: the pair, device, dtype, graphs, cache sizes), its stages
([[stages]]: a tool - sweep, profile, mixed_step or tune - with its flags, run `repeat` times, under
`ranks` MPI ranks), the figures computed from them and a budget in seconds. A sweep stage may
carry [[stages.cases]] tables (`name`, `args` over the stage's `args`): it runs as one process on
one engine (benchmarks/sweep_cases.py), case N writing what a stage named STAGE_N would. A flag value may name
an earlier stage's output, `dynamic-schedule = "@{stage:tune_015}/schedule.txt"`, or the prepared
engine's cost model, `profile = "{cost_model}"` (ENGINE_DIR/cost_model.json); a profile stage with
`install = "cost_model.json"` copies its profile.json there (atomically) once it succeeds, so later
configs of the same work dir read it. Per config:

    prepare   once per engine spec and work dir: random pair -> dynspec convert -> dynspec build,
              in WORK/<engine key>/ (reused when its prepared.json matches the spec). WORK is
              --work, by default TMPDIR/dynspec-<uid>/suite (mode 0700, suite_paths); a work dir
              or engine another user owns is refused
    stages    each a subprocess, its output under a temp results dir, its log in logs/STAGE.log;
              the budget is one deadline for all stages (a stage that runs past it is killed and
              the config fails naming that stage)
    report    summary.json / summary.md / summary.png of the config's figures (benchmarks/summary.py)
              and manifest.json (git, GPU, versions, the command, per-stage wall time and rc)

OUT_ROOT is --out-root, by default $XDG_CACHE_HOME/dynspec/results (else ~/.cache/dynspec/results):
a run writes into the checkout's benchmarks/results/ only when --out-root names it. The temp dir
(OUT_ROOT/.NAME.partial) is renamed to OUT_ROOT/NAME only when every stage succeeded; a failed
config leaves OUT_ROOT/NAME as it was, its partial outputs in OUT_ROOT/NAME.incomplete (outside
the checkout, TMPDIR/dynspec-<uid>/incomplete/NAME.incomplete, when OUT_ROOT lies inside it) and nothing
elsewhere (an install is put back), and its one-line error names the failing stage's last error
line. Modules: suite_spec (the config model), suite_config (reading a TOML), suite_commands (the
argv of each stage), suite_stages (running them), suite_provenance, suite_report, summary (figures). What a config may hold (plain names, each tool's own flags spelled in full, outputs inside
the results dir) is benchmarks/suite_checks.py's.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from dynspec.benchmarks.suite_checks import check_inside, restore
from dynspec.benchmarks.suite_commands import flag_args, stage_commands
from dynspec.benchmarks.suite_config import load_config
from dynspec.benchmarks.suite_paths import check_out_root, default_work, incomplete_root
from dynspec.benchmarks.suite_provenance import REPO, _now, provenance
from dynspec.benchmarks.suite_spec import COST_MODEL, Config, StageSpec, figure_stages, output_names
from dynspec.benchmarks.suite_stages import StageFailure, check_engine, missing_cost_model, prepare, run_stages
from dynspec.errors import DynspecError
from dynspec.runtime.generate.session import check_device

def default_out_root() -> Path:
    """Where results go unless --out-root says otherwise: $XDG_CACHE_HOME/dynspec/results, else
    ~/.cache/dynspec/results; never inside the checkout."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "dynspec" / "results"


def inside(path: Path, root: Path) -> bool:
    """Does `path` (resolved) lie in `root` (resolved) or equal it?"""
    p, r = Path(path).resolve(), Path(root).resolve()
    return p == r or r in p.parents


def incomplete_dir(out_root: Path, name: str) -> Path:
    """Where a failed config's partial outputs go: OUT_ROOT/NAME.incomplete, or, when OUT_ROOT lies
    inside the checkout (--out-root benchmarks/results), TMPDIR/dynspec-<uid>/incomplete/NAME.incomplete
    (made and checked: this user's, mode 0700, no link followed), so a failed run leaves the
    checkout as it was and no other user chooses where it goes."""
    if inside(out_root, REPO):
        return incomplete_root() / f"{name}.incomplete"
    return out_root / f"{name}.incomplete"


def staging_dir(out_root: Path, name: str) -> Path:
    """Where a config's stages write before the rename: OUT_ROOT/.NAME.partial."""
    return out_root / f".{name}.partial"


def publish(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`, replacing an older `final` (never a half-written one in its place)."""
    old = final.with_name(final.name + f".old-{os.getpid()}")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def run_config(cfg: Config, work: Path, out_root: Path, command: str, bar_factory=None) -> Path:
    """Prepare, run the stages, report; -> OUT_ROOT/NAME. Raises StageFailure (partial outputs in
    OUT_ROOT/NAME.incomplete) when preparation or a stage fails or the budget runs out."""
    from dynspec.benchmarks.suite_report import write_suite_report
    from dynspec.benchmarks.summary import suite_figures

    tmp = staging_dir(out_root, cfg.name)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise DynspecError(f"--out-root {out_root}: cannot make {tmp}: {e.strerror or e}") from None
    manifest = {"config": cfg.name, "config_file": cfg.source, "description": cfg.description,
                "figures": cfg.figures, "budget_s": cfg.budget_s, "engine": cfg.engine.describe(),
                "command": command, "start": _now(), **provenance()}
    t0 = time.monotonic()
    why, results, installed = None, [], []
    try:
        try:
            prep = prepare(cfg.engine, work, tmp / "logs")
        except StageFailure as e:
            prep, why = e.info, str(e)
        manifest["prepare"] = {k: v for k, v in prep.items()}
        if why is None:
            why = missing_cost_model(cfg, None if prep["engine_dir"] is None else Path(prep["engine_dir"]))
        if why is None:
            stages = stage_commands(cfg, None if prep["engine_dir"] is None else Path(prep["engine_dir"]), tmp)
            for st in stages:
                check_inside([st.out, *st.dirs, *(f for f, _ in st.files), tmp / "logs" / f"{st.name}.log"], tmp,
                             f"{cfg.source or cfg.name} stage {st.name!r}")
            bar = bar_factory(len(stages), cfg.name) if bar_factory else None
            manifest["installs"] = [{"stage": st.name, "from": st.out, "to": st.install} for st in stages if st.install]
            manifest["cases"] = cases_record(cfg.stages)
            try:
                results, why = run_stages(stages, cfg.budget_s, tmp / "logs", bar, installed)
            finally:
                if bar is not None:
                    bar.close()
        manifest["stages"] = [asdict(r) for r in results]
        if why is None:
            figs = suite_figures(cfg.figures, tmp, figure_stages(cfg.stages))
            write_suite_report(cfg, figs, manifest, tmp)
    except Exception as e:   # e.g. a report that cannot be made: a failed config too, its outputs kept
        why = why or f"{type(e).__name__}: {e}"
    manifest.update(end=_now(), wall_s=round(time.monotonic() - t0, 3), complete=why is None, error=why)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if why is not None:
        restore(installed)                    # nothing of a failed config stays outside its .incomplete
        try:
            bad = incomplete_dir(out_root, cfg.name)
        except DynspecError as e:
            raise StageFailure(f"config {cfg.name}: {why}; partial outputs kept in {tmp}, since {e}", manifest) from None
        shutil.rmtree(bad, ignore_errors=True)
        bad.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tmp), str(bad))           # a rename on one file system
        raise StageFailure(f"config {cfg.name}: {why}; partial outputs in {bad}", manifest)
    final = out_root / cfg.name
    publish(tmp, final)
    try:
        shutil.rmtree(incomplete_dir(out_root, cfg.name), ignore_errors=True)     # an older failed run's
    except DynspecError:
        pass                                  # a folder that is not this user's is left alone
    return final


def cases_record(stages: Sequence[StageSpec]) -> dict:
    """The manifest's {stage: [{"name": its output, "args": the case's own flags}]} of every stage with cases."""
    return {s.name: [{"name": n, "args": shlex.join(flag_args(c.args))} for n, c in zip(output_names(s), s.cases)]
            for s in stages if s.cases}


def dry_run(cfg: Config, work: Path, out_root: Path) -> list[str]:
    """The exact commands a real run would execute (the engine dir as prepare would leave it)."""
    prep = prepare(cfg.engine, work, out_root, dry_run=True)
    lines = [f"# {cfg.name}: budget {cfg.budget_s} s, estimate {cfg.estimate_s} s"]
    if prep.get("commands"):
        lines += [f"# prepare ({cfg.engine.key()})"] + prep["commands"]
    elif cfg.engine.pair != "tiny":
        lines.append(f"# prepare: reusing {prep['engine_dir']}")
    eng = None if prep["engine_dir"] is None else Path(prep["engine_dir"])
    missing = missing_cost_model(cfg, eng)
    if missing and not prep.get("commands"):
        lines.append(f"# refused as it is: {missing}")
    elif missing:
        lines.append(f"# needs {eng / COST_MODEL} (from the cost_model config) before its stages")
    for st in stage_commands(cfg, eng, staging_dir(out_root, cfg.name)):
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in st.env)
        lines += [f"# {path}: {text.strip()}" for path, text in st.files]
        lines.append((f"env {env} " if env else "") + shlex.join(st.argv))
        if st.install:
            lines.append(f"# install {st.out} -> {st.install}")
    return lines


def prepare_only(cfgs: Sequence[Config], work: Path) -> int:
    """Prepare each config's engine (a spec prepared already is reused); logs under WORK/<key>/logs."""
    for cfg in cfgs:
        if cfg.engine.pair == "tiny":
            continue
        try:
            info = prepare(cfg.engine, work, work / cfg.engine.key() / "logs")
        except DynspecError as e:
            print(f"dynspec suite: error: {e}", file=sys.stderr)
            return 1
        print(f"{cfg.name}: engine {'reused' if info['reused'] else 'prepared'} at {info['engine_dir']}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.suite", description=__doc__.splitlines()[0],
                                allow_abbrev=False)
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="config names (benchmarks/configs/NAME.toml) or .toml paths")
    p.add_argument("--work", default=str(default_work()),
                   help="where prepared engines live, reused across runs; one another user owns is refused"
                        " (default: %(default)s, this user's, mode 0700)")
    p.add_argument("--out-root", default=None, metavar="DIR",
                   help="results go to DIR/CONFIG (default: $XDG_CACHE_HOME/dynspec/results, else"
                        " ~/.cache/dynspec/results; --out-root benchmarks/results replaces the results the"
                        " checkout carries)")
    p.add_argument("--dry-run", action="store_true", help="print every stage's command; run nothing")
    p.add_argument("--prepare-only", action="store_true",
                   help="prepare the configs' engines in --work and stop (a cold machine, before a long config)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    try:
        cfgs = [load_config(c) for c in args.configs]
    except DynspecError as e:
        print(f"dynspec suite: error: {e}", file=sys.stderr)
        return 2
    work = Path(args.work)
    out_root = default_out_root() if args.out_root is None else Path(args.out_root)
    try:                                  # another user's engine, a file as --out-root: one line, nothing run
        check_out_root(out_root)
        for cfg in cfgs:
            check_engine(cfg.engine, work)
        if args.dry_run:
            print("\n".join(line for cfg in cfgs for line in dry_run(cfg, work, out_root)))
            return 0
        for cfg in cfgs:                  # a GPU config on a machine without one: one line, nothing prepared
            check_device(cfg.engine.device, f"config {cfg.name}: engine device")
    except DynspecError as e:
        print(f"dynspec suite: error: {e}", file=sys.stderr)
        return 2
    if args.prepare_only:
        return prepare_only(cfgs, work)
    bars = None
    if not args.no_progress:
        from tqdm import tqdm

        bars = lambda n, name: tqdm(total=n, unit="stage", desc=name, file=sys.stderr)   # noqa: E731
    command = "python -m dynspec.benchmarks.suite " + shlex.join(argv)
    code = 0
    for cfg in cfgs:
        try:
            final = run_config(cfg, work, out_root, command, bars)
            print(f"{cfg.name}: wrote {final}")
        except DynspecError as e:
            print(f"dynspec suite: error: {e}", file=sys.stderr)
            code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
