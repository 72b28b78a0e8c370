"""The adaptive-policy configs: sweep modes static:K and adaptive, the suite's tune stages,
{stage:NAME} / {cost_model} references and the cost model's install, and the adaptive figures."""
import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynspec.benchmarks import suite, suite_spec, suite_stages, summary, sweep, sweep_modes, sweep_plan, sweep_rows
from dynspec.benchmarks.suite_commands import stage_commands
from dynspec.benchmarks.suite_config import load_config, parse_config
from dynspec.benchmarks.summary import suite_figures
from dynspec.benchmarks.figures_adaptive import adaptive_sweep, host_cost, settle_iterations
from dynspec.errors import DynspecError
from dynspec.runtime.policy import DraftSchedule

ADAPTIVE = ("acceptance", "long_context")
ADAPTIVE_CONFIGS = ("cost_model",) + ADAPTIVE


# ---- sweep modes --------------------------------------------------------------------------------
def test_static_k_modes_are_modes_of_their_own():
    modes = sweep_modes.parse_modes("baseline,static:1,static:5,static,dynamic,adaptive")
    assert modes == ("baseline", "static:1", "static:5", "static", "dynamic", "adaptive")
    dyn = DraftSchedule.parse("24:3,179:1")
    got = sweep_modes.mode_schedules(modes, dyn, 2, 64)
    assert [got[m].draft_len(64) for m in ("baseline", "static:1", "static:5", "static", "dynamic")] == [0, 1, 5, 2, 1]
    assert "adaptive" not in got


@pytest.mark.parametrize("text", ["static:0", "static:33", "static:x", "static:", "adaptive,adaptive", "fast"])
def test_bad_modes_are_refused_naming_them(text):
    with pytest.raises(DynspecError, match="--modes"):
        sweep_modes.parse_modes(text)


def _args(*argv: str) -> argparse.Namespace:
    return sweep.make_parser().parse_args([*argv, "--out", "x"])


def test_trtllm_refuses_the_reference_only_modes():
    with pytest.raises(DynspecError, match="--engine trtllm runs baseline, static, dynamic only"):
        sweep_plan.check_flags(_args("--engine", "trtllm", "--modes", "baseline,static:2"))


def test_adaptive_needs_a_cost_model_and_names_the_path(tmp_path):
    with pytest.raises(DynspecError, match=f"{tmp_path}/cost_model.json does not exist"):
        sweep_modes.cost_model_path(_args("--engine-dir", str(tmp_path), "--modes", "adaptive"))
    with pytest.raises(DynspecError, match="give --cost-model FILE"):
        sweep_modes.cost_model_path(_args("--modes", "adaptive"))
    (tmp_path / "cost_model.json").write_text("{}")
    assert sweep_modes.cost_model_path(_args("--engine-dir", str(tmp_path))) == tmp_path / "cost_model.json"
    other = tmp_path / "p.json"
    other.write_text("{}")
    assert sweep_modes.cost_model_path(_args("--engine-dir", str(tmp_path), "--cost-model", str(other))) == other


def test_the_sweep_records_a_resolved_shift_and_nothing_for_other_models():
    from dynspec.runtime.policy.acceptance import Bernoulli, Shift, resolve

    assert sweep_modes.shift_of(resolve(Shift(0.8, 0.2, 0.5), 64)) == {"key": 32, "before": 0.8, "after": 0.2}
    assert sweep_modes.shift_of(Shift(0.8, 0.2, 0.5)) is None            # a fraction is not a key yet
    assert sweep_modes.shift_of(Bernoulli(0.5)) is None


@dataclass(frozen=True)
class _Stats:
    k: int
    batch_size: int
    seconds: float
    acceptance: tuple = ()
    probe: bool = False
    policy_seconds: float = 0.0
    oldest_key: int | None = None
    policy_exposed_seconds: float = 0.0


