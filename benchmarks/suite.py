"""The benchmark suite: named configs (benchmarks/configs/NAME.toml) -> benchmarks/results/NAME/.

    python -m dynspec.benchmarks.suite cpu_tiny                       # CPU, the embedded tiny pair
    python -m dynspec.benchmarks.suite decode_floor mixed_step --work /tmp/dynspec_suite   # one H200
    python -m dynspec.benchmarks.suite regime_b --work /tmp/dynspec_suite   # reuses the prepared engine
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
              in WORK/<engine key>/ (reused when its prepared.json matches the spec)
    stages    each a subprocess, its output under a temp results dir, its log in logs/STAGE.log;
              the budget is one deadline for all stages (a stage that runs past it is killed and
              the config fails naming that stage)
    report    summary.json / summary.md / summary.png of the config's figures (benchmarks/summary.py)
              and manifest.json (git, GPU, versions, the command, per-stage wall time and rc)

The temp dir is renamed to OUT_ROOT/NAME only when every stage succeeded; a failed config
leaves OUT_ROOT/NAME as it was, its partial outputs in OUT_ROOT/NAME.incomplete and nothing
elsewhere (an install is put back), and its one-line error names the failing stage's last error
line. What a config may hold (plain names, each tool's own flags spelled in full, outputs inside
the results dir) is benchmarks/suite_checks.py's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import re
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

from dynspec.benchmarks.suite_checks import (check_inside, check_name, check_tool_args, last_error_line, restore,
                                             saved)
from dynspec.errors import DynspecError

HERE = Path(__file__).resolve().parent
CONFIG_DIR = HERE / "configs"
REPO = HERE.parent
TOOLS = {"sweep": ["-m", "dynspec.benchmarks.sweep"], "profile": ["-m", "dynspec.cli", "profile"],
         "mixed_step": ["-m", "dynspec.benchmarks.mixed_step"], "tune": ["-m", "dynspec.cli", "tune"]}
# the stages each kind of figures reads (benchmarks/summary.py suite_figures); "adaptive" reads
# every stage named sweep or sweep_*, at least one
FIGURE_STAGES = {"sweep": ("sweep",), "decode_floor": ("floor",), "mixed_step": ("mixed",),
                 "varied_vs_fixed": ("varied", "fixed"), "tp": ("tp1", "tp2"), "adaptive": (),
                 "cost_model": ("profile",), "overlap": ("sweep_varied", "sweep_fixed", "sweep_regime_b", "floor")}
FIGURES = tuple(FIGURE_STAGES)
# what a profile stage may install into the prepared engine dir (`install = "cost_model.json"`)
INSTALLABLE = ("cost_model.json",)
COST_MODEL = "cost_model.json"
# an arg value may name another stage's output or the engine's cost model:
#   "@{stage:tune_015}/schedule.txt"   -> "@RESULTS/tune_015/schedule.txt" (an earlier stage's out)
#   "{cost_model}"                     -> "ENGINE_DIR/cost_model.json"
REFERENCE = re.compile(r"\{([^{}]*)\}")
GRAPHS = ("full", "eager")
# every stage's environment (and mpirun -x): NVLink multicast stays off, output unbuffered
STAGE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
             "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class EngineSpec:
    """pair "tiny": the embedded trained pair (nothing to prepare); "random": dynspec.pairs.random_pair
    of `preset`, converted and built for `tp` ranks with the reference settings below."""
    pair: str = "random"
    preset: str = "llama-3.1-8b"
    layers: int | None = None
    device: str = "cuda"
    dtype: str | None = None            # None: the engine's own (no --dtype flag)
    graphs: str | None = None           # "full" | "eager"; None: the engine's default (no flag)
    tp: int = 8
    max_seq_len: int = 1480             # the reference engine's cache length (build --reference-max-seq-len)
    max_batch_size: int = 256
    build_max_seq_len: int = 2048
    prepare_budget_s: int = 300

    def key(self) -> str:
        """'random-llama-3.1-8b-tp8-bfloat16-<8 hex of the spec>': one folder of WORK per spec."""
        digest = hashlib.sha256(json.dumps(self.prepared(), sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.pair}-{self.preset}-tp{self.tp}-{self.dtype}-{digest}"

    def describe(self) -> dict:
        """The manifest's record: the tiny pair has no preset, TP or cache sizes to prepare."""
        d = asdict(self)
        return {k: d[k] for k in ("pair", "device", "dtype", "graphs")} if self.pair == "tiny" else d

    def prepared(self) -> dict:
        """The fields that decide what prepare writes (graphs and the budget do not)."""
        d = asdict(self)
        for k in ("graphs", "prepare_budget_s"):
            d.pop(k)
        return d


