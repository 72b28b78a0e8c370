"""Sweep cases (benchmarks/sweep_cases.py): a suite sweep stage with [[stages.cases]] runs as one
sweep process on one engine, each case writing what a plain sweep of its merged flags writes.
Oracle: the plain sweep itself, run with the same merged flags, compared in everything but timing."""
import json
from pathlib import Path

import pytest

from dynspec.benchmarks import suite, suite_spec, sweep, sweep_cases, sweep_modes
from dynspec.benchmarks.suite import run_config
from dynspec.benchmarks.suite_commands import stage_commands
from dynspec.benchmarks.suite_config import load_config, parse_config
from dynspec.errors import DynspecError
from dynspec.runtime.policy.cost_model import ContextTable, Profile

# the fields of a row that timing decides; everything else is set by the workload, the modes and
# the (seeded) acceptance draws, so a case and its plain sweep agree on it exactly
TIMED = {"duration_s", "output_tok_per_s", "requests_per_s", "p50_latency_s", "p99_latency_s", "mean_latency_s",
         "ttft_s", "p50_ttft_s", "p99_ttft_s", "tpot_s", "p50_tpot_s", "mean_step_ms", "host_overhead_fraction",
         "per_replica_tok_per_s", "steady_tok_per_s", "steady_fraction", "sustained_tok_per_s",
         "engine_idle_fraction", "gpu_gap_fraction", "gpu_gap_mixed_share", "trial_tok_per_s", "tok_per_s_min", "tok_per_s_max", "trial_p99_ttft_s",
         "trial_steady_tok_per_s", "trial_sustained_tok_per_s"}
STEP_TIMED = {"policy_us", "step_us", "policy_exposed_us"}


def untimed(row: dict) -> dict:
    """A sweep row less its timings; the adaptive steps less their host and step times, the
    step_times less theirs."""
    out = {k: v for k, v in row.items() if k not in TIMED}
    if "adaptive_steps" in out:
        fields = out["adaptive_steps"]["fields"]
        keep = [i for i, f in enumerate(fields) if f not in STEP_TIMED]
        out["adaptive_steps"] = [[[[it[i] for i in keep] for it in rep] for rep in trial]
                                 for trial in out["adaptive_steps"]["trials"]]
    if "step_times" in out:
        out["step_times"] = [[it[:-1] for it in rep] for rep in out["step_times"]["replicas"]]   # less step_us
    return out


@pytest.fixture(scope="module")
def cost_model(tmp_path_factory) -> Path:
    """A hand-written profile.json for the adaptive mode and `dynspec tune`: K=1 costs 30% over plain
    decode and every further K 30% more, at b = 1, 2, 4, context 32."""
    ms = {b: {k: round(b * (1.0 + 0.3 * k), 3) for k in range(3)} for b in (1, 2, 4)}
    p = tmp_path_factory.mktemp("cases_cm") / "profile.json"
    p.write_text(json.dumps(Profile("cpu", (ContextTable(32, ms),)).to_json()))
    return p


def cases_config(cost_model: Path, cases: list[dict] | None = None, common: dict | None = None, name: str = "c"):
    """The embedded tiny pair on CPU: a tune stage, then one sweep stage of two cases (different
    acceptance models and modes, both adaptive; b's dynamic schedule is the tune stage's)."""
    tune = {"name": "tune_09", "tool": "tune", "args": {"profile": str(cost_model), "acceptance": 0.9}}
    args = {"cost-model": str(cost_model), "input-len": "6:10", "output-len": "5:8", "max-seq-len": 40,
            "warmup-requests": 1, "trials": 2, **(common or {})}
    cases = cases if cases is not None else [
        {"name": "a", "args": {"modes": "baseline,static:1,adaptive", "acceptance": "bernoulli:0.5",
                               "concurrency": "1,2", "num-requests": 3}},
        {"name": "b", "args": {"modes": "baseline,dynamic,adaptive", "acceptance": "bernoulli:0.9",
                               "dynamic-schedule": "@{stage:tune_09}/schedule.txt", "concurrency": "1,4",
                               "waves": 1, "min-requests": 2}}]
    return parse_config({"description": "tiny pair on CPU, two sweep cases", "figures": "adaptive", "budget_s": 200,
                         "estimate_s": 30, "engine": {"pair": "tiny", "device": "cpu"},
                         "stages": [tune, {"name": "sweep", "tool": "sweep", "args": args, "cases": cases}]},
                        name, "configs/c.toml")


