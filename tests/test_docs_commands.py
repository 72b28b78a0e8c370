"""Every command in the ```bash blocks of docs/*.md (design.md shows none), run or checked on a
CPU machine. Each command gets the treatment of the first CHECKS pattern its text matches, and every
command must match one, so a command added to a page needs a treatment here:

    run     run as pasted with bash, in page order, in one temporary folder per page (later
            commands use what earlier ones wrote): exit status 0.
    dry     long-running CPU work (the suite's cpu_tiny, minutes): run as pasted plus --dry-run.
    refuse  GPU-only, after a `# needs ...GPU/H200` comment: run as pasted here, where there is no
            GPU, it must exit 2 with one line on stderr (under mpirun each rank prints that same
            line; Open MPI's own banner is not counted). File writes are capped at 64 MiB.
    parse   long-running or needing what a CPU test machine lacks (a server that runs until
            stopped, a 10-minute soak, TP launches that take tens of seconds, a 663 MB pair,
            genai-perf): the words parse with the tool's own parser, and the scripts, files and
            endpoints it names exist. Serving itself is run by tests/test_triton_launcher.py and
            tests/test_triton_tp.py, the TP launches by tests/test_tp_cli.py.
    shell   environment set-up (export, a venv, apt-get, kill): `bash -n` only.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import resource
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_readme_commands import Command, page_commands

ROOT = Path(__file__).resolve().parents[1]
PAGES = tuple(sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name != "design.md"))
COMMANDS = [c for page in PAGES for c in page_commands(page)]

# (pattern on the command's text, treatment, why it is not simply run); first match wins
CHECKS = (
    (r"^TINY=\$\(python -c ", "run", ""),
    (r"^dynspec (convert|build|triton) ", "run", ""),
    (r"^DRY_RUN=1 \./triton_trtllm/launch_triton\.sh", "run", ""),
    (r"^dynspec generate --dtype float64 --out tp1\.jsonl$", "run", ""),
    (r"python -m dynspec\.triton_repo\.(server|launch) ", "parse", "a server runs until it is stopped"),
    (r"^curl ", "parse", "needs the server of its block"),
    (r"^\./triton_trtllm/launch_triton\.sh", "refuse", ""),
    (r"^python -m dynspec\.benchmarks\.suite cpu_tiny$", "dry", ""),
    (r"^python -m dynspec\.benchmarks\.suite ", "refuse", ""),
    (r"dynspec\.benchmarks\.tp_decode .*--device cuda", "refuse", ""),
    (r"^python -m dynspec\.benchmarks\.triton_soak ", "parse", "runs 10 minutes"),
    (r"^mpirun .* dynspec generate --tp 2 ", "parse", "tens of seconds; tests/test_tp_cli.py runs these launches"),
    (r"^cmp tp1\.jsonl ", "parse", "compares the outputs of the TP launches above"),
    (r"python tests/mpi/tp_argmax_cost\.py$", "parse", "gathers 128256-wide logits of 320 rows: tens of seconds"),
    (r"^python -c 'from tests\.helpers_models import", "parse", "writes a 663 MB random pair"),
    (r"python tests/mpi/tp_load_rss\.py (whole|sharded) ", "parse", "loads the 663 MB pair"),
    (r"benchmarks/scripts/genai_perf\.sh$", "parse", "needs genai-perf and perf_analyzer"),
    (r"^python -m pytest tests/", "parse", "the Triton tests take minutes"),
    (r"^(export |python3 -m venv |/opt/genai-perf/bin/pip |apt-get |kill %1)", "shell", ""),
    (r"^genai-perf profile ", "shell", ""),                   # genai-perf is not in the dev extra
)


def treatment(cmd: Command) -> tuple[str, str]:
    for pattern, kind, why in CHECKS:
        if re.search(pattern, cmd.text):
            return kind, why
    raise AssertionError(f"{cmd.page}: no treatment for `{cmd.text}`; add one to CHECKS")


def of_kind(*kinds: str) -> list[Command]:
    return [c for c in COMMANDS if treatment(c)[0] in kinds]


def cid(cmd: Command) -> str:
    return f"{Path(cmd.page).stem}:{cmd.text[:60]}"


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_every_docs_command_has_a_treatment_and_device_ones_are_marked():
    assert {c.page for c in COMMANDS} == set(PAGES) and "docs/design.md" not in PAGES
    for cmd in COMMANDS:
        kind, _ = treatment(cmd)
        if kind == "refuse":
            assert not cmd.cpu, f"{cmd.page}: `{cmd.text}` is GPU-only but not under a `# needs` comment"
        if kind == "run":
            assert cmd.cpu, f"{cmd.page}: `{cmd.text}` runs here but sits under a `# needs` comment"


# ---- run: each page's CPU commands, as pasted, in order, in one folder ---------------------------
@pytest.fixture(scope="module")
def page_runs(tmp_path_factory):
    """{page: (folder, CompletedProcess)}: the page's `run` commands as one bash script, in order."""
    done = {}

    def run(page: str):
        if page not in done:
            folder = tmp_path_factory.mktemp(Path(page).stem)
            cmds = [c.text for c in COMMANDS if c.page == page and treatment(c)[0] == "run"]
            script = "set -e\n" + "".join(f"echo '>>> {i}' >&2\n{t}\n" for i, t in enumerate(cmds))
            proc = subprocess.run(["bash", "-c", script], cwd=folder, env=env(), capture_output=True, text=True,
                                  timeout=240)
            done[page] = (folder, cmds, proc)
        return done[page]
    return run