@dataclass(frozen=True)
class CaseSpec:
    """One [[stages.cases]] table of a sweep stage: its flags are the stage's args updated by `args`."""
    name: str
    args: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class StageSpec:
    name: str
    tool: str
    args: tuple[tuple[str, object], ...] = ()
    repeat: int = 1
    ranks: int = 1
    env: tuple[tuple[str, str], ...] = ()
    install: str | None = None      # a profile stage's output copied to ENGINE_DIR/<install>
    cases: tuple[CaseSpec, ...] = ()   # a sweep stage's cases: one process, outputs NAME_<case>


@dataclass(frozen=True)
class Config:
    name: str
    description: str
    figures: str
    budget_s: int
    engine: EngineSpec
    stages: tuple[StageSpec, ...]
    estimate_s: int = 0
    source: str = ""


@dataclass(frozen=True)
class Stage:
    """One concrete command: `argv` run in `env`, writing `out` (a path inside the results dir;
    a folder for tune), after making the folders `dirs` and writing `files` ((path, text): a
    sweep's cases file); on success `out` is copied to `install`."""
    name: str
    argv: tuple[str, ...]
    out: str
    env: tuple[tuple[str, str], ...] = ()
    dirs: tuple[str, ...] = ()
    install: str | None = None
    files: tuple[tuple[str, str], ...] = ()


# ---- configs -----------------------------------------------------------------------------
def config_path(name: str) -> Path:
    """'regime_b' -> benchmarks/configs/regime_b.toml; a path to a .toml is taken as it is."""
    p = Path(name)
    if p.suffix == ".toml":
        if not p.is_file():
            raise DynspecError(f"config file {p} does not exist")
        return p
    q = CONFIG_DIR / f"{name}.toml"
    if not q.is_file():
        known = ", ".join(sorted(x.stem for x in CONFIG_DIR.glob("*.toml")))
        raise DynspecError(f"no config {name!r} (known: {known})")
    return q


def _pairs(table: object, where: str) -> tuple[tuple[str, object], ...]:
    if not isinstance(table, Mapping):
        raise DynspecError(f"{where} must be a table")
    for k, v in table.items():
        if not isinstance(v, (str, int, float, bool)):
            raise DynspecError(f"{where}.{k} = {v!r}: a flag value must be a string, number or boolean")
    return tuple(table.items())


def _typed(d: Mapping, key: str, kind: type, where: str, default=None):
    v = d.get(key, default)
    ok = isinstance(v, kind) and not (kind is int and isinstance(v, bool))
    if v is not None and not ok:
        raise DynspecError(f"{where}: field {key!r} = {v!r} must be a {kind.__name__}")
    return v


def parse_engine(d: Mapping, where: str) -> EngineSpec:
    if not isinstance(d, Mapping):
        raise DynspecError(f"{where}: [engine] must be a table")
    unknown = set(d) - set(EngineSpec.__dataclass_fields__)
    if unknown:
        raise DynspecError(f"{where}: unknown [engine] field(s) {sorted(unknown)}")
    for f, kind in (("pair", str), ("preset", str), ("device", str), ("dtype", str), ("graphs", str), ("layers", int),
                    ("tp", int), ("max_seq_len", int), ("max_batch_size", int), ("build_max_seq_len", int),
                    ("prepare_budget_s", int)):
        _typed(d, f, kind, f"{where} [engine]")
    spec = EngineSpec(**d)
    if spec.pair not in ("tiny", "random"):
        raise DynspecError(f"{where}: [engine] pair {spec.pair!r} must be 'tiny' or 'random'")
    if spec.graphs is not None and spec.graphs not in GRAPHS:
        raise DynspecError(f"{where}: [engine] graphs {spec.graphs!r} must be one of {GRAPHS}")
    return spec


