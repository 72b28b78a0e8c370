"""The shape of benchmarks/: along every import between its modules (module level, inside
functions, under TYPE_CHECKING: all of them, read with ast) the figures and reports never reach a
runner and runners never reach the suite; no module or function outgrows its size limit (no
import cycle anywhere: tests/test_layers.py). Static: nothing is imported or run."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
PACKAGE = "dynspec.benchmarks"
MAX_MODULE_LINES = 350
MAX_FUNCTION_LINES = 80

# the modules that open engines and measure (or drive the CLIs that do)
RUNNERS = {"sweep", "sweep_run", "sweep_loop", "profile", "mixed_step", "tp_decode", "trtllm_driver", "cli",
           "step_timing", "gemm_floor", "numerics", "triton_soak"}
# the modules that turn result JSON into figures, tables and plots
FIGURES = {"summary", "report", "suite_report", "tp_summary"} | {p.stem for p in BENCH.glob("figures_*.py")}
SUITE = {p.stem for p in BENCH.glob("suite*.py")}


def modules() -> dict[str, Path]:
    return {p.stem: p for p in sorted(BENCH.glob("*.py")) if p.stem != "__init__"}


def imported(path: Path, known: set[str]) -> set[str]:
    """The benchmarks modules `path` imports anywhere in its text: `import dynspec.benchmarks.x`,
    `from dynspec.benchmarks.x import y`, `from dynspec.benchmarks import x`."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith(PACKAGE + "."):
                head = name[len(PACKAGE) + 1:].split(".")[0]
                if head in known:
                    out.add(head)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imported(p, set(mods)) for m, p in mods.items()}


def reach(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in g[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_walker_sees_function_level_imports(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from dynspec.benchmarks import a\n\ndef f():\n    from dynspec.benchmarks.b import x\n"
                 "    import dynspec.benchmarks.c\n")
    assert imported(p, {"a", "b", "c", "d"}) == {"a", "b", "c"}


def test_figures_never_reach_a_runner_and_runners_never_reach_the_suite():
    g = graph()
    for m in sorted(FIGURES):
        assert not reach(g, m) & RUNNERS, f"{m} reaches runner(s) {sorted(reach(g, m) & RUNNERS)}"
    for m in sorted(RUNNERS):
        assert not reach(g, m) & SUITE, f"{m} reaches suite module(s) {sorted(reach(g, m) & SUITE)}"


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_and_function_sizes(name):
    path = modules()[name]
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: {len(text.splitlines())} lines"
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"
