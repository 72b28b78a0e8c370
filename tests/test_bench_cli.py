"""The benchmark CLIs as a user meets them: a GPU-only command on a machine without CUDA exits 2
with one line naming --device (no torch traceback); the suite writes outside the checkout unless
--out-root asks for benchmarks/results, and a failed config leaves no *.incomplete inside the
checkout; help texts say what the tool does, in full; long runs take --no-progress."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

no_cuda = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")

# (tool, argv): every benchmark that takes --device, asked for a GPU
GPU_ROWS = [
    ("dynspec", ["profile", "--device", "cuda", "--no-progress", "--out", "{tmp}/profile.json"]),
    ("dynspec", ["sweep", "--device", "cuda", "--no-progress", "--out", "{tmp}/s"]),
    ("dynspec.benchmarks.sweep", ["--device", "cuda", "--concurrency", "1", "--no-progress", "--out", "{tmp}/s"]),
    ("dynspec.benchmarks.mixed_step", ["--device", "cuda:0", "--out", "{tmp}/mixed.json"]),
    ("dynspec.benchmarks.tp_decode", ["--device", "cuda", "--out", "{tmp}/tp1.json"]),
    ("dynspec.benchmarks.numerics", ["--device", "cuda"]),
]


def _main(tool: str):
    import importlib

    return importlib.import_module("dynspec.cli" if tool == "dynspec" else tool).main


@no_cuda
@pytest.mark.parametrize("tool, argv", GPU_ROWS, ids=[f"{t.split('.')[-1]}-{a[0]}" for t, a in GPU_ROWS])
def test_gpu_only_commands_refuse_on_cpu_in_one_line(tool, argv, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert _main(tool)(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0] and "no CUDA device" in err[0], err
    assert not any(tmp_path.iterdir())


@no_cuda
def test_tp_decode_refuses_as_a_process_too(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dynspec.benchmarks.tp_decode", "--device", "cuda", "--tp", "2",
                        "--out", str(tmp_path / "tp2.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--device cuda" in r.stderr, r.stderr


# ---- where the suite writes -----------------------------------------------------------------
def _failing(monkeypatch, suite):
    """A config whose stages fail at once (no subprocess), having written a log."""
    def run_stages(stages, budget_s, logs, bar=None, installed=None):
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "sweep.log").write_text("error: boom\n")
        return [], "stage 'sweep' failed with rc 2 (log: logs/sweep.log): error: boom"

    monkeypatch.setattr(suite, "run_stages", run_stages)


def test_the_default_out_root_lies_outside_the_checkout(tmp_path, monkeypatch):
    from dynspec.benchmarks import suite

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert suite.make_parser().parse_args(["cpu_tiny"]).out_root is None
    assert suite.default_out_root() == tmp_path / "cache" / "dynspec" / "results"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert not suite.inside(suite.default_out_root(), ROOT)


def test_a_failed_suite_writes_under_the_default_root_and_nothing_in_the_checkout(tmp_path, monkeypatch, capsys):
    from dynspec.benchmarks import suite

    before = sorted(p.name for p in (ROOT / "benchmarks" / "results").iterdir())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _failing(monkeypatch, suite)
    assert suite.main(["cpu_tiny", "--work", str(tmp_path / "work"), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: boom" in err[0]
    root = tmp_path / "cache" / "dynspec" / "results"
    assert sorted(p.name for p in root.iterdir()) == ["cpu_tiny.incomplete"]
    assert json.loads((root / "cpu_tiny.incomplete" / "manifest.json").read_text())["complete"] is False
    assert sorted(p.name for p in (ROOT / "benchmarks" / "results").iterdir()) == before


def test_a_failed_config_under_an_out_root_in_the_checkout_leaves_no_incomplete_there(tmp_path, monkeypatch):
    """--out-root benchmarks/results: a failure moves its partial outputs out of the checkout, to
    this user's private TMPDIR/dynspec-<uid>/incomplete (a stand-in checkout here, so the real one
    is never written)."""
    import tempfile

    from dynspec.benchmarks import suite
    from dynspec.benchmarks.suite_config import load_config
    from dynspec.errors import DynspecError

    checkout = tmp_path / "checkout"
    out = checkout / "benchmarks" / "results"
    (out / "cpu_tiny").mkdir(parents=True)
    (out / "cpu_tiny" / "summary.json").write_text('{"old": true}')
    monkeypatch.setattr(suite, "REPO", checkout)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    _failing(monkeypatch, suite)
    mine = tmp_path / "tmp" / f"dynspec-{os.getuid()}"
    with pytest.raises(DynspecError, match=rf"partial outputs in {mine}/incomplete/cpu_tiny\.incomplete$"):
        suite.run_config(load_config("cpu_tiny"), tmp_path / "work", out, "test")
    assert sorted(p.name for p in out.iterdir()) == ["cpu_tiny"]                  # no .incomplete, no .partial
    assert (out / "cpu_tiny" / "summary.json").read_text() == '{"old": true}'
    assert (mine / "incomplete" / "cpu_tiny.incomplete" / "logs" / "sweep.log").is_file()
    for d in (mine, mine / "incomplete"):                 # this user's alone
        assert d.stat().st_mode & 0o777 == 0o700 and d.stat().st_uid == os.getuid(), d


# ---- help and progress ----------------------------------------------------------------------
def test_help_texts_describe_the_tool_in_full(capsys):
    from dynspec.benchmarks import tp_summary, triton_soak

    soak = " ".join(triton_soak.make_parser().format_help().split())
    assert "and a final check that no process of the server group and no /dev/shm region of the launch is left." in soak
    assert "--no-progress" in soak and "(default: 10.0)" in soak
    tp = tp_summary.make_parser().format_help()
    assert "Issue" not in tp and "TP=2 against TP=1" in tp


def test_long_runs_take_no_progress():
    from dynspec.benchmarks import suite, triton_soak
    from dynspec.benchmarks.sweep_args import make_parser as sweep_parser
    from dynspec.cli import make_parser

    assert triton_soak.make_parser().parse_args(["--out", "x.json", "--no-progress"]).no_progress
    assert sweep_parser().parse_args(["--out", "x", "--no-progress"]).no_progress
    assert suite.make_parser().parse_args(["cpu_tiny", "--no-progress"]).no_progress
    assert make_parser().parse_args(["profile", "--out", "p.json", "--no-progress"]).no_progress


def test_the_soak_shows_its_progress(monkeypatch):
    """The bar follows the run's seconds and names the requests, failures and RSS so far."""
    from dynspec.benchmarks import triton_soak

    bar = triton_soak._bar(0.5)
    tally = triton_soak.Tally()
    tally.add("good_grpc")
    tally.add("good_http", "HTTP 500")
    triton_soak._show(bar, 12.4, tally, (12.4, 2048, 4096))
    assert bar.total == 30 and bar.n == 12
    assert bar.postfix == "2 requests, 1 failures, RSS 2+4 MiB"
    triton_soak._show(bar, 99.0, tally, (99.0, 2048, 4096))
    assert bar.n == 30
    bar.close()