# ---- the suite's side --------------------------------------------------------------------------
def test_a_cases_stage_is_one_command_with_its_cases_file(cost_model, tmp_path):
    cfg = cases_config(cost_model)
    assert suite.figure_stages(cfg.stages) == {"tune_09": 1, "sweep_a": 1, "sweep_b": 1}
    tune, sw = stage_commands(cfg, None, tmp_path / "res")
    (path, text), = sw.files
    assert path == str(tmp_path / "res" / "sweep.cases.json") and sw.out == str(tmp_path / "res" / "sweep")
    assert sw.argv[-4:] == ("--cases", path, "--out", str(tmp_path / "res" / "sweep"))
    cases = json.loads(text)["cases"]
    assert [c["name"] for c in cases] == ["a", "b"]
    b = cases[1]["args"]
    assert b[b.index("--dynamic-schedule") + 1] == f"@{tmp_path}/res/tune_09/schedule.txt"     # resolved
    # each case is the plain sweep of the stage's args updated by its own, by the real parser
    (tmp_path / "res" / "tune_09").mkdir(parents=True)
    (tmp_path / "res" / "tune_09" / "schedule.txt").write_text("2:1\n")          # as the tune stage writes it
    Path(path).write_text(text)
    args = sweep.make_parser().parse_args(list(sw.argv[3:]))
    runs = sweep_cases.case_runs(args, list(sw.argv[3:]))
    assert [r.args.out for r in runs] == [str(tmp_path / "res" / "sweep_a"), str(tmp_path / "res" / "sweep_b")]
    assert [(r.args.modes, r.args.trials, r.args.cost_model) for r in runs] == [
        ("baseline,static:1,adaptive", 2, str(cost_model)), ("baseline,dynamic,adaptive", 2, str(cost_model))]
    assert "--cases" not in runs[0].argv and runs[0].argv[-2:] == ("--out", str(tmp_path / "res" / "sweep_a"))
    dry = suite.dry_run(cfg, tmp_path / "w", tmp_path / "o")
    (line,) = [x for x in dry if x.startswith(f"# {tmp_path}/o/.c.partial/sweep.cases.json: ")]
    assert [c["name"] for c in json.loads(line.split(": ", 1)[1])["cases"]] == ["a", "b"]


def test_references_in_case_args_are_checked_like_stage_args(cost_model):
    bad = [{"name": "a", "args": {"dynamic-schedule": "@{stage:tune_x}/schedule.txt"}}]
    with pytest.raises(DynspecError, match=r"configs/c.toml stages\[1\]\.cases\[0\]\.args\.dynamic-schedule = "
                                           r".*stage 'tune_x' does not exist"):
        cases_config(cost_model, bad)
    later = {"name": "after", "tool": "tune", "args": {"profile": "x", "acceptance": 0.5}}
    stages = [{"name": "sweep", "tool": "sweep", "cases": [{"name": "a", "args": {
        "dynamic-schedule": "@{stage:after}/schedule.txt"}}]}, later]
    with pytest.raises(DynspecError, match="stage 'after' comes later"):
        parse_config({"figures": "adaptive", "budget_s": 9, "engine": {"pair": "tiny", "device": "cpu"},
                      "stages": stages}, "c", "c.toml")
    # a later stage reads a case's output by the case's name
    stages = [{"name": "sweep", "tool": "sweep", "cases": [{"name": "a", "args": {}}]},
              {"name": "sweep_x", "tool": "sweep", "args": {"dynamic-schedule": "@{stage:sweep_a}.json"}}]
    cfg = parse_config({"figures": "adaptive", "budget_s": 9, "engine": {"pair": "tiny", "device": "cpu"},
                        "stages": stages}, "c", "c.toml")
    assert stage_commands(cfg, None, Path("/r"))[1].argv[-3] == "@/r/sweep_a.json"


def test_an_adaptive_case_needs_the_engines_cost_model():
    stages = [{"name": "sweep", "tool": "sweep", "args": {"modes": "baseline"},
               "cases": [{"name": "a", "args": {}}, {"name": "b", "args": {"modes": "baseline,adaptive"}}]}]
    cfg = parse_config({"figures": "adaptive", "budget_s": 9, "engine": {"pair": "random"}, "stages": stages}, "c")
    assert suite_spec.needs_cost_model(cfg.stages) == ["sweep"]
    assert suite_spec.needs_cost_model(parse_config({"figures": "adaptive", "budget_s": 9, "stages": [
        {**stages[0], "cases": [{"name": "a", "args": {}}]}]}, "c").stages) == []