def test_adaptive_trace_keeps_decode_iterations_compactly():
    class Ex:
        def __init__(self):
            self.out = [_Stats(2, 4, 0.0123, (0.61234, 0.4), False, 21.5e-6, 7, 9.25e-6), None, _Stats(0, 0, 0.002)]

        def step(self):
            return self.out.pop(0)

        def submit(self, *a):
            return "handle"

    tr = sweep_rows.StepTrace(Ex())
    assert tr.submit([1], 2) == "handle"
    assert [tr.step() is None for _ in range(3)] == [False, True, False]
    assert tr.steps == [(2, 0.6123, 0, 21.5, 7, 12300.0, 4, 9.2)]          # prompt-only and empty steps left out
    assert dict(zip(sweep_rows.ADAPTIVE_FIELDS, tr.steps[0]))["oldest_key"] == 7


# ---- suite: references, tune, install ----------------------------------------------------------
ENGINE = {"pair": "random", "preset": "tiny", "device": "cpu", "dtype": "float32", "tp": 1, "max_seq_len": 256,
          "max_batch_size": 4, "build_max_seq_len": 256}


def _cfg(stages: list, figures: str = "adaptive", engine: dict = ENGINE):
    return parse_config({"figures": figures, "budget_s": 60, "engine": engine, "stages": stages}, "c", "configs/c.toml")


PROFILE = {"name": "profile", "tool": "profile", "install": "cost_model.json", "args": {"batch-sizes": "1"}}
TUNE = {"name": "tune_05", "tool": "tune", "args": {"profile": "{cost_model}", "acceptance": 0.5}}
SWEEP = {"name": "sweep", "tool": "sweep", "args": {"modes": "baseline,dynamic,adaptive",
                                                    "dynamic-schedule": "@{stage:tune_05}/schedule.txt"}}


def test_references_resolve_to_earlier_outputs_and_the_engines_cost_model(tmp_path):
    cfg = _cfg([PROFILE, TUNE, SWEEP])
    prof, tune, sw = stage_commands(cfg, tmp_path / "engine", tmp_path / "res")
    assert prof.install == str(tmp_path / "engine" / "cost_model.json") and prof.out == str(tmp_path / "res/profile.json")
    assert tune.argv[3:] == ("tune", "--profile", str(tmp_path / "engine/cost_model.json"), "--acceptance", "0.5",
                             "--out", str(tmp_path / "res/tune_05/schedule.txt"),
                             "--report", str(tmp_path / "res/tune_05/tune.json"))
    assert tune.dirs == (str(tmp_path / "res/tune_05"),) and tune.out == str(tmp_path / "res/tune_05")
    i = sw.argv.index("--dynamic-schedule")
    assert sw.argv[i + 1] == f"@{tmp_path}/res/tune_05/schedule.txt"
    assert sweep.make_parser().parse_args(list(sw.argv[3:])).dynamic_schedule == sw.argv[i + 1]


@pytest.mark.parametrize("stages,msg", [
    ([SWEEP, TUNE], "stage 'tune_05' comes later (or is this one); the earlier ones are []"),
    ([{**SWEEP, "args": {"dynamic-schedule": "@{stage:tune}/schedule.txt"}}], "stage 'tune' does not exist"),
    ([{**SWEEP, "args": {"dynamic-schedule": "{tune_05}"}}], "{tune_05} is not {stage:NAME} or {cost_model}"),
    ([TUNE, PROFILE, {**SWEEP, "name": "sweep"}], "the cost model is installed by the later stage 'profile'"),
    ([{**PROFILE, "install": "engine.json"}, SWEEP], "install 'engine.json' is for one profile stage"),
    ([{**TUNE, "install": "cost_model.json"}, SWEEP], "install 'cost_model.json' is for one profile stage"),
    ([{**TUNE, "args": {"report": "x.json"}}, SWEEP], "'report' is set by the suite"),
])
def test_bad_references_and_installs_are_refused_naming_the_field(stages, msg):
    with pytest.raises(DynspecError) as e:
        _cfg(stages)
    assert msg in str(e.value) and str(e.value).startswith("configs/c.toml")


