"""The suite's config model: what a config TOML holds (Config: EngineSpec, StageSpec, CaseSpec),
the concrete commands it becomes (Stage), and the names its stages' outputs go by. What each
field means: benchmarks/suite.py's docstring; how a TOML is read and checked: suite_config.py."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
TOOLS = {"sweep": ["-m", "dynspec.benchmarks.sweep"], "profile": ["-m", "dynspec.cli", "profile"],
         "mixed_step": ["-m", "dynspec.benchmarks.mixed_step"], "tune": ["-m", "dynspec.cli", "tune"],
         "simulate": ["-m", "dynspec.benchmarks.simulate"]}
# the stages each kind of figures reads (benchmarks/summary.py suite_figures); "adaptive",
# "per_request" and "serving_ttft" read every stage named sweep or sweep_*, at least one
FIGURE_STAGES = {"sweep": ("sweep",), "decode_floor": ("floor",), "mixed_step": ("mixed",),
                 "varied_vs_fixed": ("varied", "fixed"), "tp": ("tp1", "tp2"), "adaptive": (), "per_request": (),
                 "cost_model": ("profile",), "sim_validate": ("validation",), "sim_ttft": ("ttft_0",), "serving_ttft": (), "overlap": ("sweep_varied", "sweep_fixed", "sweep_regime_b", "floor")}
FIGURES = tuple(FIGURE_STAGES)
SWEEP_STAGE_FIGURES = ("adaptive", "per_request", "serving_ttft")     # the kinds that read every sweep / sweep_* stage
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
# the flags the suite sets on a stage itself (from [engine] and the results dir): a stage's args may not
SUITE_SET = ("out", "engine-dir", "device", "dtype", "graphs", "no-progress", "engine", "report", "cases")


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


def references(value: object) -> list[str]:
    """'@{stage:tune_015}/schedule.txt' -> ['stage:tune_015']; non-strings have none."""
    return REFERENCE.findall(value) if isinstance(value, str) else []


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
