"""The executor loop, chosen once (runtime/serving/loop.py, runtime/serving/executor.py): which engine calls each
Loop makes, the serving loop's rule, and the sweeps' default (benchmarks/sweep_modes.py: a mode
without a suffix runs the serving loop, '+serial' and '+overlap' name one). Oracles: the engine's
own call log and the rule written out in runtime/serving/loop.py's docstring."""
from __future__ import annotations

import pytest

from dynspec.benchmarks import sweep_modes
from dynspec.benchmarks.figures_common import figure_rows
from dynspec.errors import DynspecError
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.loop import DeferredLoop, Loop, OverlappedLoop, SerialLoop, serving_loop
from dynspec.runtime.policy import DraftSchedule
from tests.test_workload import FakeEngine


class CallLog(FakeEngine):
    """FakeEngine whose step / launch / result calls are logged in order: ("step", k), ("launch", k), ("result", k)."""

    def __init__(self, async_launch: bool = False):
        super().__init__(max_batch_size=4)
        self.async_launch, self.calls = async_launch, []

    def step(self, plan, acceptance):
        self.calls.append(("step", plan.k))
        return super().step(plan, acceptance)

    def launch(self, plan, acceptance):
        self.calls.append(("launch", plan.k))
        return plan, acceptance

    def result(self, handle):
        self.calls.append(("result", handle[0].k))
        return FakeEngine.step(self, *handle)


def served(loop: Loop, async_launch: bool = False) -> tuple[Executor, CallLog]:
    """Two requests of 5 tokens at K=2 through `loop`, run until idle."""
    eng = CallLog(async_launch)
    ex = Executor(eng, DraftSchedule.static(2, 4), loop=loop)
    handles = [ex.submit([1, 2, 3], 5) for _ in range(2)]
    ex.run_until_idle()
    assert all(h.result().finish_reason == "length" and len(h.tokens()) == 5 for h in handles)
    return ex, eng


def test_serial_loop_on_a_synchronous_engine_runs_each_step_whole():
    ex, eng = served(Loop.SERIAL)
    assert ex.loop is Loop.SERIAL and {c for c, _ in eng.calls} == {"step"}
    assert not any(p.carry for p in eng.plans) and not any(s.overlapped for s in ex.stats)


