"""The reference engine's structure: its state typed and passed down (no module but engine.py
reads the engine), one capture sequence for serving and the GPU tests, one import style, and a
StepPlan's path through launch that seldom turns back to a module it has left."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "runtime" / "engines" / "reference"
ENGINE_NAMES = {"e", "eng", "engine", "_engine"}     # what a parameter or attribute holding the engine is called


def _modules() -> list[Path]:
    return sorted(p for p in REFERENCE.glob("*.py") if p.name != "__init__.py")


def engine_reads(source: str) -> list[tuple[int, str]]:
    """(line, `name.attr`) of every attribute read off the engine in `source`: `x.attr` loaded where
    x is a function parameter named in ENGINE_NAMES or annotated ReferenceEngine, or `self.x` with
    x in ENGINE_NAMES (an engine kept on an object).
    Example: `def f(e, plan): return e.slot[:2]` -> [(1, "e.slot")]; `def f(s): return s.slot` -> []."""
    tree = ast.parse(source)
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        a = fn.args
        params = {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs
                  if p.arg in ENGINE_NAMES or "ReferenceEngine" in ast.unparse(p.annotation or ast.Constant(""))}
        for node in ast.walk(fn):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            v = node.value
            if isinstance(v, ast.Name) and v.id in params:
                out.append((node.lineno, f"{v.id}.{node.attr}"))
            elif (isinstance(v, ast.Attribute) and v.attr in ENGINE_NAMES and isinstance(v.value, ast.Name)
                  and v.value.id == "self"):
                out.append((node.lineno, f"self.{v.attr}.{node.attr}"))
    return sorted(set(out))


def test_the_engine_reads_are_found():
    src = ("def f(e, plan):\n    return e.slot[:2]\n"
           "class W:\n    def run(self):\n        return self.e.pos\n"
           "def g(s, engine: 'ReferenceEngine'):\n    engine.on_dispatch = None\n    return s.slot\n")
    assert engine_reads(src) == [(2, "e.slot"), (5, "self.e.pos")]


def test_no_module_but_the_engine_reads_the_engine():
    """Every module takes what it uses (step_state.StepParts, buffers, heads, slots, attention)."""
    found = {p.name: engine_reads(p.read_text()) for p in _modules() if p.name != "engine.py"}
    assert {name: reads for name, reads in found.items() if reads} == {}


def test_one_import_style():
    """Absolute imports only inside runtime/engines/reference (module level and in functions)."""
    relative = [(p.name, n.lineno) for p in _modules() for n in ast.walk(ast.parse(p.read_text()))
                if isinstance(n, ast.ImportFrom) and n.level]
    assert relative == []


def test_attention_and_ragged_do_not_import_each_other():
    tree = ast.parse((REFERENCE / "attention.py").read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m and m.endswith("ragged") for m in names)


def _calls(path: Path) -> set[str]:
    """Names called in a file: `f(...)` -> f, `x.f(...)` -> .f."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.id if isinstance(f, ast.Name) else f".{f.attr}" if isinstance(f, ast.Attribute) else "")
    return out


def _imports_capture(path: Path) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == "dynspec.runtime.generate.session"
               and any(a.name == "capture" for a in n.names) for n in ast.walk(ast.parse(path.read_text())))


def test_serving_and_the_gpu_tests_share_one_capture_sequence():
    """session.capture is the one sequence: serving calls it (open_executor), and so do the GPU
    tests, the CPU tests that capture, the TP ranks and the sweep; no other sequence exists."""
    from dynspec.runtime.engines.reference.engine import ReferenceEngine

    serving = ROOT / "runtime" / "generate" / "session.py"
    assert "capture" in _calls(serving)
    for path in ("tests/test_gpu.py", "tests/helpers_paged.py", "tests/test_target_only.py", "tests/test_inflight.py",
                 "tests/mpi/tp_run.py"):
        p = ROOT / path
        assert _imports_capture(p) and "capture" in _calls(p), path
        assert ".capture_graphs" not in _calls(p), path
    assert not hasattr(ReferenceEngine, "capture_graphs")
    capture_src = (REFERENCE / "capture.py").read_text()
    assert "def capture_graphs" not in capture_src


def test_the_capture_sequence_runs_warm_mixed_after_the_whole_graphs():
    """On CUDA capture_whole_graphs ends with warm_mixed, so session.capture runs it (an engine
    stub: the order of its calls)."""
    src = (REFERENCE / "engine.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "capture_whole_graphs")
    calls = [n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert "warm_mixed" in calls and calls.index("warm_mixed") > calls.index("capture_whole_graphs")


def module_path(events: list[str]) -> tuple[list[str], int]:
    """The modules a traced step stops in, consecutive repeats joined, and how many of those stops
    return to a module it had left. Example: [engine, slot_state, engine, draft_chain, engine] ->
    (the same list, 2): engine twice returned to."""
    path = [m for i, m in enumerate(events) if i == 0 or events[i - 1] != m]
    seen, back = set(), 0
    for m in path:
        back += m in seen
        seen.add(m)
    return path, back


def test_module_path_counts_returns():
    assert module_path(["engine", "engine", "slot_state", "engine", "draft_chain", "engine"]) == (
        ["engine", "slot_state", "engine", "draft_chain", "engine"], 2)


ORCHESTRATION = {"engine", "carry", "draft_chain", "eager_mixed", "mixed_graphs", "capture", "slot_state",
                 "step_state", "graph_keys"}     # the step's own modules (the models and kernels below them not)


def test_a_step_plan_through_launch(capsys):
    """One speculative StepPlan (2 rows at K=2) through ReferenceEngine.launch on CPU, traced call by
    call (sys.setprofile) over the step's own modules: its path, printed, returns to a module
    it has left at most 5 times."""
    import torch

    from dynspec.runtime.policy.acceptance import Greedy
    from dynspec.runtime.engines.reference.load import load_reference_engine
    from dynspec.runtime.serving.plan import make_plan
    from dynspec.runtime.generate.session import tiny_pair_dirs

    eng = load_reference_engine(*tiny_pair_dirs(), dtype="float32", max_batch_size=2, max_seq_len=64, max_draft_len=2)
    slots = [eng.reserve(16, key=i) for i in range(2)]
    plan = make_plan(2, positions=[3, 5], pending=[1, 2], stale=[True, False], keep_warm=False, buckets=eng.buckets,
                     slots=slots)
    events: list[str] = []

    def hook(frame, event, arg):
        f = frame.f_code.co_filename
        if event == "call" and "/engines/reference/" in f and Path(f).stem in ORCHESTRATION:
            events.append(Path(f).stem)

    sys.setprofile(hook)
    try:
        handle = eng.launch(plan, Greedy())
    finally:
        sys.setprofile(None)
    assert len(eng.result(handle).accepted) == 2
    path, back = module_path(events)
    print("launch:", " -> ".join(path), f"({back} returns)")
    assert path[0] == "engine" and back <= 5, path
    assert torch.is_tensor(eng.next_draft)
