"""A config's concrete commands: each stage's argv (its tool, the flags [engine] sets, its own
flags with references resolved, its output path; under mpirun for ranks > 1) and the commands
that prepare a random pair's engine."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from dynspec.benchmarks.suite_spec import (STAGE_ENV, TOOLS, Config, EngineSpec, Stage, StageSpec, output_names,
                                           resolve_value, stage_names)


def flag_args(args: Sequence[tuple[str, object]]) -> list[str]:
    """(("concurrency", "1,4"), ("floor", True), ("x", False)) -> ["--concurrency", "1,4", "--floor"]."""
    out: list[str] = []
    for k, v in args:
        if v is True:
            out.append(f"--{k}")
        elif v is not False:
            out += [f"--{k}", str(v)]
    return out


def engine_flags(tool: str, engine: EngineSpec, engine_dir: Path | None) -> list[str]:
    """What [engine] puts on every command of `tool`: the engine dir (not for the tiny pair), device,
    dtype, --graphs when the config sets it, and no progress bars (mixed_step has none)."""
    if tool == "tune":                      # reads a profile, no engine
        return []
    if tool == "simulate":                  # replays recorded runs on their cost models, no engine
        return ["--no-progress"]
    out = ["--engine", "reference"] if tool == "sweep" else []
    if engine_dir is not None:
        out += ["--engine-dir", str(engine_dir)]
    out += ["--device", engine.device]
    if engine.dtype:
        out += ["--dtype", engine.dtype]
    if engine.graphs:
        out += ["--graphs", engine.graphs]
    if tool != "mixed_step":
        out.append("--no-progress")
    return out


def out_flags(tool: str, dest: Path) -> list[str]:
    """Where a stage writes: tune the folder DEST (schedule.txt, tune.json), the others DEST."""
    if tool == "tune":
        return ["--out", str(dest / "schedule.txt"), "--report", str(dest / "tune.json")]
    return ["--out", str(dest)]


def mpirun_prefix(ranks: int, env_keys: Sequence[str]) -> list[str]:
    """`mpirun -n R` with every rank given STAGE_ENV and the stage's env (Open MPI; root needs a flag)."""
    exe = Path(sys.executable).parent / "mpirun"
    out = [str(exe) if exe.exists() else "mpirun", "-n", str(ranks), "--bind-to", "none", "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        out.append("--allow-run-as-root")
    for k in list(STAGE_ENV) + list(env_keys):
        out += ["-x", k]
    return out


def stage_commands(cfg: Config, engine_dir: Path | None, results: Path) -> list[Stage]:
    """Every concrete command of a config, in order; a stage of repeat N gives NAME1..NAMEN.
    Outputs: sweep RESULTS/NAME (.json/.md/.png), profile and mixed_step RESULTS/NAME.json, tune
    the folder RESULTS/NAME (schedule.txt, tune.json); a sweep with cases RESULTS/NAME_<case> each
    (cases_command)."""
    out: list[Stage] = []
    outs: dict[str, str] = {}
    for s in cfg.stages:
        if s.cases:
            out.append(cases_command(s, cfg, engine_dir, results, outs))
            outs.update({n: str(results / n) for n in output_names(s)})
            continue
        for name in stage_names(s):
            dest = results / (name if s.tool in ("sweep", "tune", "simulate") else f"{name}.json")
            args = [(k, resolve_value(v, outs, engine_dir)) for k, v in s.args]
            argv = [sys.executable, *TOOLS[s.tool], *engine_flags(s.tool, cfg.engine, engine_dir),
                    *flag_args(args), *out_flags(s.tool, dest)]
            if s.ranks > 1:
                argv = mpirun_prefix(s.ranks, [k for k, _ in s.env]) + argv
            install = None if s.install is None or engine_dir is None else str(Path(engine_dir) / s.install)
            out.append(Stage(name, tuple(argv), str(dest), s.env, (str(dest),) if s.tool == "tune" else (), install))
            outs[name] = str(dest)
    return out


def cases_command(s: StageSpec, cfg: Config, engine_dir: Path | None, results: Path,
                  outs: Mapping[str, str]) -> Stage:
    """A sweep stage with cases: one sweep process, `--cases RESULTS/NAME.cases.json --out
    RESULTS/NAME`, the file holding each case's own flags (references resolved as in stage args):
    case p015 writes RESULTS/NAME_p015.json/.md/.png."""
    from dynspec.benchmarks.sweep_cases import cases_json

    dest, file = results / s.name, results / f"{s.name}.cases.json"
    common = flag_args([(k, resolve_value(v, outs, engine_dir)) for k, v in s.args])
    cases = [(c.name, flag_args([(k, resolve_value(v, outs, engine_dir)) for k, v in c.args])) for c in s.cases]
    argv = [sys.executable, *TOOLS[s.tool], *engine_flags(s.tool, cfg.engine, engine_dir), *common,
            "--cases", str(file), "--out", str(dest)]
    if s.ranks > 1:
        argv = mpirun_prefix(s.ranks, [k for k, _ in s.env]) + argv
    return Stage(s.name, tuple(argv), str(dest), s.env, files=((str(file), cases_json(cases)),))


def prepare_commands(engine: EngineSpec, root: Path) -> list[Stage]:
    """The random pair -> convert target / eagle3 -> build (the reference engine's settings)."""
    py, hf, ck, eng = sys.executable, root / "hf", root / "ckpt", root / "engine"
    dt, tp = engine.dtype or "bfloat16", str(engine.tp)
    pair = [py, "-m", "dynspec.pairs.random_pair", "--out", str(hf), "--preset", engine.preset, "--dtype", dt,
            "--device", engine.device, "--force"] + (["--layers", str(engine.layers)] if engine.layers else [])
    return [
        Stage("random-pair", tuple(pair), str(hf)),
        Stage("convert-target", (py, "-m", "dynspec.cli", "convert", "target", "--hf", str(hf / "target"),
                                 "--out", str(ck / "target"), "--tp", tp, "--dtype", dt, "--force"), str(ck / "target")),
        Stage("convert-draft", (py, "-m", "dynspec.cli", "convert", "eagle3", "--draft", str(hf / "draft"),
                                "--target", str(ck / "target"), "--out", str(ck / "draft"), "--tp", tp, "--force"),
              str(ck / "draft")),
        Stage("build", (py, "-m", "dynspec.cli", "build", "--target", str(ck / "target"), "--draft", str(ck / "draft"),
                        "--out", str(eng), "--tp", tp, "--threshold", "32", "--max-draft-len", "4",
                        "--max-seq-len", str(engine.build_max_seq_len), "--force", "--reference-dtype", dt,
                        "--reference-max-batch-size", str(engine.max_batch_size),
                        "--reference-max-seq-len", str(engine.max_seq_len)), str(eng)),
    ]