def test_the_tiny_pair_has_no_engine_to_carry_a_cost_model():
    with pytest.raises(DynspecError, match="the tiny pair has none"):
        _cfg([TUNE, SWEEP], engine={"pair": "tiny", "device": "cpu"})
    with pytest.raises(DynspecError, match="needs a prepared engine"):
        _cfg([PROFILE, {"name": "sweep", "tool": "sweep"}], engine={"pair": "tiny", "device": "cpu"})


def test_adaptive_figures_need_a_sweep_stage():
    with pytest.raises(DynspecError, match=r"read stage\(s\) \['sweep or sweep_\*'\]"):
        _cfg([{"name": "mix", "tool": "sweep"}])
    assert summary.sweep_stage_names(["tune", "sweep_mix", "sweeper", "sweep"]) == ["sweep_mix", "sweep"]


def test_install_copies_atomically_and_refuses_what_is_not_a_profile(tmp_path):
    src, dest = tmp_path / "profile.json", tmp_path / "engine" / "cost_model.json"
    dest.parent.mkdir()
    dest.write_text('{"old": 1}')
    src.write_text('{"device": "x"}')
    suite_stages.install_file(str(src), str(dest))
    assert json.loads(dest.read_text()) == {"device": "x"} and sorted(os.listdir(dest.parent)) == ["cost_model.json"]
    src.write_text("[1, 2]")
    with pytest.raises(DynspecError, match="must hold a JSON object"):
        suite_stages.install_file(str(src), str(dest))
    src.write_text("{not json")
    with pytest.raises(DynspecError):
        suite_stages.install_file(str(src), str(dest))
    assert json.loads(dest.read_text()) == {"device": "x"} and sorted(os.listdir(dest.parent)) == ["cost_model.json"]


def test_a_failed_install_stops_the_stages_naming_it(tmp_path):
    py = sys.executable
    st = [suite_spec.Stage("p", (py, "-c", f"open({str(tmp_path / 'p.json')!r}, 'w').write('[]')"), str(tmp_path / "p.json"),
                      install=str(tmp_path / "cost_model.json")),
          suite_spec.Stage("never", (py, "-c", "print(1)"), "")]
    done, why = suite.run_stages(st, 30, tmp_path / "logs")
    assert [r.name for r in done] == ["p"] and "stage 'p': installing" in why and "must hold a JSON object" in why
    assert not (tmp_path / "cost_model.json").exists()


def test_a_config_that_needs_the_cost_model_is_refused_when_it_is_absent(tmp_path):
    cfg = _cfg([TUNE, SWEEP])
    eng = tmp_path / "work" / "key" / "engine"
    eng.mkdir(parents=True)
    why = suite.missing_cost_model(cfg, eng)
    assert f"{eng}/cost_model.json, which is absent" in why and "['tune_05', 'sweep']" in why
    assert f"cost_model --work {tmp_path / 'work'}" in why
    assert suite.missing_cost_model(_cfg([PROFILE, TUNE, SWEEP]), eng) is None      # installed by its own stage
    (eng / "cost_model.json").write_text("{}")
    assert suite.missing_cost_model(cfg, eng) is None
    plain = {"name": "sweep", "tool": "sweep", "args": {"modes": "adaptive", "cost-model": "/x.json"}}
    assert suite_spec.needs_cost_model(_cfg([plain]).stages) == []


# ---- the shipped configs -------------------------------------------------------------------------
def _sweep_args(st) -> dict[str, argparse.Namespace]:
    """{output name: its flags} of a sweep command: the stage's, or each of its cases' (merged)."""
    from dynspec.benchmarks.sweep_cases import Case, parse_case

    argv = list(st.argv[3:])
    a = sweep.make_parser().parse_args(argv)
    if not st.files:
        return {st.name: a}
    (_, text), = st.files
    runs = [parse_case(argv, Case(c["name"], tuple(c["args"])), a.out) for c in json.loads(text)["cases"]]
    return {f"{st.name}_{r.name}": r.args for r in runs}