def parse_stage(d: Mapping, where: str) -> StageSpec:
    unknown = set(d) - {"name", "tool", "args", "repeat", "ranks", "env", "install", "cases"}
    if unknown:
        raise DynspecError(f"{where}: unknown field(s) {sorted(unknown)}")
    name, tool = _typed(d, "name", str, where), _typed(d, "tool", str, where)
    if not name or tool not in TOOLS:
        raise DynspecError(f"{where}: needs a name and a tool in {sorted(TOOLS)} (got name={name!r}, tool={tool!r})")
    check_name(name, where)
    repeat, ranks = _typed(d, "repeat", int, where, 1), _typed(d, "ranks", int, where, 1)
    if repeat < 1 or ranks < 1:
        raise DynspecError(f"{where}: repeat {repeat} and ranks {ranks} must be at least 1")
    args = _suite_args(d.get("args", {}), f"{where}.args")
    env = tuple((k, str(v)) for k, v in _pairs(d.get("env", {}), f"{where}.env"))
    install = _typed(d, "install", str, where)
    if install is not None and (tool != "profile" or repeat != 1 or install not in INSTALLABLE):
        raise DynspecError(f"{where}: install {install!r} is for one profile stage (repeat 1) and one of"
                           f" {list(INSTALLABLE)} (got tool {tool!r}, repeat {repeat})")
    cases = parse_cases(d["cases"], args, where) if "cases" in d else ()
    if cases and (tool != "sweep" or repeat != 1):
        raise DynspecError(f"{where}: cases are for a sweep stage of repeat 1 (got tool {tool!r}, repeat {repeat})")
    return StageSpec(name, tool, args, repeat, ranks, env, install, cases)


SUITE_SET = ("out", "engine-dir", "device", "dtype", "graphs", "no-progress", "engine", "report", "cases")


def _suite_args(table: object, where: str) -> tuple[tuple[str, object], ...]:
    """A stage's or a case's args: flag values, none of them one the suite sets (SUITE_SET)."""
    args = _pairs(table, where)
    for k, _ in args:
        if k in SUITE_SET:
            raise DynspecError(f"{where}: {k!r} is set by the suite from [engine] and the results dir")
    return args


def parse_cases(raw: object, common: Sequence[tuple[str, object]], where: str) -> tuple[CaseSpec, ...]:
    """[[stages.cases]] -> CaseSpecs: each a table of `name` (an identifier, once) and `args`; the
    flags that select or size the one engine (sweep_cases.SHARED_FLAGS) equal in every case."""
    from dynspec.benchmarks.sweep_cases import CASE_NAME

    if not isinstance(raw, list) or not raw:
        raise DynspecError(f"{where}: cases must be [[stages.cases]] tables, at least one")
    out: list[CaseSpec] = []
    for j, c in enumerate(raw):
        at = f"{where}.cases[{j}]"
        if not isinstance(c, Mapping):
            raise DynspecError(f"{at} must be a table")
        unknown = set(c) - {"name", "args"}
        if unknown:
            raise DynspecError(f"{at}: unknown field(s) {sorted(unknown)} (a case has name and args)")
        name = _typed(c, "name", str, at)
        if name is None or not CASE_NAME.fullmatch(name):
            raise DynspecError(f"{at}: name {name!r} is not an identifier (letters, digits, _; e.g. p015)")
        if name in [x.name for x in out]:
            raise DynspecError(f"{at}: case name {name!r} repeats")
        args = _suite_args(c.get("args", {}), f"{at}.args")
        for k, v in args:
            if v is False and dict(common).get(k) is True:
                raise DynspecError(f"{at}.args.{k} = false: a case cannot unset the stage's flag --{k}")
        out.append(CaseSpec(name, args))
    _check_shared(out, common, where)
    return tuple(out)


