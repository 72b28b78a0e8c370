"""Hostile benchmark-suite configs (benchmarks/suite.py, benchmarks/suite_checks.py): stage names
that leave the results dir, args that reach the suite's own flags through abbreviations or '=',
flags a tool does not have, and a config that fails after installing into the engine dir. Each is
refused naming the config file and the stage, or leaves nothing outside OUT_ROOT/NAME.incomplete;
a failed stage is reported with its log's last error line."""
import sys
from pathlib import Path

import pytest

from dynspec.benchmarks import suite
from dynspec.benchmarks.suite import run_config
from dynspec.benchmarks.suite_config import parse_config
from dynspec.benchmarks.suite_spec import Stage
from dynspec.benchmarks.suite_checks import check_inside, last_error_line
from dynspec.errors import DynspecError

SWEEP_ARGS = {"schedule": "2:3", "concurrency": "1", "num-requests": 2, "input-len": "16", "output-len": "8"}


def sweep_config(name: str = "sweep", args: dict | None = None, cases: list | None = None) -> dict:
    stage = {"name": name, "tool": "sweep", "args": dict(SWEEP_ARGS, **(args or {}))}
    if cases is not None:
        stage["cases"] = cases
    return {"figures": "sweep", "budget_s": 60, "engine": {"pair": "tiny", "device": "cpu"},
            "stages": [stage, {"name": "sweep2", "tool": "sweep", "args": SWEEP_ARGS}]}


def refusal(doc: dict) -> str:
    with pytest.raises(DynspecError) as e:
        parse_config(doc, "c", "configs/c.toml")
    msg = str(e.value)
    assert msg.startswith("configs/c.toml") and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("name", ["../victim", "a/b", "..", "sweep x", ".hidden", "/abs"])
def test_a_stage_name_that_is_not_plain_is_refused(name):
    assert f"stage name {name!r} is not a plain name" in refusal(sweep_config(name))