@pytest.mark.parametrize("name", ADAPTIVE)
def test_adaptive_configs_check_their_modes_and_acceptance(name, tmp_path):
    from dynspec.runtime.policy.acceptance import parse_acceptance

    for a in [a for st in stage_commands(load_config(name), tmp_path / "engine", tmp_path / "res")
              if st.argv[2] == "dynspec.benchmarks.sweep" for a in _sweep_args(st).values()]:
        modes = sweep_modes.parse_modes(a.modes)
        assert "adaptive" in modes and (a.trials, a.warmup_requests) == (3, 2)
        # the engine's installed cost model, or (long_context) one profiled by this config itself
        assert a.cost_model is None or a.cost_model == str(tmp_path / "res" / "profile.json")
        parse_acceptance(a.acceptance)


def test_the_must_show_workloads_are_the_configs():
    def sweeps(name):
        return {n: a for st in stage_commands(load_config(name), Path("/e"), Path("/r"))
                if st.argv[2] == "dynspec.benchmarks.sweep" for n, a in _sweep_args(st).items()}

    acc = sweeps("acceptance")
    low = acc["sweep_p015"]
    assert (low.acceptance, low.concurrency, low.modes) == ("bernoulli:0.15", "1,16,64,256", "baseline,dynamic,adaptive")
    for case, p in (("p050", "0.5"), ("p090", "0.9")):
        a = acc[f"sweep_{case}"]
        assert a.acceptance == f"bernoulli:{p}" and a.dynamic_schedule == f"@/r/tune_0{p[2]}0/schedule.txt"
        assert sweep_modes.parse_modes(a.modes) == ("baseline", *[f"static:{k}" for k in range(1, 6)], "dynamic", "adaptive")
    assert acc["sweep_mix"].acceptance == "bernoulli-mix:0.9@0.5,0.2@0.5"
    assert acc["sweep_shift"].acceptance == "shift:0.8,0.2@0.5"
    lc = sweeps("long_context")["sweep"]
    assert (lc.input_len, lc.output_len, lc.concurrency, lc.acceptance, lc.modes) == (
        "2048:3072", "256:512", "128", "bernoulli:0.7", "baseline,static:3,adaptive")
    for name in ADAPTIVE:
        for a in sweeps(name).values():
            assert (a.input_len, a.output_len) in (("64:192", "32:224"), ("2048:3072", "256:512"))


def test_the_adaptive_configs_share_one_engine_that_holds_the_long_context():
    cfgs = [load_config(n) for n in ADAPTIVE_CONFIGS]
    assert len({c.engine.key() for c in cfgs}) == 1
    eng = cfgs[0].engine
    assert eng.max_seq_len >= 3072 + 512 + 5 + 1 and eng.build_max_seq_len >= eng.max_seq_len
    (prof,) = [s for s in cfgs[0].stages if s.tool == "profile"]
    args = dict(prof.args)
    assert prof.install == "cost_model.json" and args["context-lens"] == "128,256,384"
    assert args["max-seq-len"] == 424        # the acceptance sweeps' cache length
    assert args["batch-sizes"] == "1,2,4,8,16,32,64,128,256" and args["draft-lens"] == "0,1,2,3,4,5"


# ---- adaptive figures ---------------------------------------------------------------------------
FIELDS = list(sweep_rows.ADAPTIVE_FIELDS)


def _row(mode, c, trials, **kw):
    return {"mode": mode, "concurrency": c, "output_tok_per_s": sorted(trials)[1], "trial_tok_per_s": trials,
            "mean_k": 1.0, **kw}