def _check_shared(cases: Sequence[CaseSpec], common: Sequence[tuple[str, object]], where: str) -> None:
    """Every case's merged value of each engine flag (SHARED_FLAGS) is the first case's."""
    from dynspec.benchmarks.sweep_cases import SHARED_FLAGS

    merged = [dict(common, **dict(c.args)) for c in cases]
    for j, m in enumerate(merged[1:], 1):
        for key in (f.replace("_", "-") for f in SHARED_FLAGS):
            if m.get(key) != merged[0].get(key):
                raise DynspecError(f"{where}.cases[{j}] ({cases[j].name}): {key} = {m.get(key)!r} differs from case"
                                   f" {cases[0].name!r}'s {merged[0].get(key)!r}; the cases share one engine")


def case_args(s: StageSpec, c: CaseSpec) -> tuple[tuple[str, object], ...]:
    """A case's flags as a plain sweep would take them: the stage's args updated by the case's."""
    return tuple(dict(s.args, **dict(c.args)).items())


def stage_names(s: StageSpec) -> list[str]:
    """A stage of repeat N runs as NAME1..NAMEN, of repeat 1 as NAME."""
    return [s.name] if s.repeat == 1 else [f"{s.name}{i}" for i in range(1, s.repeat + 1)]


def output_names(s: StageSpec) -> list[str]:
    """What later stages and the figures read of s: its runs (stage_names), or for a stage with
    cases each case's outputs, as if a stage: sweep with cases p015, mix -> sweep_p015, sweep_mix."""
    return [f"{s.name}_{c.name}" for c in s.cases] if s.cases else stage_names(s)


def figure_stages(stages: Sequence[StageSpec]) -> dict[str, int]:
    """{stage name: repeat} as the figures read them (summary.suite_figures): a stage with cases
    gives each case's output name, repeat 1."""
    out: dict[str, int] = {}
    for s in stages:
        out.update({n: 1 for n in output_names(s)} if s.cases else {s.name: s.repeat})
    return out


def arg_sites(s: StageSpec, i: int, where: str) -> list[tuple[str, object]]:
    """(where, value) of every arg of stages[i], its cases' too: ('c.toml stages[1].cases[0].args.x', v)."""
    out = [(f"{where} stages[{i}].args.{k} = {v!r}", v) for k, v in s.args]
    for j, c in enumerate(s.cases):
        out += [(f"{where} stages[{i}].cases[{j}].args.{k} = {v!r}", v) for k, v in c.args]
    return out


def references(value: object) -> list[str]:
    """'@{stage:tune_015}/schedule.txt' -> ['stage:tune_015']; non-strings have none."""
    return REFERENCE.findall(value) if isinstance(value, str) else []


def check_references(stages: Sequence[StageSpec], engine: "EngineSpec", where: str) -> None:
    """Each {stage:NAME} names an earlier stage's run; {cost_model} needs a prepared engine and
    no stage before the one that installs it (when one does)."""
    earlier: list[str] = []
    later = {n for s in stages for n in output_names(s)}
    installs = [i for i, s in enumerate(stages) if s.install == COST_MODEL]
    for i, s in enumerate(stages):
        for at, v in arg_sites(s, i, where):
            for ref in references(v):
                kind, _, name = ref.partition(":")
                if ref == "cost_model":
                    if engine.pair == "tiny":
                        raise DynspecError(f"{at}: {{cost_model}} is the prepared engine's; the tiny pair has none")
                    if installs and i <= installs[0]:
                        raise DynspecError(f"{at}: the cost model is installed by the later stage "
                                           f"{stages[installs[0]].name!r}")
                elif kind != "stage" or not name:
                    raise DynspecError(f"{at}: {{{ref}}} is not {{stage:NAME}} or {{cost_model}}")
                elif name not in earlier:
                    why = "comes later (or is this one)" if name in later else "does not exist"
                    raise DynspecError(f"{at}: stage {name!r} {why}; the earlier ones are {earlier}")
        earlier += output_names(s)
        if s.install and engine.pair == "tiny":
            raise DynspecError(f"{where} stages[{i}]: install {s.install!r} needs a prepared engine, not the tiny pair")


