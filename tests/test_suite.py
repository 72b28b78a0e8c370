"""benchmarks/suite.py: every shipped config's stage commands are accepted by the real parsers of
sweep / profile / mixed_step; a tiny config runs end to end on CPU (prepare, stages, report,
manifest); a failed config never replaces the results dir; the budget kills a stage in time."""
import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dynspec.benchmarks import suite, suite_commands, suite_provenance
from dynspec.benchmarks.suite import run_config, run_stages
from dynspec.benchmarks.suite_commands import stage_commands
from dynspec.benchmarks.suite_config import load_config, parse_config
from dynspec.benchmarks.suite_spec import CONFIG_DIR, GRAPHS, EngineSpec, Stage, StageSpec
from dynspec.errors import DynspecError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))
ONE_H200 = ("decode_floor", "mixed_step", "regime_b", "regime_a", "varied_vs_fixed")
COMMITTED_CPU = ("cpu_tiny", "cpu_per_request", "sim_ttft")
COMMITTED_H200 = ONE_H200 + ("cost_model", "acceptance", "long_context", "overlap", "overlap_regime_a")     # the adaptive configs' engine is their own
COMMITTED_H100 = ("serving", "serving_256", "per_request_bimodal", "serving_ttft", "per_request_serving",
                  "per_request_serving_64")
PREPARE_S = 200            # random 8B-shaped pair + convert + build on the H200, the upper end