def test_settle_iterations_worked_example():
    its = [[1, a, 0, 20.0, key, 1e4, 2, 8.0] for key, a in zip((3, 5, 6, 7, 8), (0.8, 0.5, 0.3, 0.22, 0.21))]
    assert settle_iterations(its, FIELDS, 5, 0.2) == 2
    assert settle_iterations(its, FIELDS, 9, 0.2) is None                 # the key is never reached
    assert settle_iterations(its[:3], FIELDS, 5, 0.2) is None             # never within 0.05
    assert settle_iterations(its, FIELDS, 3, 0.8) is None                 # leaves 0.8 and never returns


def test_adaptive_figures_against_every_rival_with_host_cost_and_settle():
    steps = [[[[3, 0.8, 0, 20.0, 0, 10000.0, 2, 10.0], [0, 0.21, 0, 30.0, 2, 12000.0, 2, 12.0],
               [0, 0.2, 1, 25.0, 2, 11000.0, 1, 11.0]]]] * 3
    rows = [_row("baseline", 1, [100, 100, 100]), _row("static:1", 1, [110, 120, 115]),
            _row("static:3", 1, [90, 130, 95]), _row("dynamic", 1, [105, 105, 105]),
            _row("adaptive", 1, [120, 126, 121], adaptive_steps={"fields": FIELDS, "trials": steps},
                 shift={"key": 2, "before": 0.8, "after": 0.2})]
    doc = {"env": {"acceptance_model": "shift:0.8,0.2@0.5", "command": "c"}, "rows": rows}
    e = adaptive_sweep(doc)["by_concurrency"]["1"]
    assert e["adaptive_vs_baseline"]["median"] == pytest.approx(1.21)
    # per trial: 120 / max(110, 90, 105), 126 / 130, 121 / 115; of the medians 121 / 115
    assert e["adaptive_vs_best"]["min"] == pytest.approx(126 / 130) and e["best_rival"] == "static:1"
    assert e["adaptive_vs_best"]["of_medians"] == pytest.approx(121 / 115)
    assert e["adaptive_vs_dynamic"]["median"] == pytest.approx(121 / 105)
    assert e["host_cost"]["fraction"] == pytest.approx(25 / 11000) and e["host_cost"]["iterations"] == 9
    assert e["host_cost"]["exposed_fraction"] == pytest.approx(11 / 11000)
    assert e["settle"]["median"] == 0 and e["settle"]["runs"] == 3 and e["settle"]["unsettled"] == 0
    assert e["k_hist"] == {"0": 6, "3": 3} and e["probe_fraction"] == pytest.approx(1 / 3)
    assert host_cost({"mode": "adaptive"}) is None


def test_adaptive_summary_from_stage_outputs_with_a_png(tmp_path):
    from dynspec.benchmarks.suite_report import write_suite_report

    steps = [[[[1, 0.5, 0, 20.0, 0, 10000.0, 1, 8.0]]]] * 3
    names = [f"sweep_{c}" for c in ("p015", "p050", "p090", "mix", "shift")]      # the acceptance config's cases
    for name in names:
        rows = [_row(m, c, [100 + i, 101 + i, 102 + i]) for c in (1, 16) for i, m in enumerate(("baseline", "dynamic"))]
        rows += [_row("adaptive", c, [103, 104, 105], adaptive_steps={"fields": FIELDS, "trials": steps}) for c in (1, 16)]
        (tmp_path / f"{name}.json").write_text(json.dumps({"env": {"acceptance_model": name, "command": "c"}, "rows": rows}))
    cfg = load_config("acceptance")
    figs = suite_figures("adaptive", tmp_path, suite.figure_stages(cfg.stages))
    assert list(figs["values"]["sweeps"]) == names and len(figs["table"]["rows"]) == 10
    write_suite_report(cfg, figs, {"command": "c", "stages": []}, tmp_path)
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "summary.json").read_text())["figures"] == "adaptive"