def resolve_value(value: object, outs: Mapping[str, str], engine_dir: Path | None) -> object:
    """Replace each {stage:NAME} by that stage's out and {cost_model} by ENGINE_DIR/cost_model.json."""
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        ref = m.group(1)
        if ref == "cost_model":
            return str(Path(engine_dir) / COST_MODEL)
        return outs[ref.partition(":")[2]]

    return REFERENCE.sub(sub, value)


def needs_cost_model(stages: Sequence[StageSpec]) -> list[str]:
    """The stages that read ENGINE_DIR/cost_model.json: {cost_model} in an arg, or a sweep (or one
    of its cases) whose modes include adaptive without --cost-model."""
    out = []
    for s in stages:
        for args in [dict(case_args(s, c)) for c in s.cases] or [dict(s.args)]:
            adaptive = s.tool == "sweep" and "adaptive" in str(args.get("modes", "")).split(",") \
                and "cost-model" not in args
            if adaptive or any(r == "cost_model" for v in args.values() for r in references(v)):
                out.append(s.name)
                break
    return out


def parse_config(doc: Mapping, name: str, source: str = "") -> Config:
    where = source or name
    check_name(name, where, "config")
    unknown = set(doc) - {"description", "figures", "budget_s", "estimate_s", "engine", "stages"}
    if unknown:
        raise DynspecError(f"{where}: unknown field(s) {sorted(unknown)}")
    figures, budget = _typed(doc, "figures", str, where), _typed(doc, "budget_s", int, where)
    if figures not in FIGURES:
        raise DynspecError(f"{where}: figures {figures!r} must be one of {FIGURES}")
    if budget is None or budget < 1:
        raise DynspecError(f"{where}: budget_s {budget!r} must be a positive number of seconds")
    raw_stages = doc.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise DynspecError(f"{where}: needs at least one [[stages]] table")
    stages = tuple(parse_stage(s, f"{where} stages[{i}]") for i, s in enumerate(raw_stages))
    names = [n for s in stages for n in ([s.name] + (output_names(s) if s.cases else []))]
    if len(set(names)) != len(names):
        raise DynspecError(f"{where}: stage names {names} repeat (a case's outputs count as stage STAGE_CASE)")
    names = list(figure_stages(stages))
    missing = [n for n in FIGURE_STAGES[figures] if n not in names]
    if figures == "adaptive" and not sweep_stage_names(names):
        missing = ["sweep or sweep_*"]
    if missing:
        raise DynspecError(f"{where}: figures {figures!r} read stage(s) {missing}; the stages are {names}")
    engine = parse_engine(doc.get("engine", {}), where)
    check_references(stages, engine, where)
    check_args(stages, engine, where)
    return Config(name, _typed(doc, "description", str, where, ""), figures, budget, engine, stages,
                  _typed(doc, "estimate_s", int, where, 0), source)


def check_args(stages: Sequence[StageSpec], engine: EngineSpec, where: str) -> None:
    """Each stage's args, and each case's merged args, against its tool's own parser
    (suite_checks.check_tool_args), on the command line the stage would run."""
    eng = None if engine.pair == "tiny" else Path("ENGINE_DIR")
    for i, s in enumerate(stages):
        at = f"{where} stages[{i}] ({s.name})"
        sets = [(f"{at}.args", s.args)] + [(f"{at}.cases[{j}] ({c.name}).args", case_args(s, c))
                                          for j, c in enumerate(s.cases)]
        for site, args in sets:
            argv = [*engine_flags(s.tool, engine, eng), *flag_args(args), *out_flags(s.tool, Path("RESULTS") / s.name)]
            check_tool_args(s.tool, args, argv, SUITE_SET, site)


def sweep_stage_names(names) -> list[str]:
    """The stages the adaptive figures read: 'sweep' and 'sweep_*', in order."""
    return [n for n in names if n == "sweep" or n.startswith("sweep_")]


def load_config(name: str) -> Config:
    path = config_path(name)
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise DynspecError(f"config {path}: {e}") from None
    return parse_config(doc, path.stem, str(path))


# ---- commands ----------------------------------------------------------------------------
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
            dest = results / (name if s.tool in ("sweep", "tune") else f"{name}.json")
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