def _parse(parse, argv: list[str]) -> argparse.Namespace:
    """Parse with the real parser; a refusal is an assertion naming the argv and the parser's error."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return parse(argv)
        except SystemExit:
            raise AssertionError(f"parser refused {argv}: {err.getvalue()}") from None


def _mixed_step_parse(argv: list[str], monkeypatch) -> argparse.Namespace:
    """mixed_step builds its parser inside main(): run main with its run() replaced by a recorder."""
    from dynspec.benchmarks import mixed_step

    seen = []
    monkeypatch.setattr(mixed_step, "run", lambda args, on_point=None: seen.append(args) or {})
    monkeypatch.setattr(mixed_step, "_write", lambda path, doc: None)
    assert mixed_step.main(argv) == 0
    return seen[0]


def parsed(stage: Stage, monkeypatch) -> argparse.Namespace:
    argv = list(stage.argv)
    if "mpirun" in Path(argv[0]).name:
        argv = argv[argv.index(sys.executable):]
    assert argv[0] == sys.executable and argv[1] == "-m"
    module, rest = argv[2], argv[3:]
    if module == "dynspec.benchmarks.sweep":
        from dynspec.benchmarks.sweep import make_parser

        return _parse(make_parser().parse_args, rest)
    if module == "dynspec.cli":
        from dynspec.cli import make_parser

        assert rest[0] in ("profile", "tune")
        return _parse(make_parser().parse_args, rest)
    if module == "dynspec.benchmarks.simulate":         # its own flags, the rest a sweep's (as main parses them)
        from dynspec.benchmarks.simulate import make_parser
        from dynspec.benchmarks.sweep import make_parser as sweep_parser

        ns, sweep_flags = make_parser().parse_known_args(rest)
        if sweep_flags:
            _parse(sweep_parser().parse_args, [*sweep_flags, "--out", "-"])
        return ns
    assert module == "dynspec.benchmarks.mixed_step"
    return _parse(lambda a: _mixed_step_parse(a, monkeypatch), rest)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_commands_are_accepted_by_the_real_parsers(name, tmp_path, monkeypatch):
    cfg = load_config(name)
    assert 0 < cfg.estimate_s <= cfg.budget_s <= 900, "a config runs in at most 15 minutes"
    eng = None if cfg.engine.pair == "tiny" else tmp_path / "engine"
    stages = stage_commands(cfg, eng, tmp_path / "res")
    assert stages
    for st in stages:
        args = parsed(st, monkeypatch)
        if st.argv[3:4] == ("tune",):                  # a folder: schedule.txt and tune.json
            assert (args.out, args.report) == (f"{st.out}/schedule.txt", f"{st.out}/tune.json")
            continue
        assert args.out == st.out and st.out.startswith(str(tmp_path / "res"))
        assert getattr(args, "device", cfg.engine.device) == cfg.engine.device   # the simulator runs no engine
        assert getattr(args, "engine_dir", None) == (None if eng is None else str(eng))
        if cfg.engine.graphs:
            assert st.argv[st.argv.index("--graphs") + 1] == cfg.engine.graphs
        for _, text in st.files:                      # a sweep's cases: each one's flags, by the sweep's parser
            from dynspec.benchmarks.sweep_cases import Case, parse_case

            for c in json.loads(text)["cases"]:
                run = parse_case(list(st.argv[3:]), Case(c["name"], tuple(c["args"])), args.out)
                assert run.args.out == f"{st.out}_{c['name']}" and run.args.device == cfg.engine.device
    lines = suite.dry_run(cfg, tmp_path / "work", tmp_path / "out")
    assert lines[0].startswith(f"# {name}:") and len([x for x in lines if not x.startswith("#")]) >= len(stages)


def test_regime_configs_keep_three_trials_and_the_published_loads(tmp_path, monkeypatch):
    for name, static_k, schedule in (("regime_a", 3, "84:3,124:2,256:1"), ("regime_b", 7, "24:3,179:1")):
        (st,) = stage_commands(load_config(name), tmp_path / "e", tmp_path / "r")
        a = parsed(st, monkeypatch)
        assert (a.trials, a.concurrency, a.modes) == (3, "1,4,16,64,256", "baseline,static,dynamic")
        assert (a.static_k, a.dynamic_schedule) == (static_k, schedule)
        assert ":" in a.input_len and ":" in a.output_len                    # varied lengths
    floors = stage_commands(load_config("decode_floor"), tmp_path / "e", tmp_path / "r")
    assert [s.name for s in floors] == ["floor1", "floor2", "floor3"]
    assert all(parsed(s, monkeypatch).floor for s in floors)


def test_one_h200_configs_fit_the_time_the_readme_gives():
    est = sum(load_config(n).estimate_s for n in ONE_H200)
    assert est + PREPARE_S <= 26 * 60, est


def test_configs_share_one_prepared_engine(tmp_path):
    keys = {load_config(n).engine.key() for n in ONE_H200 + ("overlap",)}
    assert len(keys) == 1
    cmds = suite_commands.prepare_commands(load_config("regime_a").engine, tmp_path)
    from dynspec.cli import make_parser

    for st in cmds[1:]:                                  # convert target, convert eagle3, build
        _parse(make_parser().parse_args, list(st.argv[3:]))
    assert "--reference-max-seq-len" in cmds[-1].argv


BAD = [({"figures": "nope", "budget_s": 1, "stages": [{"name": "s", "tool": "sweep"}]}, "figures 'nope' must be one of"),
       ({"figures": "sweep", "budget_s": 0, "stages": [{"name": "sweep", "tool": "sweep"}]}, "budget_s 0"),
       ({"figures": "sweep", "budget_s": 5, "stages": [{"name": "sweep", "tool": "bash"}]}, "needs a name and a tool"),
       ({"figures": "sweep", "budget_s": 5, "stages": [{"name": "x", "tool": "sweep"}]}, "read stage(s) ['sweep']"),
       ({"figures": "sweep", "budget_s": 5, "stages": [{"name": "sweep", "tool": "sweep", "args": {"out": "x"}}]},
        "'out' is set by the suite"),
       ({"figures": "sweep", "budget_s": 5, "engine": {"graphs": "piecewise"},
         "stages": [{"name": "sweep", "tool": "sweep"}]}, "graphs 'piecewise' must be one of"),
       ({"figures": "sweep", "budget_s": 5, "colour": 1, "stages": [{"name": "sweep", "tool": "sweep"}]},
        "unknown field(s) ['colour']")]


@pytest.mark.parametrize("doc,msg", BAD)
def test_bad_config_is_refused_naming_the_field(doc, msg):
    with pytest.raises(DynspecError) as e:
        parse_config(doc, "bad", "configs/bad.toml")
    assert msg in str(e.value) and str(e.value).startswith("configs/bad.toml")


def test_cli_names_an_unknown_config_in_one_line(capsys):
    assert suite.main(["no_such_config", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no config 'no_such_config' (known: " in err and "cpu_tiny" in err and err.count("\n") == 1


# ---- running ------------------------------------------------------------------------------------
def test_budget_kills_the_stage_that_runs_past_it(tmp_path):
    """The second stage sleeps 60 s (and leaves a child sleeping too); the 3-s budget kills its
    process group and names it; the third never starts."""
    py = sys.executable
    stages = [Stage("quick", (py, "-c", "print('hi')"), ""),
              Stage("slow", (py, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"), ""),
              Stage("never", (py, "-c", "print('no')"), "")]
    t0 = time.monotonic()
    done, why = run_stages(stages, 3.0, tmp_path / "logs")
    assert time.monotonic() - t0 < 20
    assert [r.name for r in done] == ["quick", "slow"] and done[0].rc == 0
    assert done[1].rc == 124 and done[1].timed_out and 2.5 < done[1].wall_s < 20
    assert why.startswith("budget 3 s ran out in stage 'slow'")
    assert (tmp_path / "logs" / "quick.log").read_text().splitlines()[-1] == "hi"
    assert not (tmp_path / "logs" / "never.log").exists()


def tiny_sweep_config(name: str, budget: int, concurrency: str = "1,2") -> object:
    return parse_config({
        "description": "tiny pair on CPU", "figures": "sweep", "budget_s": budget, "estimate_s": 1,
        "engine": {"pair": "tiny", "device": "cpu"},
        "stages": [{"name": "sweep", "tool": "sweep", "args": {
            "schedule": "2:3", "static-k": 3, "modes": "baseline,static,dynamic", "concurrency": concurrency,
            "acceptance": "real", "prompts": "stdlib", "input-len": "16:24", "output-len": "8:16",
            "num-requests": 2, "warmup-requests": 0, "trials": 2}}]}, name, "test")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_budget_that_runs_out_leaves_the_results_dir_as_it_was(tmp_path):
    out = tmp_path / "results"
    (out / "t").mkdir(parents=True)
    (out / "t" / "summary.json").write_text('{"old": true}')
    cfg = tiny_sweep_config("t", budget=2, concurrency="1,2,4,8,16,32")
    with pytest.raises(DynspecError, match=r"config t: budget 2 s ran out in stage 'sweep'"):
        run_config(cfg, tmp_path / "work", out, "test")
    assert json.loads((out / "t" / "summary.json").read_text()) == {"old": True}
    man = json.loads((out / "t.incomplete" / "manifest.json").read_text())
    assert man["complete"] is False and man["stages"][0]["rc"] == 124 and man["stages"][0]["timed_out"]
    assert sorted(p.name for p in out.iterdir()) == ["t", "t.incomplete"]          # no .partial left


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_failed_stage_is_named_and_publishes_nothing(tmp_path):
    cfg = tiny_sweep_config("f", budget=60)
    bad = StageSpec("sweep", "sweep", (("concurrency", "0"),))
    cfg = type(cfg)(**{**cfg.__dict__, "stages": (bad,)})
    with pytest.raises(DynspecError, match=r"stage 'sweep' failed with rc 2 \(log: logs/sweep.log\)"):
        run_config(cfg, tmp_path / "work", tmp_path / "out", "test")
    assert not (tmp_path / "out" / "f").exists()
    assert "--concurrency '0' needs positive integers" in (tmp_path / "out" / "f.incomplete" / "logs" / "sweep.log").read_text()


SMOKE = """
description = "CPU smoke: the random tiny-preset pair, prepared like the 8B one"
figures = "{figures}"
budget_s = 100
estimate_s = 20

