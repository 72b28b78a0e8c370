"""The executor's loops as strategies (runtime/serving/loop.py): SerialLoop, DeferredLoop and OverlappedLoop
each own step(), their cache slack and what they carry between iterations; the Executor plans
(Executor.plan) and folds (Executor.advance, Executor.fold) and reads no loop flag once it is
made. Oracles: the cache slack rule as written before the strategies, (K+1) x (2 if overlapped
else 1); the engine's call log; the executor's source, read with ast."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dynspec.errors import DynspecError
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.loop import DeferredLoop, Loop, OverlappedLoop, SerialLoop
from dynspec.runtime.serving.overlap import cache_slack
from dynspec.runtime.serving.plan import Engine, launches_async
from dynspec.runtime.serving.plan_channel import LeaderEngine
from dynspec.runtime.policy import DraftSchedule
from tests.test_loop import CallLog
from tests.test_workload import FakeEngine

RUNTIME = Path(__file__).resolve().parents[1] / "runtime" / "serving"
CASES = [(Loop.SERIAL, False, SerialLoop), (Loop.SERIAL, True, DeferredLoop),
         (Loop.OVERLAPPED, False, OverlappedLoop), (Loop.OVERLAPPED, True, OverlappedLoop)]


def executor(loop: Loop, async_launch: bool, **kw) -> tuple[Executor, CallLog]:
    eng = CallLog(async_launch)
    for name, value in kw.items():
        setattr(eng, name, value)
    return Executor(eng, DraftSchedule.static(2, 4), loop=loop), eng


@pytest.mark.parametrize("k", range(9))
def test_each_strategys_cache_slack_is_the_loops_slack_as_it_was(k):
    """K=4: serial 5, overlapped 10 (runtime/serving/overlap.py's docstring before the strategies)."""
    before = {loop: (k + 1) * (2 if loop is Loop.OVERLAPPED else 1) for loop in Loop}
    assert SerialLoop.cache_slack(k) == DeferredLoop.cache_slack(k) == before[Loop.SERIAL] == k + 1
    assert OverlappedLoop.cache_slack(k) == before[Loop.OVERLAPPED] == 2 * (k + 1)
    assert {loop: cache_slack(k, loop) for loop in Loop} == before


@pytest.mark.parametrize("loop,async_launch,kind", CASES)
def test_the_executor_makes_its_loops_strategy_once(loop, async_launch, kind):
    ex, eng = executor(loop, async_launch)
    assert type(ex.strategy) is kind and ex.strategy.kind is ex.loop is loop
    assert ex._step == ex.strategy.step and ex.strategy.async_launch is async_launch
    assert ex.strategy.slack == cache_slack(eng.max_draft_len, loop)


@pytest.mark.parametrize("loop", Loop)
def test_making_the_strategy_reads_no_engine_limit(loop):
    """Executor(None, ...) is made (tests/test_triton_soak.py): the slack reads the engine at submit."""
    assert Executor(None, DraftSchedule.static(2, 4), loop=loop).loop is loop


@pytest.mark.parametrize("loop,async_launch,kind", CASES)
def test_submit_admits_up_to_the_strategys_slack(loop, async_launch, kind):
    """max_seq_len 30, max_draft_len 4: a 1-token prompt takes 30 - 1 - slack new tokens, not one more."""
    ex, _ = executor(loop, async_launch, max_seq_len=30)
    most = 30 - 1 - kind.cache_slack(4)
    ex.submit([1], most)
    with pytest.raises(DynspecError, match=rf"\+{kind.cache_slack(4)} verify slack\) = 31 exceeds"):
        ex.submit([1], most + 1)


def test_async_launch_is_part_of_the_engine_protocol():
    assert Engine.__annotations__["async_launch"] == "bool"
    assert launches_async(CallLog(True)) and not launches_async(CallLog(False))
    assert not launches_async(FakeEngine())           # a stand-in whose launch runs the step declares False
    assert LeaderEngine(CallLog(True), channel=None).async_launch is True     # TP's leader: its local engine's


class Counted:
    """Counts the executor's plan / fold calls made by its strategy's step()."""

    def __init__(self, ex: Executor):
        self.plans = self.folds = 0
        plan, fold = ex.plan, ex.fold

        def counted_plan(*a, **kw):
            out = plan(*a, **kw)
            self.plans += out is not None
            return out

        def counted_fold(*a, **kw):
            self.folds += 1
            return fold(*a, **kw)

        ex.plan, ex.fold = counted_plan, counted_fold


@pytest.mark.parametrize("loop,async_launch,kind", CASES)
def test_the_strategy_steps_and_the_executor_plans_and_folds(loop, async_launch, kind):
    ex, eng = executor(loop, async_launch)
    n = Counted(ex)
    handles = [ex.submit([1, 2, 3], 5) for _ in range(2)]
    ex.run_until_idle()
    assert all(len(h.tokens()) == 5 for h in handles)
    assert n.plans == n.folds == len(eng.plans) == len(ex.stats) >= 3
    assert not ex.strategy.in_flight and ex._pending is None


@pytest.mark.parametrize("loop,async_launch,kind", CASES)
def test_what_each_loop_carries_from_one_step_to_the_next(loop, async_launch, kind):
    """Serial: nothing. Deferred: the step's estimate update, applied during the next one.
    Overlapped: the step launched, its result unread until the next step() (or a stop)."""
    ex, eng = executor(loop, async_launch)
    ex.submit([1, 2, 3], 8)
    first = ex.step()                                  # the prompt
    second = ex.step()                                 # a decode row at K=2
    calls = [c for c, _ in eng.calls]
    if kind is OverlappedLoop:
        assert first is None and second is not None and ex.strategy.in_flight
        assert calls == ["launch", "launch", "result"] and all(p.carry for p in eng.plans)
        ex.stop()                                      # reads and folds the step in flight
        calls = [c for c, _ in eng.calls]
        assert not ex.strategy.in_flight and calls.count("launch") == calls.count("result") == 2
        return
    assert first is not None and second is not None and not ex.strategy.in_flight
    assert not any(p.carry for p in eng.plans)
    assert calls == (["launch", "result"] * 2 if kind is DeferredLoop else ["step"] * 2)
    assert (ex._pending is not None) is (kind is DeferredLoop)    # the decode step's update, deferred
    ex.step()
    assert (ex._pending is not None) is (kind is DeferredLoop)


# ---- the executor's source: no loop flag read after construction ------------------------------------

FORMER_FLAGS = {"_overlapped", "_defer", "_async", "_inflight", "_begin", "_advance", "async_launch"}
STRATEGY_READS = {"step", "slack", "in_flight", "drain", "kind"}     # what the executor asks of its strategy


def executor_methods() -> list[ast.FunctionDef]:
    tree = ast.parse((RUNTIME / "executor.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Executor")
    return [n for n in cls.body if isinstance(n, ast.FunctionDef)]


def test_the_executor_reads_no_loop_flag_after_construction():
    """Outside __init__ no method names Loop, reads the flags the loop was once re-read from, or
    asks its strategy anything but step / slack / in_flight / drain / kind (the `loop` property)."""
    methods = executor_methods()
    assert {"plan", "fold", "advance"} <= {m.name for m in methods}
    for m in methods:
        if m.name == "__init__":
            continue
        nodes = [n for stmt in m.body for n in ast.walk(stmt)]
        assert not any(isinstance(n, ast.Name) and n.id == "Loop" for n in nodes), m.name
        assert not any(isinstance(n, ast.Attribute) and n.attr in FORMER_FLAGS for n in nodes), m.name
        asked = {n.attr for n in nodes if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
                 and n.value.attr == "strategy"}
        assert asked <= STRATEGY_READS, (m.name, asked - STRATEGY_READS)
    source = (RUNTIME / "executor.py").read_text()
    assert "getattr(" not in source and "is Loop." not in source


def test_the_loop_modules_keep_their_size_limits():
    """runtime/serving/loop.py and runtime/serving/executor.py: module <= 350 lines, class <= 300, function <= 80."""
    for name in ("loop.py", "executor.py", "overlap.py", "plan.py"):
        text = (RUNTIME / name).read_text()
        assert len(text.splitlines()) <= 350, name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                assert lines <= (300 if isinstance(node, ast.ClassDef) else 80), (name, node.name, lines)


def runtime_imports(name: str) -> set[str]:
    """The dynspec.runtime modules `name` imports anywhere in its text (TYPE_CHECKING included)."""
    out = set()
    for node in ast.walk(ast.parse((RUNTIME / name).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dynspec.runtime."):
            out.add(node.module.split(".")[-1])
    return out


def test_the_strategies_import_down_only():
    """executor -> loop -> plan, requests: the strategies reach their executor through the object it
    hands them, so no import (not even under TYPE_CHECKING) closes a cycle."""
    assert "loop" in runtime_imports("executor.py")
    assert runtime_imports("loop.py") <= {"plan", "requests"}
    assert "loop" not in runtime_imports("plan.py") | runtime_imports("requests.py")
