"""Read and check a suite config (benchmarks/configs/NAME.toml or a .toml path) -> Config, before
anything runs: field types, plain names, references between stages, and every stage's flags
against its tool's own parser (suite_checks)."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Mapping, Sequence

from dynspec.benchmarks.suite_checks import check_name, check_tool_args
from dynspec.benchmarks.suite_commands import engine_flags, flag_args, out_flags
from dynspec.benchmarks.suite_spec import (CONFIG_DIR, COST_MODEL, FIGURE_STAGES, FIGURES, GRAPHS, INSTALLABLE,
                                           SUITE_SET, SWEEP_STAGE_FIGURES, TOOLS, CaseSpec, Config, EngineSpec,
                                           StageSpec, case_args, figure_stages, output_names, references)
from dynspec.benchmarks.summary import sweep_stage_names
from dynspec.errors import DynspecError


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


def arg_sites(s: StageSpec, i: int, where: str) -> list[tuple[str, object]]:
    """(where, value) of every arg of stages[i], its cases' too: ('c.toml stages[1].cases[0].args.x', v)."""
    out = [(f"{where} stages[{i}].args.{k} = {v!r}", v) for k, v in s.args]
    for j, c in enumerate(s.cases):
        out += [(f"{where} stages[{i}].cases[{j}].args.{k} = {v!r}", v) for k, v in c.args]
    return out


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
    if figures in SWEEP_STAGE_FIGURES and not sweep_stage_names(names):
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


def load_config(name: str) -> Config:
    path = config_path(name)
    try:
        doc = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise DynspecError(f"config {path}: cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise DynspecError(f"config {path}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise DynspecError(f"config {path}: nested too deeply to be read as TOML") from None
    except tomllib.TOMLDecodeError as e:
        raise DynspecError(f"config {path}: {e}") from None
    return parse_config(doc, path.stem, str(path))
