"""The fenced ```bash commands of README.md and the docs that show commands: every `dynspec`
command parses with the real CLI parser, every `python -m` module exists, every `mpirun` runs as
root (and, on the CPU lines, on fewer cores than ranks), and the cheap CPU commands run and print
what the README says they print.

A block's lines after a comment that starts with `# needs` (8 GPUs, an H200, genai-perf, ...) are
device-only: they are parsed and checked, never run. Example block:
    dynspec profile ... --out profile.json          <- CPU: parsed, checked, may run
    # needs one H200 (not runnable on the dev machines):
    python -m dynspec.benchmarks.suite decode_floor <- device-only: module checked, not run
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynspec.cli import make_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/serving_with_triton.md", "docs/tensor_parallel.md")
SUITE = "dynspec.benchmarks.suite"      # the benchmark suite's module (docs/benchmarks.md)


@dataclass(frozen=True)
class Command:
    page: str
    text: str          # one command, continuation lines joined, comments kept
    cpu: bool          # False: after a `# needs` comment in its block

    @property
    def argv(self) -> list[str]:
        """The words of the command's first part (up to `;`, `&`, `|`), without its comment and
        env assignments: `A=1 dynspec x --y 2 &  # z` -> ["dynspec", "x", "--y", "2"]."""
        lex = shlex.shlex(self.text, posix=True, punctuation_chars=";&|")
        lex.whitespace_split, lex.commenters = True, "#"
        words = []
        for word in lex:
            if set(word) <= set(";&|"):
                break
            words.append(word)
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        return words

    @property
    def comment(self) -> str:
        """The trailing comment, e.g. `1.2.x: {"1": 4, ...}` (shlex-free: the quotes are JSON's)."""
        m = re.search(r"\s#\s(.*)$", self.text)
        return m.group(1) if m else ""


def page_commands(page: str) -> list[Command]:
    text = (ROOT / page).read_text()
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        cpu, pending = True, ""
        for line in block.splitlines():
            if line.startswith("# needs"):
                cpu = False
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            pending += line
            if line.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            out.append(Command(page, " ".join(pending.split()), cpu))
            pending = ""
        assert not pending, f"{page}: a continuation line ends its block: {pending!r}"
    return out


COMMANDS = [c for page in PAGES for c in page_commands(page)]


def dynspec_argv(cmd: Command) -> list[str] | None:
    """The `dynspec ...` words of a command (after an mpirun prefix), or None."""
    argv = cmd.argv
    if "dynspec" in argv and argv[0] in ("dynspec", "mpirun"):
        return argv[argv.index("dynspec") + 1:]
    return None


def test_the_pages_show_commands_and_mark_device_only_ones():
    pages = {c.page for c in COMMANDS}
    assert pages == set(PAGES)
    readme = [c for c in COMMANDS if c.page == "README.md"]
    start = [c.argv for c in readme if c.cpu]
    assert ["pip", "install", "-e", ".[dev]"] in start and ["python", "-m", "pytest", "-q", "tests"] in start
    device = [c for c in readme if not c.cpu]
    assert any("trtllm" in c.text for c in device) and any(SUITE in c.text for c in device)


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if dynspec_argv(c) is not None],
                         ids=lambda c: f"{c.page}:{' '.join(dynspec_argv(c)[:2])}")
def test_every_dynspec_command_parses(cmd, capsys):
    try:
        make_parser().parse_args(dynspec_argv(cmd))
    except SystemExit:
        pytest.fail(f"{cmd.page}: `{cmd.text}` does not parse: {capsys.readouterr().err.strip()}")


MODULES = sorted({(c.page, c.argv[c.argv.index("-m") + 1]) for c in COMMANDS
                  if "-m" in c.argv and c.argv[c.argv.index("-m") + 1].startswith("dynspec")})


@pytest.mark.parametrize("page, module", MODULES)
def test_every_python_module_exists(page, module):
    if module == SUITE:
        pytest.importorskip(SUITE, reason="the benchmark suite module is not in this tree")
    assert importlib.util.find_spec(module) is not None, f"{page}: no module {module}"


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c.argv and c.argv[0] == "mpirun"],
                         ids=lambda c: f"{c.page}:{' '.join(c.argv[1:3])}")
def test_every_mpirun_runs_as_root_and_cpu_ones_on_few_cores(cmd):
    assert "--allow-run-as-root" in cmd.argv, f"{cmd.page}: `{cmd.text}` refuses root"
    if cmd.cpu:
        assert "--oversubscribe" in cmd.argv, f"{cmd.page}: `{cmd.text}` needs as many cores as ranks"


def test_readme_schedule_commands_print_the_dialects_they_state(capsys):
    """`dynspec schedule ... --trtllm-version V    # 1.2.x: {...}` must print that draft_len_schedule."""
    from dynspec.cli import main

    shown = [c for c in COMMANDS if c.page == "README.md" and (dynspec_argv(c) or [])[:1] == ["schedule"]]
    assert len(shown) == 2
    for cmd in shown:
        stated = json.loads(cmd.comment.split(":", 1)[1])
        assert main(dynspec_argv(cmd)) == 0
        line = next(l for l in capsys.readouterr().out.splitlines() if "draft_len_schedule:" in l)
        assert json.loads(line.split("draft_len_schedule:", 1)[1]) == stated, cmd.text


def test_readme_profile_and_tune_run_on_cpu(tmp_path):
    """The README's CPU profile -> tune pair and its profile -> generate --modes ...,adaptive pair, run
    as written: a schedule that parses, and the adaptive mode on the profiled cost model."""
    from dynspec.runtime.policy import DraftSchedule

    shown = [c for c in COMMANDS if c.page == "README.md" and ((dynspec_argv(c) or [])[:1] in (["profile"], ["tune"])
                                                               or "--cost-model" in (dynspec_argv(c) or []))]
    assert [dynspec_argv(c)[0] for c in shown] == ["profile", "tune", "profile", "generate"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for cmd in shown:
        r = subprocess.run([sys.executable, "-m", "dynspec.cli", *dynspec_argv(cmd)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"`{cmd.text}`: {r.stderr[-2000:]}"
    spec = (tmp_path / "schedule.txt").read_text().strip()
    assert DraftSchedule.parse(spec).to_spec() == spec


def test_the_readme_fits_in_220_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 220


def test_the_readme_shows_the_main_jobs_verdict_for_its_default_loads():
    """The verdict line quoted under the main job has the form `dynspec generate` prints for its
    default loads, and the paragraph names those loads."""
    text = (ROOT / "README.md").read_text()
    quoted = re.findall(r"^```text\n(verdict: .*)\n```", text, re.M)
    assert len(quoted) == 1, "the README quotes the main job's verdict line once"
    loads = make_parser().parse_args(["generate"]).concurrency
    k = r"static K=4 (pays|does not pay) (and|but) dynamic (speculates|turns K off)"
    form = "; ".join(f"C={c} {k}" for c in loads) + f": K follows the mission at [0-{len(loads)}] of {len(loads)} loads"
    assert re.fullmatch(f"verdict: {form}", quoted[0]), quoted[0]
    intro = text.split("```text", 1)[0].rsplit("```", 1)[1]
    assert all(f"C={c}" in intro for c in loads) and "about 9 s" not in intro.lower()
