"""The serving loop and Python's cycle collector (docs/design.md, "The collector").

A full (generation-2) collection stops the thread and walks every tracked object: with torch,
transformers and Triton imported, before any engine, that is ~270k objects and 160 ms on the
2-core CI machine; a loaded engine adds to it. The pause lands between two steps and the device
idles through it (one such pause in a 6.5-s sweep run is 2.5% of its wall time). Almost all of
it is the startup heap, which lives as long as the process; what a step allocates is acyclic
and freed by reference counting.
So the serving entry points freeze the heap once it is built (vLLM's engine core and SGLang's
scheduler do the same after warm-up): frozen objects are never walked again, later ones still
are, and a cycle made after the freeze is still collected. At exit the heap is unfrozen, so the
interpreter's last collections free frozen cycles too (left frozen, Triton's bindings report
their objects in them as leaked when the process ends); they walk the whole heap, about 0.7 s
more at exit with torch and an engine loaded, on 2 cores.

    freeze_heap()      collect once, then move every live object out of the collector's walk
    pause_seconds()    process-wide seconds spent in collections since the first call; the
                       executor records each iteration's share (IterationStats.gc_seconds)
"""
from __future__ import annotations

import atexit
import gc
import time

_total = 0.0
_started: float | None = None
_installed = False
_unfreeze_at_exit = False


def freeze_heap() -> int:
    """Collect, then freeze what is left (outside any timed region: the collect is the full
    pause, once). Returns the objects frozen so far (gc.get_freeze_count)."""
    global _unfreeze_at_exit
    gc.collect()
    gc.freeze()
    if not _unfreeze_at_exit:
        atexit.register(gc.unfreeze)
        _unfreeze_at_exit = True
    return gc.get_freeze_count()


def _on_gc(phase: str, info: dict) -> None:
    global _total, _started
    if phase == "start":
        _started = time.perf_counter()
    elif _started is not None:
        _total += time.perf_counter() - _started
        _started = None


def pause_seconds() -> float:
    """Seconds this process has spent in cycle collections since the first call (the first
    call installs the gc callback that counts them; ~1 us a collection)."""
    global _installed
    if not _installed:
        gc.callbacks.append(_on_gc)
        _installed = True
    return _total