def test_a_victim_stage_writes_nothing_and_is_one_line(tmp_path, capsys):
    (tmp_path / "c.toml").write_text('figures = "sweep"\nbudget_s = 60\n[engine]\npair = "tiny"\ndevice = "cpu"\n'
                                     '[[stages]]\nname = "../victim"\ntool = "sweep"\n'
                                     '[[stages]]\nname = "sweep"\ntool = "sweep"\n')
    out = tmp_path / "out"
    assert suite.main([str(tmp_path / "c.toml"), "--out-root", str(out), "--work", str(tmp_path / "w"),
                       "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / "c.toml") in err[0] and "'../victim'" in err[0], err
    assert not out.exists() and not (tmp_path / "victim").exists()


@pytest.mark.parametrize("args, phrase", [
    ({"dtyp": "float64"}, "sweep has no flag --dtyp"),                      # a prefix of the suite's --dtype
    ({"devic": "cpu"}, "sweep has no flag --devic"),
    ({"device=cpu": True}, "key 'device=cpu' is not a flag name"),
    ({"--dtype": "float64"}, "key '--dtype' is not a flag name"),
    ({"concurency": "1,2"}, "sweep has no flag --concurency"),
    ({"help": True}, "'help' is set by the suite"),
    ({"engine-dir": "/x"}, "'engine-dir' is set by the suite"),
    ({"static-k": "two"}, "sweep refuses the stage's flags: argument --static-k: invalid int value: 'two'"),
    ({"modes": True}, "argument --modes: expected one argument"),
])
def test_stage_args_are_checked_against_the_tools_own_parser(args, phrase):
    msg = refusal(sweep_config(args=args))
    assert "stages[0]" in msg and phrase in msg, msg


def test_case_args_are_checked_too():
    doc = sweep_config(cases=[{"name": "a", "args": {"modes": "baseline"}},
                              {"name": "b", "args": {"dtyp": "float64"}}])
    msg = refusal(dict(doc, figures="adaptive"))
    assert "stages[0] (sweep).cases[1] (b).args" in msg and "sweep has no flag --dtyp" in msg, msg


@pytest.mark.parametrize("tool, args, phrase", [
    ("profile", {"draft-len": "0,1"}, "profile has no flag --draft-len"),
    ("profile", {"no-progres": True}, "profile has no flag --no-progres"),
    ("tune", {"profile": "p.json", "acceptance-fro": "x"}, "tune has no flag --acceptance-fro"),
    ("mixed_step", {"point": "1:0:8"}, "mixed_step has no flag --point"),
    ("mixed_step", {"graph": "full"}, "mixed_step has no flag --graph"),
])
def test_every_tool_checks_its_own_flags(tool, args, phrase):
    figures = {"profile": "decode_floor", "tune": "sweep", "mixed_step": "mixed_step"}[tool]
    name = {"profile": "floor", "tune": "tune", "mixed_step": "mixed"}[tool]
    stages = [{"name": name, "tool": tool, "args": args}]
    if tool == "tune":
        stages.append({"name": "sweep", "tool": "sweep", "args": SWEEP_ARGS})
    msg = refusal({"figures": figures, "budget_s": 60, "engine": {"pair": "tiny", "device": "cpu"}, "stages": stages})
    assert phrase in msg, msg


def test_outputs_must_resolve_inside_the_results_dir(tmp_path):
    res = tmp_path / "res"
    (res / "logs").mkdir(parents=True)
    check_inside([str(res / "sweep"), str(res / "logs" / "x.log")], res, "c.toml stage 'sweep'")
    (res / "link").symlink_to(tmp_path)
    for bad in (res / ".." / "victim", res / "link" / "victim"):
        with pytest.raises(DynspecError, match=r"c.toml stage 'sweep': output .* outside the results dir"):
            check_inside([str(bad)], res, "c.toml stage 'sweep'")


def test_the_last_error_line_of_a_log(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("$ python -m x\nstep 1\r 10%|#   | 1/10\r100%|####| 10/10\nTraceback (most recent call last):\n"
                   '  File "x.py", line 1\nValueError: the cache is too small\n\n')
    assert last_error_line(log) == "ValueError: the cache is too small"
    log.write_text("$ python -m x\nall fine so far\n")
    assert last_error_line(log) == "all fine so far"
    assert last_error_line(tmp_path / "absent.log") == ""


COST_CONFIG = {"figures": "cost_model", "budget_s": 60,
               "engine": {"pair": "random", "preset": "tiny", "device": "cpu", "tp": 1},
               "stages": [{"name": "profile", "tool": "profile", "install": "cost_model.json"},
                          {"name": "tune", "tool": "tune", "args": {"profile": "{cost_model}", "acceptance": 0.5}}]}


@pytest.mark.parametrize("before", ['{"old": true}', None])
def test_a_config_that_fails_puts_its_install_back(tmp_path, monkeypatch, before):
    """Stage 1 installs ENGINE_DIR/cost_model.json, stage 2 fails: the engine dir's file is what it
    was (or absent again), the out root holds only NAME.incomplete, and the error names the
    failing stage's last error line."""
    eng = tmp_path / "work" / "engine"
    eng.mkdir(parents=True)
    if before is not None:
        (eng / "cost_model.json").write_text(before)
    cfg = parse_config(COST_CONFIG, "c", "configs/c.toml")
    py = sys.executable

    def stages(cfg, engine_dir, results):
        out = results / "profile.json"
        return [Stage("profile", (py, "-c", f"open({str(out)!r}, 'w').write('{{\"new\": 1}}')"), str(out),
                      install=str(engine_dir / "cost_model.json")),
                Stage("tune", (py, "-c", "import sys; print('error: --profile holds no K=0 times'); sys.exit(2)"),
                      str(results / "tune"))]

    monkeypatch.setattr(suite, "prepare", lambda *a, **k: {"engine_dir": str(eng), "reused": True, "stages": []})
    monkeypatch.setattr(suite, "stage_commands", stages)
    with pytest.raises(DynspecError) as e:
        run_config(cfg, tmp_path / "work", tmp_path / "out", "test")
    assert "stage 'tune' failed with rc 2 (log: logs/tune.log): error: --profile holds no K=0 times" in str(e.value)
    assert "\n" not in str(e.value)
    if before is None:
        assert not (eng / "cost_model.json").exists()
    else:
        assert (eng / "cost_model.json").read_text() == before
    assert sorted(p.name for p in eng.iterdir()) == ([] if before is None else ["cost_model.json"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["c.incomplete"]
