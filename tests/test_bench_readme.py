"""benchmarks/README.md as a user reads it: every command in its ```bash blocks parses with the
real parser of the tool it names (`dynspec ...` or `python -m dynspec.benchmarks.MODULE ...`, after
an `mpirun` / `trtllm-llmapi-launch` prefix), every mpirun runs as root, its config table names each
file of benchmarks/configs/ once, and the suite's dry run it shows runs. Lines after a `# needs`
comment are device-only: parsed, not run."""
from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from tests.test_readme_commands import page_commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"
PREFIXES = ("mpirun", "trtllm-llmapi-launch")


def commands() -> list[tuple[str, bool]]:
    """(command, cpu) of every ```bash block line, continuation lines joined; cpu False after `# needs`
    (the README test's reader, on this page)."""
    return [(c.text, c.cpu) for c in page_commands("benchmarks/README.md")]


def tool_argv(text: str) -> tuple[str, list[str]]:
    """('dynspec', args) or ('dynspec.benchmarks.M', args), past any mpirun / launcher prefix."""
    words = shlex.split(text, comments=True)
    while words and words[0] in PREFIXES:
        words = words[1:]
        if words and words[0] == "trtllm-llmapi-launch":
            continue
        while words and words[0] not in ("python", "dynspec", "trtllm-llmapi-launch"):   # mpirun's own flags
            words = words[2:] if words[0] in ("-n", "-x") else words[1:]
    if words[:1] == ["dynspec"]:
        return "dynspec", words[1:]
    assert words[:2] == ["python", "-m"], f"`{text}` runs neither dynspec nor python -m"
    return words[2], words[3:]


COMMANDS = commands()


def test_the_readme_shows_cpu_and_device_commands():
    assert any(cpu for _, cpu in COMMANDS) and any(not cpu for _, cpu in COMMANDS)
    assert "flex_decode" not in README.read_text()


@pytest.mark.parametrize("text", [t for t, _ in COMMANDS], ids=lambda t: " ".join(tool_argv(t)[1][:1]) or t[:30])
def test_every_command_parses_with_its_tools_parser(text, capsys):
    tool, argv = tool_argv(text)
    if tool == "dynspec":
        from dynspec.cli import make_parser
    else:
        assert tool.startswith("dynspec.benchmarks."), text
        make_parser = importlib.import_module(tool).make_parser
    try:
        make_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`{text}` does not parse: {capsys.readouterr().err.strip()}")
    if text.startswith("mpirun"):
        assert "--allow-run-as-root" in text.split(), f"`{text}` refuses root"


def test_the_config_table_names_every_config_once():
    table = README.read_text().split("| config | measures |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", table, re.M)
    shipped = sorted(p.stem for p in (ROOT / "benchmarks" / "configs").glob("*.toml"))
    assert sorted(rows) == shipped


def test_the_suite_dry_run_shown_runs(tmp_path, capsys):
    from dynspec.benchmarks import suite

    shown = [tool_argv(t)[1] for t, cpu in COMMANDS if cpu and "--dry-run" in t]
    assert shown
    for argv in shown:
        assert suite.main([*argv, "--work", str(tmp_path / "work")]) == 0
        out = capsys.readouterr().out
        assert "dynspec.benchmarks.sweep" in out and not (tmp_path / "work").exists()