# ---- end to end on CPU ---------------------------------------------------------------------------
def _toml(name: str, stages: str, figures: str) -> str:
    return f"""
description = "CPU: the random tiny-preset pair"
figures = "{figures}"
budget_s = 200
estimate_s = 30
[engine]
pair = "random"
preset = "tiny"
device = "cpu"
dtype = "float32"
tp = 1
max_seq_len = 256
max_batch_size = 4
build_max_seq_len = 256
prepare_budget_s = 150
{stages}"""


TUNE_SWEEP = """
[[stages]]
name = "tune_07"
tool = "tune"
[stages.args]
profile = "{cost_model}"
acceptance = 0.7
context = 64
[[stages]]
name = "sweep"
tool = "sweep"
[stages.args]
modes = "baseline,static:1,dynamic,adaptive"
dynamic-schedule = "@{stage:tune_07}/schedule.txt"
acceptance = "bernoulli:0.7"
input-len = "16:24"
output-len = "8:12"
concurrency = "1,2"
num-requests = 2
warmup-requests = 0
trials = 2
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cost_model_installed_by_one_config_is_read_by_the_next(tmp_path):
    """Config 1 profiles and installs ENGINE_DIR/cost_model.json; config 2 (same work dir) tunes a
    schedule from it and sweeps it; the same config 2 in a fresh work dir is refused naming the file."""
    flag, value = "context-lens", "64,96"
    prof = f"""
[[stages]]
name = "profile"
tool = "profile"
install = "cost_model.json"
[stages.args]
batch-sizes = "1,2"
draft-lens = "0,1,2"
{flag} = "{value}"
warmup = 1
repeats = 2
"""
    # the cost_model figures read the profile through runtime/policy/cost_model.py: sweep figures here
    (tmp_path / "cm.toml").write_text(_toml("cm", prof + TUNE_SWEEP, "sweep"))
    (tmp_path / "use.toml").write_text(_toml("use", TUNE_SWEEP, "sweep"))
    out, work = tmp_path / "results", tmp_path / "work"
    assert suite.main([str(tmp_path / "cm.toml"), str(tmp_path / "use.toml"), "--work", str(work),
                       "--out-root", str(out), "--no-progress"]) == 0
    cm = json.loads((out / "cm" / "manifest.json").read_text())
    engine = Path(cm["prepare"]["engine_dir"])
    assert (engine / "cost_model.json").read_bytes() == (out / "cm" / "profile.json").read_bytes()
    assert cm["installs"] == [{"stage": "profile", "from": str(out / ".cm.partial" / "profile.json"),
                               "to": str(engine / "cost_model.json")}]
    schedule = (out / "use" / "tune_07" / "schedule.txt").read_text().strip()
    assert DraftSchedule.parse(schedule).to_spec() == schedule
    tuned = json.loads((out / "use" / "tune_07" / "tune.json").read_text())
    assert tuned["profile"] == str(engine / "cost_model.json")
    sw = json.loads((out / "use" / "sweep.json").read_text())
    assert sw["env"]["schedules"]["dynamic"] == schedule
    assert sw["env"]["schedules"]["static:1"] == DraftSchedule.static(1, 2).to_spec()
    assert {r["mode"] for r in sw["rows"]} == {"baseline", "static:1", "dynamic", "adaptive"}
    adaptive = [r for r in sw["rows"] if r["mode"] == "adaptive"]
    assert all(r["policy"] == "adaptive" and r["adaptive_steps"] for r in adaptive)
    assert sw["env"]["adaptive"]["cost_model"] == str(engine / "cost_model.json")
    assert all(k == 1 for r in sw["rows"] if r["mode"] == "static:1" for _, k, _ in r["k_by_batch"])

    (engine / "cost_model.json").unlink()
    assert suite.main([str(tmp_path / "use.toml"), "--work", str(work), "--out-root", str(out), "--no-progress"]) == 1
    man = json.loads((out / "use.incomplete" / "manifest.json").read_text())
    assert f"{engine}/cost_model.json, which is absent" in man["error"] and man["stages"] == []