@pytest.mark.parametrize("cases,msg", [
    ([{"name": "a", "args": {}}, {"name": "b", "args": {"max-seq-len": 64}}],
     "stages[1].cases[1] (b): max-seq-len = 64 differs from case 'a''s 40; the cases share one engine"),
    ([{"name": "a", "args": {"tp": 2}}, {"name": "b", "args": {}}],
     "stages[1].cases[1] (b): tp = None differs from case 'a''s 2"),
    ([{"name": "a", "args": {}, "repeat": 2}], "stages[1].cases[0]: unknown field(s) ['repeat'] (a case has name and args)"),
    ([{"name": "a", "args": {}}, {"name": "a", "args": {"trials": 1}}], "stages[1].cases[1]: case name 'a' repeats"),
    ([{"name": "p-15", "args": {}}], "stages[1].cases[0]: name 'p-15' is not an identifier"),
    ([{"name": "1x", "args": {}}], "name '1x' is not an identifier"),
    ([{"args": {}}], "name None is not an identifier"),
    ([{"name": "a", "args": {"out": "x"}}], "stages[1].cases[0].args: 'out' is set by the suite"),
    ([{"name": "a", "args": {"modes": ["baseline"]}}], "a flag value must be a string, number or boolean"),
    ([], "cases must be [[stages.cases]] tables, at least one"),
])
def test_bad_cases_are_refused_naming_the_case_and_field(cost_model, cases, msg):
    with pytest.raises(DynspecError) as e:
        cases_config(cost_model, cases)
    assert msg in str(e.value) and str(e.value).startswith("configs/c.toml")


def test_cases_belong_to_a_sweep_stage_of_repeat_one():
    for stage, got in (({"name": "p", "tool": "profile"}, "tool 'profile', repeat 1"),
                       ({"name": "sweep", "tool": "sweep", "repeat": 2}, "tool 'sweep', repeat 2")):
        with pytest.raises(DynspecError, match=r"c.toml stages\[0\]: cases are for a sweep stage of repeat 1 \(got "
                                               + got.replace("(", r"\(")):
            parse_config({"figures": "adaptive", "budget_s": 9, "stages": [
                {**stage, "cases": [{"name": "a", "args": {}}]}]}, "c", "c.toml")


def test_a_case_cannot_unset_a_stage_flag(cost_model):
    with pytest.raises(DynspecError, match=r"cases\[0\]\.args\.floor = false: a case cannot unset the stage's flag --floor"):
        cases_config(cost_model, [{"name": "a", "args": {"floor": False}}], common={"floor": True})


def test_the_figures_read_the_cases_outputs_not_the_stage_name(cost_model):
    stages = [{"name": "sweep", "tool": "sweep", "cases": [{"name": "a", "args": {}}]}]
    with pytest.raises(DynspecError, match=r"figures 'sweep' read stage\(s\) \['sweep'\]"):
        parse_config({"figures": "sweep", "budget_s": 9, "stages": stages}, "c", "c.toml")
    with pytest.raises(DynspecError, match=r"read stage\(s\) \['sweep or sweep_\*'\]"):
        parse_config({"figures": "adaptive", "budget_s": 9, "stages": [{**stages[0], "name": "grid"}]}, "c", "c.toml")
    with pytest.raises(DynspecError, match=r"stage names \['sweep_a', 'sweep', 'sweep_a'\] repeat"):
        parse_config({"figures": "adaptive", "budget_s": 9, "stages": [{"name": "sweep_a", "tool": "sweep"}, *stages]},
                     "c", "c.toml")


# ---- the sweep's side --------------------------------------------------------------------------
def _write_cases(path: Path, cases: list) -> str:
    path.write_text(json.dumps({"cases": cases}))
    return str(path)