def write_text_atomic(path: str | Path, text: str) -> None:
    """`text` to `path` by a temp file beside it, renamed."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def install_file(src: str, dest: str) -> None:
    """Copy a stage's output to `dest` (the engine dir) atomically: a temp file beside it, renamed.
    The output must be a JSON object (a profile.json)."""
    from dynspec.artifacts import read_json

    read_json(src, "stage output to install")          # refuses what is not one JSON object
    d = Path(dest)
    tmp = d.with_name(f".{d.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, d)
    finally:
        tmp.unlink(missing_ok=True)


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


# ---- running -----------------------------------------------------------------------------
@dataclass(frozen=True)
class StageResult:
    name: str
    command: str
    rc: int
    wall_s: float
    timed_out: bool = False
    log: str = ""


def run_stage(stage: Stage, timeout_s: float, log: Path) -> StageResult:
    """Run one command, stdout+stderr to `log`; past `timeout_s` its process group is killed (rc 124)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **STAGE_ENV, **dict(stage.env))
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(stage.argv) + "\n")
        f.flush()
        proc = subprocess.Popen(stage.argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc, timed_out = proc.wait(timeout=max(timeout_s, 0.001)), False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, timed_out = 124, True
    return StageResult(stage.name, shlex.join(stage.argv), rc, round(time.monotonic() - t0, 3), timed_out, log.name)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the stage's process group (mpirun and its ranks too), SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_stages(stages: Sequence[Stage], budget_s: float, logs: Path, bar=None,
               installed: list | None = None) -> tuple[list[StageResult], str | None]:
    """Run in order under one deadline; stop at the first failure. -> (results, None | why it stopped):
    "budget 540 s ran out in stage 'sweep' (killed after 531.2 s)", "stage 'sweep' failed with rc 2
    (log: logs/sweep.log): error: ..." (the log's last error line). Each install's destination as
    it was before is appended to `installed` (suite_checks.saved), for suite_checks.restore."""
    installed = [] if installed is None else installed
    deadline = time.monotonic() + budget_s
    done: list[StageResult] = []
    for st in stages:
        left = deadline - time.monotonic()
        if left <= 0:
            return done, f"budget {budget_s:g} s ran out before stage {st.name!r}"
        if bar is not None:
            bar.set_postfix_str(st.name)
        for d in st.dirs:
            Path(d).mkdir(parents=True, exist_ok=True)
        for path, text in st.files:
            write_text_atomic(path, text)
        r = run_stage(st, left, logs / f"{st.name}.log")
        done.append(r)
        if bar is not None:
            bar.update(1)
        if r.timed_out:
            return done, f"budget {budget_s:g} s ran out in stage {st.name!r} (killed after {r.wall_s:.1f} s)"
        if r.rc != 0:
            last = last_error_line(logs / f"{st.name}.log")
            return done, f"stage {st.name!r} failed with rc {r.rc} (log: {logs.name}/{st.name}.log)" + \
                (f": {last}" if last else "")
        if st.install:
            installed.append(saved(st.install))
            try:
                install_file(st.out, st.install)
            except (DynspecError, OSError) as e:
                return done, f"stage {st.name!r}: installing {st.out} as {st.install} failed: {e}"
    return done, None


def missing_cost_model(cfg: Config, engine_dir: Path | None) -> str | None:
    """Why the config cannot run: it reads ENGINE_DIR/cost_model.json, no stage of it installs one
    and the engine has none; None when it can."""
    need = needs_cost_model(cfg.stages)
    if not need or engine_dir is None or any(s.install == COST_MODEL for s in cfg.stages):
        return None
    path = Path(engine_dir) / COST_MODEL
    if path.is_file():
        return None
    return (f"stage(s) {need} read the engine's cost model {path}, which is absent: run the cost_model config"
            f" with the same --work first (python -m dynspec.benchmarks.suite cost_model --work {Path(engine_dir).parents[1]})")