[engine]
pair = "random"
preset = "tiny"
device = "cpu"
dtype = "float32"
tp = 1
max_seq_len = 1024
max_batch_size = 4
build_max_seq_len = 1024
prepare_budget_s = 100
{stages}
"""
FLOOR_STAGES = """
[[stages]]
name = "floor"
tool = "profile"
repeat = 2
[stages.args]
batch-sizes = "1"
draft-lens = "0"
context-lens = "64"
warmup = 1
repeats = 2
floor = true
"""
SWEEP_STAGES = """
[[stages]]
name = "sweep"
tool = "sweep"
[stages.args]
modes = "baseline,static,dynamic"
static-k = 2
dynamic-schedule = "1:2"
acceptance = "bernoulli:0.7"
input-len = "16:24"
output-len = "8:12"
max-seq-len = 64
concurrency = "1,2"
num-requests = 2
warmup-requests = 0
trials = 3
"""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_two_configs_end_to_end_on_cpu_share_one_prepared_engine(tmp_path):
    """Prepare once (random pair -> convert -> build), a floor config then a sweep config reusing
    the engine; each results dir replaces an older one whole and carries its manifest."""
    (tmp_path / "smoke_floor.toml").write_text(SMOKE.format(figures="decode_floor", stages=FLOOR_STAGES))
    (tmp_path / "smoke_sweep.toml").write_text(SMOKE.format(figures="sweep", stages=SWEEP_STAGES))
    out, work = tmp_path / "results", tmp_path / "work"
    (out / "smoke_sweep").mkdir(parents=True)
    (out / "smoke_sweep" / "stale.txt").write_text("from an older run")
    argv = [str(tmp_path / "smoke_floor.toml"), str(tmp_path / "smoke_sweep.toml"), "--work", str(work),
            "--out-root", str(out), "--no-progress"]
    assert suite.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["smoke_floor", "smoke_sweep"]
    assert not (out / "smoke_sweep" / "stale.txt").exists()

    floor = json.loads((out / "smoke_floor" / "summary.json").read_text())["values"]
    assert floor["ratio"]["n"] == 2 and floor["floor_ms"]["min"] > 0
    assert floor["ratio"]["min"] <= floor["ratio"]["median"] <= floor["ratio"]["max"]
    prof = json.loads((out / "smoke_floor" / "floor1.json").read_text())
    assert prof["floor"]["decode_ms"] in (floor["decode_ms"]["min"], floor["decode_ms"]["max"])

    fm = json.loads((out / "smoke_floor" / "manifest.json").read_text())
    sm = json.loads((out / "smoke_sweep" / "manifest.json").read_text())
    assert fm["prepare"]["reused"] is False and [s["name"] for s in fm["prepare"]["stages"]] == [
        "random-pair", "convert-target", "convert-draft", "build"]
    assert sm["prepare"]["reused"] is True and sm["prepare"]["engine_dir"] == fm["prepare"]["engine_dir"]
    for m in (fm, sm):
        for key in ("git_commit", "git_tree", "git_changed_paths", "torch", "python", "start", "end", "gpus"):
            assert key in m, key
        assert m["complete"] is True and m["command"] == "python -m dynspec.benchmarks.suite " + " ".join(argv)
        assert all(s["rc"] == 0 and s["wall_s"] > 0 for s in m["stages"])
    assert [s["name"] for s in fm["stages"]] == ["floor1", "floor2"]
    assert fm["git_commit"] == suite_provenance._out(["git", "rev-parse", "HEAD"])
    assert fm["git_worktree_tree"] == suite_provenance.worktree_tree()      # the files as they are, edits included

    sweep = json.loads((out / "smoke_sweep" / "summary.json").read_text())["values"]
    assert set(sweep["by_concurrency"]) == {"1", "2"}
    assert sweep["by_concurrency"]["1"]["dynamic_vs_best"]["n"] == 3
    for name in ("summary.md", "summary.png", "sweep.json", "sweep.md", "logs/sweep.log"):
        assert (out / "smoke_sweep" / name).is_file(), name
    assert (out / "smoke_sweep" / "summary.png").read_bytes()[:4] == b"\x89PNG"

    # the same work dir again: nothing to prepare; a changed engine spec prepares anew
    lines = suite.dry_run(load_config(str(tmp_path / "smoke_sweep.toml")), work, out)
    assert any(x.startswith("# prepare: reusing ") for x in lines)
    other = EngineSpec(pair="random", preset="tiny", device="cpu", dtype="float32", tp=1, max_seq_len=512)
    assert other.key() != load_config(str(tmp_path / "smoke_sweep.toml")).engine.key()


def test_committed_cpu_tiny_results_are_what_the_suite_computes_from_its_sweep():
    res = ROOT / "benchmarks" / "results" / "cpu_tiny"
    from dynspec.benchmarks.summary import suite_figures

    got = suite_figures("sweep", res, {"sweep": 1})
    want = json.loads((res / "summary.json").read_text())
    assert json.loads(json.dumps(got["values"])) == want["values"]
    man = json.loads((res / "manifest.json").read_text())
    assert man["complete"] is True and man["config"] == "cpu_tiny" and man["stages"][0]["rc"] == 0
    assert man["command"].split()[:4] == ["python", "-m", "dynspec.benchmarks.suite", "cpu_tiny"]
    assert set(want["values"]["by_concurrency"]) == {"1", "2", "4", "8", "16"}
    assert all(e["acceptance"]["static"]["acceptance_rate"] > 0 for e in want["values"]["by_concurrency"].values())
    assert sorted(p.name for p in (ROOT / "benchmarks" / "results").iterdir()) == sorted(COMMITTED_CPU + COMMITTED_H200 + COMMITTED_H100)
    assert len(list((ROOT / "benchmarks" / "scripts").iterdir())) <= 6
    assert os.path.getsize(res / "summary.png") > 1000


@pytest.mark.parametrize("name", COMMITTED_H200 + COMMITTED_H100 + COMMITTED_CPU[1:])
def test_committed_h200_results_are_what_the_suite_computes_from_their_stages(name):
    """Each committed results dir (the GPU's, and cpu_per_request): its summary is recomputed from
    its own stage outputs, and its manifest records a complete run of that config's suite command
    with every stage at rc 0."""
    from dynspec.benchmarks.summary import suite_figures

    res = ROOT / "benchmarks" / "results" / name
    man = json.loads((res / "manifest.json").read_text())
    assert man["complete"] is True and man["config"] == name and all(st["rc"] == 0 for st in man["stages"])
    assert "dynspec.benchmarks.suite" in man["command"] and name in man["command"].split()
    cfg = load_config(name)
    figures, repeats = cfg.figures, suite.figure_stages(cfg.stages)
    got = suite_figures(figures, res, repeats)
    want = json.loads((res / "summary.json").read_text())
    assert json.loads(json.dumps(got["values"])) == want["values"]


OVERLAP_STAGES = """
[[stages]]
name = "sweep"
tool = "sweep"
[stages.args]
acceptance = "bernoulli:0.7"
max-seq-len = 64
warmup-requests = 0
trials = 3
input-len = "16:24"
output-len = "8:12"
concurrency = "2"
num-requests = 2
[[stages.cases]]
name = "varied"
[stages.cases.args]
modes = "baseline,baseline+overlap"
[[stages.cases]]
name = "fixed"
[stages.cases.args]
modes = "baseline,baseline+overlap"
input-len = 20
output-len = 10
[[stages.cases]]
name = "regime_b"
[stages.cases.args]
modes = "baseline,static,dynamic,baseline+overlap,static+overlap,dynamic+overlap"
static-k = 2
dynamic-schedule = "1:2"
""" + FLOOR_STAGES


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_overlap_figures_pair_each_serial_figure_with_its_overlapped_twin_on_cpu(tmp_path):
    """The overlap config's shape on the tiny random pair: every figure has a serial and an
    overlapped value computed from that run's own rows and profiles."""
    (tmp_path / "smoke_overlap.toml").write_text(SMOKE.format(figures="overlap", stages=OVERLAP_STAGES))
    out = tmp_path / "results"
    argv = [str(tmp_path / "smoke_overlap.toml"), "--work", str(tmp_path / "work"), "--out-root", str(out),
            "--no-progress"]
    assert suite.main(argv) == 0
    res = out / "smoke_overlap"
    fig = json.loads((res / "summary.json").read_text())["values"]
    varied = {(r["mode"], r["concurrency"]): r for r in json.loads((res / "sweep_varied.json").read_text())["rows"]}
    fixed = {(r["mode"], r["concurrency"]): r for r in json.loads((res / "sweep_fixed.json").read_text())["rows"]}
    for loop, mode in (("serial", "baseline"), ("overlap", "baseline+overlap")):
        assert fig["idle"]["2"][loop] == varied[(mode, 2)]["engine_idle_fraction"]
        assert 0 <= fig["idle"]["2"][loop] < 1
        want = varied[(mode, 2)]["output_tok_per_s"] / fixed[(mode, 2)]["output_tok_per_s"]
        assert fig["varied_vs_fixed"]["2"][loop]["ratio"] == pytest.approx(want)
        assert fig["regime_b"]["2"][loop]["n"] == 3
    floors = [json.loads((res / f"floor{i}.json").read_text())["floor"] for i in (1, 2)]
    step = sorted(f["decode_ms"] / f["gemm_floor_ms"] for f in floors)
    assert fig["floor"]["step_vs_floor"]["serial"]["min"] == pytest.approx(step[0])
    over = sorted(f["decode_overlap_ms"] / f["gemm_floor_ms"] for f in floors)   # the CPU engine serves it too
    assert fig["floor"]["step_vs_floor"]["overlap"]["max"] == pytest.approx(over[1])
    table = (res / "summary.md").read_text()
    assert "baseline engine idle, varied lengths" in table and "b=1 decode step / GEMM floor" in table
    assert (res / "summary.png").read_bytes()[:4] == b"\x89PNG"
    for loop, mode in (("serial", "baseline"), ("overlap", "baseline+overlap")):   # the engine's own gaps
        assert fig["gaps"]["2"][loop]["gpu_gap_fraction"] == varied[(mode, 2)]["gpu_gap_fraction"]
        assert 0 <= fig["gaps"]["2"][loop]["gpu_gap_fraction"] < 1
    assert "device gaps between steps" in table


def test_worktree_tree_is_the_commits_tree_until_a_file_changes(tmp_path):
    """The tree of the files as run: HEAD's tree in a clean checkout, another once a file is
    edited or added (what a copy of a working tree with uncommitted changes runs)."""
    repo = tmp_path / "r"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (repo / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    old = suite_provenance.REPO
    suite_provenance.REPO = repo
    try:
        assert suite_provenance.worktree_tree() == git("rev-parse", "HEAD^{tree}")
        (repo / "b.txt").write_text("two\n")
        edited = suite_provenance.worktree_tree()
        assert edited not in (None, git("rev-parse", "HEAD^{tree}"))
        git("add", "b.txt")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "b")
        assert suite_provenance.worktree_tree() == edited == git("rev-parse", "HEAD^{tree}")
        assert git("status", "--porcelain") == ""          # the scratch index left the real one alone
    finally:
        suite_provenance.REPO = old


def test_the_serving_configs_run_the_sustained_load_through_the_serving_loop(tmp_path, monkeypatch):
    """Regime B's lengths and acceptance, six waves at C = 16 and 64 (serving) and 256 (serving_256,
    on the same engine), each profiling and installing the engine's cost model first (the same grid,
    lazy sync's catch-up too), Poisson at each C, the target alone, the tuned schedule and adaptive in
    the serving loop, 3 trials."""
    runs = [(stage_commands(load_config(name), tmp_path / "e", tmp_path / "r"), cs)
            for name, cs in (("serving", "16,64"), ("serving_256", "256"))]
    assert runs[0][0][0].argv == runs[1][0][0].argv
    for (profile, tune, sweep), cs in runs:
        assert profile.name == "profile" and str(profile.install).endswith("/e/cost_model.json")
        assert "--catch-up" in profile.argv
        a = parsed(sweep, monkeypatch)
        assert (a.concurrency, a.poisson_at, a.waves, a.trials) == (cs, cs, 6, 3)
        assert a.modes == "baseline,dynamic,adaptive"            # no suffix: the serving loop (overlapped on CUDA)
        assert (a.input_len, a.output_len, a.acceptance) == ("64:192", "32:224", "bernoulli:0.5")
        assert a.dynamic_schedule.endswith("tune_050/schedule.txt") and tune.name == "tune_050"
    assert load_config("serving").engine == load_config("serving_256").engine
