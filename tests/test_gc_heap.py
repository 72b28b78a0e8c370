"""The collector and the serving loop (runtime/serving/gc_heap.py): a frozen heap leaves the collector's
walk, the pause clock counts real collections, and the executor hands each iteration its share,
which the sweep metrics turn into gc_pause_fraction."""
from __future__ import annotations

import gc

import pytest

from dynspec.benchmarks.metrics import RunRecord, StepRecord, gc_pauses
from dynspec.runtime.serving.driver import run_closed_loop
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.serving.gc_heap import freeze_heap, pause_seconds
from dynspec.runtime.policy import DraftSchedule
from tests.test_executor import engine, greedy_many, hf_target, pair, prompts  # noqa: F401  (fixtures)


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()


class Cycle:
    def __init__(self):
        self.me = self


def test_freeze_moves_live_objects_out_and_still_collects_new_cycles(unfrozen):
    kept = [Cycle() for _ in range(1000)]
    n = freeze_heap()
    assert n >= 1000 and gc.get_freeze_count() == n
    assert not any(gc.is_tracked(x) and x in gc.get_objects(2) for x in kept[:3])
    new = Cycle()
    ref = id(new)
    del new
    found = gc.collect()                 # a cycle made after the freeze is still collected
    assert found >= 1 and ref not in {id(o) for o in gc.get_objects()}


def test_pause_clock_counts_collections():
    t0 = pause_seconds()
    for _ in range(3):
        gc.collect()
    assert pause_seconds() > t0


def test_each_iteration_reports_the_collections_since_the_last(pair, hf_target):
    """A collection forced between two steps lands in the next iteration's gc_seconds; the
    iterations' shares add up to the clock's advance over the run, and the output stays greedy."""
    eng = engine(pair, kmax=2)
    greedy_many(hf_target, prompts(2, seed=5), 12)      # the oracle first: its collections fall outside
    ex = Executor(eng, DraftSchedule.static(2, eng.max_batch_size), stats_limit=None)
    ps = prompts(2, seed=5)
    t0 = pause_seconds()                 # the executor's mark was taken at construction, no collection since
    hs = [ex.submit(p, 12) for p in ps]
    forced = None
    while not all(h.done for h in hs):
        st = ex.step()
        if st is not None and st.iteration == 2:
            gc.collect()
            forced = st.iteration + 1
    t1, stats = pause_seconds(), ex.stats
    assert [h.result().output_ids for h in hs] == greedy_many(hf_target, ps, 12)
    assert stats[forced].gc_seconds > 0
    assert sum(s.gc_seconds for s in stats) == pytest.approx(t1 - t0, abs=1e-9)
    assert run_closed_loop(ex, ps[:1], 4, 1)[0].output_ids == tuple(greedy_many(hf_target, ps[:1], 4)[0])


def test_gc_pause_fraction_leaves_the_first_step_out():
    steps = (StepRecord(1, 0, 0, 0, 0.005, 0.0, gc_s=0.05), StepRecord(1, 0, 0, 0, 0.005, 0.0, gc_s=0.0004),
             StepRecord(1, 0, 0, 0, 0.005, 0.0, gc_s=0.0))
    rec = RunRecord((), steps, 0.0, 0.016)
    assert gc_pauses([rec]) == pytest.approx(0.025)
    assert gc_pauses([RunRecord((), (), 0.0, 0.016)]) is None


FROZEN_CYCLE = """
import sys
from dynspec.runtime.serving.gc_heap import freeze_heap

class Node:
    def __init__(self):
        self.me = self
    def __del__(self):
        sys.stdout.write("freed\\n")

Node()                   # garbage only once collected: a cycle
freeze_heap()            # collects it ("freed"), then freezes the rest
kept = Node()
kept = None              # now a cycle made after the freeze...
import gc
gc.freeze()              # ...frozen as a serving process's objects are
"""


def test_the_heap_is_unfrozen_at_exit_so_the_last_collection_frees_frozen_cycles():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FROZEN_CYCLE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["freed", "freed"]          # the second one at exit


@pytest.mark.slow
def test_generate_ends_without_the_bindings_reporting_leaks():
    """`dynspec generate` with its progress bars: left frozen at exit, Triton's nanobind objects in
    frozen cycles were reported as leaked (a screen of 'nanobind: leaked ...' after the results)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "dynspec.cli", "generate", "--modes", "baseline", "--num-prompts", "8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "baseline:" in out.stdout and "leaked" not in out.stderr