def prepare(engine: EngineSpec, work: Path, logs: Path, dry_run: bool = False) -> dict:
    """-> {"engine_dir", "reused", "stages": [StageResult...]}; the tiny pair needs nothing."""
    if engine.pair == "tiny":
        return {"engine_dir": None, "reused": True, "stages": []}
    root = work / engine.key()
    marker = root / "prepared.json"
    info = {"engine_dir": str(root / "engine"), "reused": False, "stages": []}
    if marker.is_file() and (root / "engine" / "engine.json").is_file():
        try:
            same = json.loads(marker.read_text()).get("spec") == engine.prepared()
        except ValueError:
            same = False
        if same:
            return dict(info, reused=True)
    cmds = prepare_commands(engine, root)
    if dry_run:
        return dict(info, commands=[shlex.join(c.argv) for c in cmds])
    marker.unlink(missing_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    results, why = run_stages(cmds, engine.prepare_budget_s, logs)
    info["stages"] = [asdict(r) for r in results]
    if why:
        raise StageFailure(f"prepare: {why}", info)
    marker.write_text(json.dumps({"spec": engine.prepared(), "commands": [r.command for r in results]}, indent=1))
    return info


class StageFailure(DynspecError):
    def __init__(self, msg: str, info: dict):
        super().__init__(msg)
        self.info = info


# ---- provenance --------------------------------------------------------------------------
def _out(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO,
                           env=None if env is None else {**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def worktree_tree() -> str | None:
    """The git tree of the files as they are (tracked and untracked-not-ignored, edits included),
    through a scratch index: equal to a commit's tree when the run's files are that commit's
    (`git rev-parse COMMIT^{tree}`), whatever HEAD was where it ran. None outside a git checkout."""
    with tempfile.TemporaryDirectory() as d:
        env = {"GIT_INDEX_FILE": str(Path(d) / "index")}
        if _out(["git", "read-tree", "HEAD"], env) is None or _out(["git", "add", "-A"], env) is None:
            return None
        return _out(["git", "write-tree"], env)


def provenance() -> dict:
    """git commit / tree / changed paths / the tree of the files as run, GPU (nvidia-smi, when present), torch and python versions."""
    import platform

    status = _out(["git", "status", "--porcelain"])
    gpu = None
    if shutil.which("nvidia-smi"):
        q = _out(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu",
                  "--format=csv,noheader"])
        gpu = None if q is None else [dict(zip(("name", "clocks_sm", "clocks_max_sm", "clocks_mem", "power_draw",
                                                "temperature"), (x.strip() for x in line.split(","))))
                                      for line in q.splitlines()]
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"git_commit": _out(["git", "rev-parse", "HEAD"]), "git_tree": _out(["git", "rev-parse", "HEAD^{tree}"]),
            "git_changed_paths": None if status is None else len(status.splitlines()),
            "git_worktree_tree": worktree_tree(),
            "gpus": gpu, "torch": torch_version, "python": platform.python_version(), "host": platform.node()}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---- one config --------------------------------------------------------------------------
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
    from dynspec.benchmarks.summary import suite_figures
    from dynspec.benchmarks.report import write_suite_report

    tmp = staging_dir(out_root, cfg.name)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
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
        bad = out_root / f"{cfg.name}.incomplete"
        shutil.rmtree(bad, ignore_errors=True)
        tmp.rename(bad)
        raise StageFailure(f"config {cfg.name}: {why}; partial outputs in {bad}", manifest)
    final = out_root / cfg.name
    publish(tmp, final)
    shutil.rmtree(out_root / f"{cfg.name}.incomplete", ignore_errors=True)     # an older failed run's
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
        except StageFailure as e:
            print(f"dynspec suite: error: {e}", file=sys.stderr)
            return 1
        print(f"{cfg.name}: engine {'reused' if info['reused'] else 'prepared'} at {info['engine_dir']}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.suite", description=__doc__.splitlines()[0],
                                allow_abbrev=False)
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="config names (benchmarks/configs/NAME.toml) or .toml paths")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "dynspec_suite"),
                   help="where prepared engines live, reused across runs (default: %(default)s)")
    p.add_argument("--out-root", default=str(HERE / "results"), help="results go to OUT_ROOT/CONFIG (default: %(default)s)")
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
    work, out_root = Path(args.work), Path(args.out_root)
    if args.dry_run:
        for cfg in cfgs:
            print("\n".join(dry_run(cfg, work, out_root)))
        return 0
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