@pytest.mark.parametrize("page", sorted({c.page for c in of_kind("run")}))
def test_cpu_commands_run_as_pasted(page, page_runs):
    folder, cmds, proc = page_runs(page)
    failed = re.findall(r">>> (\d+)", proc.stderr)
    at = cmds[int(failed[-1])] if failed else "?"
    assert proc.returncode == 0, f"{page}: `{at}` exited {proc.returncode}: {proc.stderr[-1500:]}"
    if page == "docs/serving_with_triton.md":
        assert (folder / "tiny/triton/dynspec/config.pbtxt").is_file()
        assert (folder / "triton_ref/dynspec/1/model.py").is_file()
        assert "trtllm-llmapi-launch" in proc.stdout         # the dry run prints the launch command
    if page == "docs/tensor_parallel.md":
        rows = [json.loads(x) for x in (folder / "tp1.jsonl").read_text().splitlines()]
        from dynspec.cli import make_parser

        top = max(make_parser().parse_args(["generate"]).concurrency)     # --out: the highest load's prompts
        assert len(rows) == 3 * top and all(r["output_ids"] for r in rows)


@pytest.mark.parametrize("cmd", of_kind("dry"), ids=cid)
def test_long_cpu_commands_dry_run(cmd, tmp_path):
    proc = subprocess.run(["bash", "-c", cmd.text + " --dry-run"], cwd=tmp_path, env=env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"`{cmd.text} --dry-run`: {proc.stderr[-1500:]}"
    assert "dynspec" in proc.stdout


# ---- refuse: GPU-only commands on this machine ---------------------------------------------------
MPI_BANNER = re.compile(r"^-{20,}$.*?^-{20,}$", re.S | re.M)


def _capped() -> None:
    """In the child: a command that does not refuse cannot fill the disk (writes over 64 MiB fail)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 2**20, 64 * 2**20))


@pytest.mark.parametrize("cmd", of_kind("refuse"), ids=cid)
def test_gpu_only_commands_refuse_in_one_line(cmd, page_runs, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    folder = page_runs(cmd.page)[0] if any(c.page == cmd.page for c in of_kind("run")) else tmp_path
    home = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}   # where a non-refusal writes
    proc = subprocess.run(["bash", "-c", cmd.text], cwd=folder, env={**env(), **home}, capture_output=True,
                          text=True, timeout=120, preexec_fn=_capped)
    lines = {ln.strip() for ln in MPI_BANNER.sub("", proc.stderr).splitlines() if ln.strip()}
    assert proc.returncode == 2 and len(lines) == 1, \
        f"{cmd.page}: `{cmd.text}` exited {proc.returncode} with stderr:\n{proc.stderr[-2000:]}"


# ---- parse: commands that are not run here -------------------------------------------------------
def tool_argv(cmd: Command) -> tuple[str, list[str]]:
    """('dynspec', args), ('dynspec.X.Y', args) for python -m, ('script', [path, ...]) for python FILE,
    past env assignments and an mpirun prefix with its flags."""
    words = cmd.argv
    if words[:1] == ["mpirun"]:
        words = words[1:]
        while words and words[0] not in ("python", "dynspec"):
            words = words[2:] if words[0] in ("-n", "-x", "--bind-to") else words[1:]
    if words[:1] == ["dynspec"]:
        return "dynspec", words[1:]
    if words[:2] == ["python", "-m"]:
        return words[2], words[3:]
    return "script", words[1:]


@pytest.mark.parametrize("cmd", [c for c in of_kind("parse") if re.match(r"^(\S+=\S+ )*(mpirun .*)?(python|dynspec) ",
                                                                          c.text)], ids=cid)
def test_long_running_commands_parse(cmd, capsys):
    tool, argv = tool_argv(cmd)
    if tool == "pytest":
        missing = [a for a in argv if a.startswith("tests/") and not (ROOT / a).is_file()]
        assert not missing, f"{cmd.page}: `{cmd.text}` names missing test files {missing}"
        return
    if tool == "script":
        if argv[:1] == ["-c"]:              # python -c 'CODE': it compiles and its imports resolve
            code = argv[1]
            compile(code, "<doc>", "exec")
            module = re.match(r"from (\S+) import", code).group(1)
            assert importlib.util.find_spec(module) is not None, code
            names = re.findall(r"\b(make_tiny_\w+)\(", code)
            assert names and all(hasattr(importlib.import_module(module), n) for n in names), code
        else:
            assert (ROOT / argv[0]).is_file(), f"{cmd.page}: `{cmd.text}`: no file {argv[0]}"
        return
    parser = importlib.import_module("dynspec.cli" if tool == "dynspec" else tool).make_parser()
    try:
        parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{cmd.page}: `{cmd.text}` does not parse: {capsys.readouterr().err.strip()}")
    if cmd.argv[:1] == ["mpirun"]:
        assert "--allow-run-as-root" in cmd.argv, f"{cmd.page}: `{cmd.text}` refuses root"


@pytest.mark.parametrize("cmd", [c for c in of_kind("parse") if c.text.startswith("curl ")], ids=cid)
def test_curl_commands_name_an_endpoint_and_send_json(cmd):
    url = next(w for w in cmd.argv[1:] if w.startswith("localhost:"))
    assert re.fullmatch(r"localhost:\d+/(v2/models/\w+/generate(_stream)?|metrics)", url), cmd.text
    if "-d" in cmd.argv:
        body = json.loads(cmd.argv[cmd.argv.index("-d") + 1])
        assert isinstance(body, dict) and body, cmd.text


@pytest.mark.parametrize("cmd", [c for c in of_kind("parse") if "benchmarks/scripts/" in c.text], ids=cid)
def test_scripts_exist_and_are_valid_bash(cmd):
    script = next(w for w in cmd.argv if w.startswith("benchmarks/scripts/"))
    assert (ROOT / script).is_file() and os.access(ROOT / script, os.X_OK), script
    subprocess.run(["bash", "-n", str(ROOT / script)], check=True)


def test_cmp_compares_what_the_page_wrote():
    for cmd in (c for c in of_kind("parse") if c.text.startswith("cmp ")):
        outs = {w for c in COMMANDS if c.page == cmd.page for a, w in zip(c.argv, c.argv[1:]) if a == "--out"}
        named = {w for w in shlex.split(cmd.text) if w.endswith(".jsonl")}
        assert named and named <= outs, f"{cmd.page}: `{cmd.text}` compares files no command writes"


@pytest.mark.parametrize("cmd", of_kind("shell"), ids=cid)
def test_setup_lines_are_valid_shell(cmd):
    subprocess.run(["bash", "-n", "-c", cmd.text], check=True)


def test_python_is_this_interpreter():
    """The pasted `python` is the one on PATH; the runs above assume it is this test's."""
    out = subprocess.run(["bash", "-c", "python -c 'import sys; print(sys.prefix)'"], capture_output=True,
                         text=True, env=env())
    assert out.stdout.strip() == sys.prefix