def test_serial_loop_on_an_asynchronous_engine_launches_then_reads_each_step():
    """The deferred update (runtime/serving/executor.py): launch i, then result i, never step."""
    ex, eng = served(Loop.SERIAL, async_launch=True)
    assert {c for c, _ in eng.calls} == {"launch", "result"}
    assert [c for c, _ in eng.calls] == ["launch", "result"] * (len(eng.calls) // 2)
    assert not any(p.carry for p in eng.plans) and not any(s.overlapped for s in ex.stats)


@pytest.mark.parametrize("async_launch", [False, True])
def test_overlapped_loop_launches_the_next_step_before_reading_the_last(async_launch):
    ex, eng = served(Loop.OVERLAPPED, async_launch)
    calls = [c for c, _ in eng.calls]
    assert ex.loop is Loop.OVERLAPPED and "step" not in calls
    assert calls[:3] == ["launch", "launch", "result"]          # i+1 launched before i is read
    assert calls.count("launch") == calls.count("result") == len(eng.plans)
    assert all(p.carry for p in eng.plans) and all(s.overlapped for s in ex.stats)


def test_the_loop_is_bound_once():
    """step() is the strategy's, chosen in __init__; nothing re-reads the loop afterwards."""
    for loop, async_launch, kind in ((Loop.SERIAL, False, SerialLoop), (Loop.SERIAL, True, DeferredLoop),
                                     (Loop.OVERLAPPED, False, OverlappedLoop),
                                     (Loop.OVERLAPPED, True, OverlappedLoop)):
        ex = Executor(CallLog(async_launch), DraftSchedule.static(2, 4), loop=loop)
        assert type(ex.strategy) is kind, (loop, async_launch)
        assert ex._step.__self__ is ex.strategy and ex._step.__func__ is kind.step, (loop, async_launch)


def test_serving_loop_rule():
    assert serving_loop("cuda") is serving_loop("cuda:1") is Loop.OVERLAPPED
    assert serving_loop("cpu") is Loop.SERIAL
    assert serving_loop("cuda:0", False) is Loop.SERIAL and serving_loop("cpu", True) is Loop.OVERLAPPED
    assert [loop.value for loop in Loop] == ["serial", "overlapped"]


# ---- the sweeps' modes -----------------------------------------------------------------------------

def test_a_mode_without_a_suffix_runs_the_serving_loop():
    for default in Loop:                       # OVERLAPPED: a CUDA device's serving loop; SERIAL: a CPU's
        assert sweep_modes.mode_loop("baseline", default) is default
        assert sweep_modes.mode_loop("static:3", default) is default
        assert sweep_modes.mode_loop("baseline+serial", default) is Loop.SERIAL
        assert sweep_modes.mode_loop("dynamic+overlap", default) is Loop.OVERLAPPED
    assert sweep_modes.split_mode("static:3+serial") == ("static:3", "+serial")
    assert sweep_modes.parse_modes("baseline+serial,baseline+overlap,adaptive+serial") == (
        "baseline+serial", "baseline+overlap", "adaptive+serial")
    with pytest.raises(DynspecError, match=r"unknown mode\(s\) \['baseline\+serial\+overlap'\]"):
        sweep_modes.parse_modes("baseline+serial+overlap")


def test_two_modes_of_one_policy_in_one_loop_are_refused():
    assert sweep_modes.mode_loops(("baseline", "baseline+overlap"), Loop.SERIAL) == {
        "baseline": Loop.SERIAL, "baseline+overlap": Loop.OVERLAPPED}
    with pytest.raises(DynspecError, match="baseline and baseline\\+overlap both run baseline through the overlapped"
                                           " loop \\(a mode without a suffix runs the serving loop, overlapped here\\)"):
        sweep_modes.mode_loops(("baseline", "baseline+overlap"), Loop.OVERLAPPED)


@pytest.mark.parametrize("device,loop", [("cuda", Loop.OVERLAPPED), ("cuda:1", Loop.OVERLAPPED), ("cpu", Loop.SERIAL)])
def test_a_sweep_resolves_its_modes_loops_on_its_device(device, loop):
    """resolve() on the tiny pair's config with --device DEVICE (nothing is opened on it): plain
    modes take the device's serving loop, a +serial one the serial loop; the cache holds the
    widest loop's slack (K 3 of the schedule 2:3)."""
    from dynspec.benchmarks import sweep_plan
    from dynspec.benchmarks.mpi import World
    from dynspec.benchmarks.sweep_args import make_parser
    from dynspec.runtime.generate.session import engine_config_for, tiny_pair_dirs

    cfg = engine_config_for(*tiny_pair_dirs(), DraftSchedule.parse("2:3"))
    args = make_parser().parse_args(["--device", device, "--modes", "baseline,dynamic,static:2+serial",
                                     "--input-len", "8", "--output-len", "6", "--concurrency", "1",
                                     "--num-requests", "2", "--out", "unused"])
    spec = sweep_plan.resolve(args, World(0, 1, 0), cfg)
    assert dict(spec.loops) == {"baseline": loop, "dynamic": loop, "static:2+serial": Loop.SERIAL}
    assert spec.max_seq_len == 14 + (2 if loop is Loop.OVERLAPPED else 1) * (3 + 1)


def test_figures_name_the_overlapped_loop_only_beside_the_serial_one():
    def rows(*pairs):
        return [{"mode": m, "loop": loop} for m, loop in pairs]

    names = lambda rs: [r["mode"] for r in figure_rows(rs)]      # noqa: E731
    # serial beside overlapped, as named now and as the committed results name them
    assert names(rows(("baseline+serial", "serial"), ("baseline+overlap", "overlap"))) == [
        "baseline", "baseline+overlap"]
    assert names(rows(("baseline", "serial"), ("baseline+overlap", "overlap"))) == ["baseline", "baseline+overlap"]
    assert names(rows(("baseline+serial", "serial"), ("baseline", "overlap"))) == ["baseline", "baseline+overlap"]
    # one loop: the policy's name, whichever loop it was
    assert names(rows(("baseline", "overlap"), ("dynamic+overlap", "overlap"))) == ["baseline", "dynamic"]
    assert names([{"mode": "static"}, {"mode": "dynamic"}]) == ["static", "dynamic"]      # rows without `loop`