@pytest.mark.parametrize("cases,msg", [
    ([{"name": "a", "args": []}, {"name": "b", "args": ["--max-seq-len", "64"]}],
     "case 'b': --max-seq-len 64 differs from case 'a''s 40; the cases share one engine, so --max-seq-len must be"
     " the same in every case"),
    ([{"name": "a", "args": ["--dtype", "float64"]}, {"name": "b", "args": []}],
     "case 'b': --dtype None differs from case 'a''s 'float64'"),
    ([{"name": "a", "args": ["--concurrency", "0"]}], "case 'a': --concurrency '0' needs positive integers"),
    ([{"name": "a", "args": ["--no-such-flag"]}], "case 'a' (--no-such-flag): unrecognized arguments: --no-such-flag"),
    ([{"name": "a", "args": ["--modes", "fast"]}], "case 'a': --modes 'fast': unknown mode(s) ['fast']"),
    ([{"name": "a", "args": []}, {"name": "a", "args": []}], "cases[1]: case name 'a' repeats"),
    ([{"name": "a.b", "args": []}], "cases[0]: name 'a.b' is not an identifier"),
    ([{"name": "a", "args": [], "x": 1}], "cases[0] must be an object with exactly the fields 'name' and 'args'"),
    ([{"name": "a", "args": "--trials 2"}], "cases[0] (a): args must be a list of strings"),
    ([], "field 'cases' must be a non-empty list"),
])
def test_the_sweep_refuses_bad_cases_before_opening_anything(tmp_path, capsys, cases, msg):
    f = _write_cases(tmp_path / "cases.json", cases)
    rc = sweep.main(["--max-seq-len", "40", "--concurrency", "1", "--cases", f, "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err, err
    assert "opened the reference engine" not in err and list(tmp_path.iterdir()) == [tmp_path / "cases.json"]


def test_cases_run_on_the_reference_engine_only(tmp_path, capsys):
    f = _write_cases(tmp_path / "cases.json", [{"name": "a", "args": []}])
    assert sweep.main(["--engine", "trtllm", "--engine-dir", str(tmp_path), "--cases", f, "--out", str(tmp_path / "s")]) == 2
    assert "cases share one reference engine; --engine trtllm runs alone" in capsys.readouterr().err


def test_graph_keys_are_each_cases_own_in_the_shared_engines_buckets(cost_model):
    """A case of C <= 2 on an engine of 8 rows gets the graphs of buckets 1, 2; C <= 8 all of 1, 2, 4, 8."""
    from dynspec.runtime.engines.reference.graph_keys import GraphKey, reachable_graphs
    from dynspec.runtime.policy import DraftSchedule

    class Spec:
        def __init__(self, b, schedules):
            self.max_batch_size, self.modes = b, tuple(schedules)
            self.schedules, self.draft_sync = tuple(schedules.items()), tuple((m, "off") for m in schedules)

    small = Spec(2, {"static:3": DraftSchedule.static(3, 2)})
    big = Spec(8, {"baseline": DraftSchedule()})
    keys = sweep_cases.graph_keys([small, big], 8, None)
    assert {(g.kind, g.bucket, g.k) for g in keys} == {("spec", 1, 3), ("spec", 2, 3), ("refresh", 1, 0),
                                                        ("refresh", 2, 0)} | {("decode", b, 0) for b in (1, 2, 4, 8)}
    # the small case alone: what its plain sweep (an engine of 2 rows) captures, not the decode
    # graphs of buckets 4 and 8 its schedule would reach on 8 rows
    assert set(sweep_cases.graph_keys([small], 8, None)) == set(reachable_graphs([DraftSchedule.static(3, 2)], 2, False))
    assert GraphKey("decode", 8) in reachable_graphs([DraftSchedule.static(3, 2)], 8, False)


# ---- end to end on CPU ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_suite_sweep_of_two_cases_opens_one_engine_and_each_case_is_its_plain_sweep(cost_model, tmp_path):
    """The suite runs the cases stage as one process: the engine is opened once (one log line), each
    case writes sweep_<case>.json/.md/.png, and the summary and manifest name both cases. Each case's
    rows are those of the plain sweep of its merged flags (run here, one process each), timing aside."""
    cfg = cases_config(cost_model, name="cases")
    final = run_config(cfg, tmp_path / "work", tmp_path / "out", "test")
    names = sorted(p.name for p in final.iterdir())
    assert names == ["logs", "manifest.json", "summary.json", "summary.md", "summary.png", "sweep.cases.json",
                     *[f"sweep_{c}.{e}" for c in "ab" for e in ("json", "md", "png")], "tune_09"]
    log = (final / "logs" / "sweep.log").read_text()
    assert log.count("opened the reference engine") == 1 and "for 2 sweeps" in log
    assert log.count("case a: sweep: 2 load points") == 1 and log.count("case b: sweep: 2 load points") == 1

    man = json.loads((final / "manifest.json").read_text())
    assert man["complete"] and [s["name"] for s in man["stages"]] == ["tune_09", "sweep"]
    assert [c["name"] for c in man["cases"]["sweep"]] == ["sweep_a", "sweep_b"]
    summary = json.loads((final / "summary.json").read_text())
    assert set(summary["values"]["sweeps"]) == {"sweep_a", "sweep_b"}
    assert {(r[0], r[2]) for r in summary["table"]["rows"]} == {("sweep_a", "1"), ("sweep_a", "2"), ("sweep_b", "1"),
                                                               ("sweep_b", "4")}
    md = (final / "summary.md").read_text()
    assert "  - case `sweep_a`: `--modes baseline,static:1,adaptive" in md and "  - case `sweep_b`: " in md
    assert (final / "summary.png").read_bytes()[:4] == b"\x89PNG"

    for c in "ab":
        doc = json.loads((final / f"sweep_{c}.json").read_text())
        env = doc["env"]
        assert env["complete"] and env["shared_engine"]["cases"] == ["a", "b"] and env["shared_engine"]["case"] == c
        assert env["shared_engine"]["max_batch_size"] == 4 and "--cases" in env["shared_engine"]["launch_command"]
        # the plain sweep of this case's merged flags (the tune stage's schedule now in the published dir)
        argv = [x.replace(str(tmp_path / "out" / ".cases.partial"), str(final)) for x in env["command"].split()[3:]]
        assert "--cases" not in argv
        plain = tmp_path / "plain" / c
        assert sweep.main([*argv[:-1], str(plain)]) == 0
        want = json.loads(plain.with_name(f"{c}.json").read_text())
        assert "shared_engine" not in want["env"] and want["env"]["max_batch_size"] == env["max_batch_size"]
        assert [untimed(r) for r in doc["rows"]] == [untimed(r) for r in want["rows"]]
        assert {r["mode"] for r in doc["rows"]} == set(sweep_modes.parse_modes(argv[argv.index("--modes") + 1]))
    a = json.loads((final / "sweep_a.json").read_text())
    assert {(r["mode"], r["concurrency"], r["num_requests"]) for r in a["rows"]} == {
        (m, c, 3) for m in ("baseline", "static:1", "adaptive") for c in (1, 2)}
    b = json.loads((final / "sweep_b.json").read_text())
    assert {(r["concurrency"], r["num_requests"], r["acceptance_model"]) for r in b["rows"]} == {
        (1, 2, "bernoulli:0.9"), (4, 4, "bernoulli:0.9")}
    assert b["env"]["schedules"]["dynamic"] == (final / "tune_09" / "schedule.txt").read_text().strip()


def test_the_acceptance_config_is_the_five_sweeps_it_replaces(tmp_path):
    cfg = load_config("acceptance")
    assert [s.name for s in cfg.stages] == ["tune_015", "tune_050", "tune_090", "tune_055", "sweep"]
    assert list(suite.figure_stages(cfg.stages))[4:] == [f"sweep_{c}" for c in ("p015", "p050", "p090", "mix", "shift")]
    (st,) = [s for s in stage_commands(cfg, tmp_path / "e", tmp_path / "r") if s.files]
    (path, text), = st.files
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "cost_model.json").write_text("{}")      # the engine's, installed by the cost_model config
    for t in ("015", "050", "090", "055"):                  # as the tune stages write them
        (tmp_path / "r" / f"tune_{t}").mkdir(parents=True)
        (tmp_path / "r" / f"tune_{t}" / "schedule.txt").write_text("24:3,179:1\n")
    Path(path).write_text(text)
    argv = list(st.argv[3:])
    runs = {r.name: r.args for r in sweep_cases.case_runs(sweep.make_parser().parse_args(argv), argv)}
    statics = ",".join(f"static:{k}" for k in range(1, 6))
    want = {"p015": ("baseline,dynamic,adaptive", "bernoulli:0.15", "1,16,64,256", 2.0, 2, "015"),
            "p050": (f"baseline,{statics},dynamic,adaptive", "bernoulli:0.5", "1,16,64", 1.0, 4, "050"),
            "p090": (f"baseline,{statics},dynamic,adaptive", "bernoulli:0.9", "1,16,64", 1.0, 4, "090"),
            "mix": ("baseline,dynamic,adaptive", "bernoulli-mix:0.9@0.5,0.2@0.5", "1,16,64", 2.0, 4, "055"),
            "shift": ("baseline,dynamic,adaptive", "shift:0.8,0.2@0.5", "1,16,64", 2.0, 4, "050")}
    for name, (modes, acc, conc, waves, least, tune) in want.items():
        a = runs[name]
        assert (a.modes, a.acceptance, a.concurrency, a.waves, a.min_requests) == (modes, acc, conc, waves, least)
        assert a.dynamic_schedule == f"@{tmp_path}/r/tune_{tune}/schedule.txt"
        # 416 + 2 x (K 5 + 1) <= 432: the serving loop's slack (the overlapped loop on CUDA)
        assert (a.input_len, a.output_len, a.max_seq_len, a.warmup_requests, a.trials) == ("64:192", "32:224", 432, 2, 3)
        assert a.out == f"{tmp_path}/r/sweep_{name}" and a.cost_model is None      # the engine's cost model
    tunes = {s.name: dict(s.args) for s in cfg.stages if s.tool == "tune"}
    assert {n: a["acceptance"] for n, a in tunes.items()} == {"tune_015": 0.15, "tune_050": 0.5, "tune_090": 0.9,
                                                              "tune_055": 0.55}
    assert all((a["profile"], a["context"], a["draft-margin"]) == ("{cost_model}", 256, 1.01) for a in tunes.values())
    assert suite_spec.needs_cost_model(cfg.stages) == ["tune_015", "tune_050", "tune_090", "tune_055", "sweep"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cases_under_tensor_parallelism_share_one_engine_of_two_ranks(tmp_path):
    """mpirun -n 2 --tp 2: both ranks open one engine for both cases; the leader drives each case
    in turn and writes its outputs."""
    import subprocess
    import sys

    from tests.helpers_models import make_tiny_draft, make_tiny_target
    from tests.helpers_mpi import ONE_THREAD, mpirun

    target = make_tiny_target(tmp_path / "target", heads=4, kv_heads=2, vocab=161, layers=4)
    draft = make_tiny_draft(tmp_path / "draft", target, kv_heads=2, embed=True)
    f = _write_cases(tmp_path / "cases.json", [
        {"name": "a", "args": ["--modes", "baseline,dynamic", "--concurrency", "1,3", "--acceptance", "bernoulli:0.5"]},
        {"name": "b", "args": ["--modes", "static:2", "--concurrency", "2", "--acceptance", "bernoulli:0.9"]}])
    cmd = [mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", "2", *ONE_THREAD, sys.executable, "-m",
           "dynspec.benchmarks.sweep", "--tp", "2", "--target", str(target), "--draft", str(draft), "--schedule", "2:4",
           "--input-len", "4:8", "--output-len", "6", "--num-requests", "3", "--trials", "1", "--warmup-requests", "1",
           "--no-progress", "--cases", f, "--out", str(tmp_path / "res" / "tp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "res").iterdir()) == [f"tp_{c}.{e}" for c in "ab" for e in ("json", "md", "png")]
    assert proc.stderr.count("opened the reference engine") == 1            # rank 0 logs; one open
    a, b = (json.loads((tmp_path / "res" / f"tp_{c}.json").read_text()) for c in "ab")
    for doc in (a, b):
        assert doc["env"]["complete"] and (doc["env"]["world_size"], doc["env"]["replicas"], doc["env"]["tp"]) == (2, 1, 2)
        assert doc["env"]["allreduce"] and doc["env"]["shared_engine"]["max_batch_size"] == 3
    rows = {(r["mode"], r["concurrency"]): r for r in a["rows"]}
    assert set(rows) == {(m, c) for m in ("baseline", "dynamic") for c in (1, 3)}
    assert all(r["num_requests"] == 3 and r["output_tokens"] == 18 for r in rows.values())
    assert rows[("dynamic", 1)]["mean_k"] == 4 and rows[("baseline", 3)]["mean_k"] == 0
    (row,) = b["rows"]
    assert (row["mode"], row["concurrency"], row["mean_k"], row["acceptance_model"]) == ("static:2", 2, 2, "bernoulli:0.9")


def test_a_case_the_engine_cannot_hold_is_named(tmp_path, capsys):
    """A case's concurrency beyond the engine dir's batch limit: refused at resolve, naming the case."""
    from dynspec.runtime.generate.session import tiny_pair_dirs

    assert sweep_cases.case_out("r/sweep.json", "p015") == "r/sweep_p015" == sweep_cases.case_out("r/sweep", "p015")
    f = _write_cases(tmp_path / "cases.json", [{"name": "a", "args": []},
                                               {"name": "big", "args": ["--input-len", "9000"]}])
    target, draft = tiny_pair_dirs()
    rc = sweep.main(["--target", str(target), "--draft", str(draft), "--concurrency", "1", "--cases", f,
                     "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert rc == 2 and "case 'big': --input-len+--output-len" in err, err
    assert "opened the reference engine" not in err
