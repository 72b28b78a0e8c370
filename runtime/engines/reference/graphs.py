"""CUDA graphs replayed as a chain: one step's device work captured as consecutive graphs. See
docs/design.md ("CUDA graphs").

A graph's kernels start only once its launch has been submitted, about a microsecond a node, so
one graph of a whole step keeps the GPU idle while the host submits it. Cut after a one-layer
first graph, the GPU runs while the host submits the rest. Example, 32 layers (chain_cuts(32) =
{0, 8}): embed + layer 0 | layers 1..8 | layers 9..31 + head.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Callable

import torch

from dynspec.errors import DynspecError


def chain_cuts(layers: int) -> frozenset[int]:
    """Pure. The target layers after which a graph chain starts its next graph: after layer 0
    and after layer layers // 4 (32 -> {0, 8}; 6 -> {0, 1}; 1 -> {0})."""
    return frozenset({0, max(1, layers // 4)} & set(range(layers)))


@dataclass(frozen=True)
class GraphChain:
    """CUDA graphs replayed in turn as one step (capture_chain)."""
    graphs: tuple

    def replay(self) -> None:
        for g in self.graphs:
            g.replay()


def capture_chain(fn: Callable[[Callable[[int], None]], None], cuts: frozenset[int], pool, stream) -> GraphChain:
    """fn(cut) captured as consecutive graphs on `stream` into `pool`; fn calls cut(i) after
    target layer i, and a new graph starts after each layer in `cuts`. What passes between the
    graphs stays in the pool, and nothing runs between their replays. A synchronizing call inside
    (.item(), a blocking copy, a stream sync) is refused: PyTorch's sync debug mode is "error"
    meanwhile, so it raises before the call reaches CUDA. Any failure -> DynspecError."""
    graphs = [torch.cuda.CUDAGraph()]
    open_ = [False]                                          # a capture is under way

    def begin() -> None:
        graphs[-1].capture_begin(pool=pool)
        open_[0] = True

    def end() -> None:
        open_[0] = False
        graphs[-1].capture_end()

    def cut(i: int) -> None:
        if i in cuts:
            end()
            graphs.append(torch.cuda.CUDAGraph())
            begin()

    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")                 # a sync PyTorch knows of raises before it runs
    try:
        with torch.cuda.stream(stream):
            begin()
            try:
                fn(cut)
            finally:
                if open_[0]:                                 # not after a failed begin: keep its error
                    end()
    except RuntimeError as e:
        raise DynspecError(f"CUDA graph capture failed (graph {len(graphs)} of its chain): {e}") from e
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    torch.cuda.current_stream().wait_stream(stream)
    return GraphChain(tuple(graphs))


def no_cut(i: int) -> None:
    """The cut points of an uncaptured run (capture_chain's are real)."""


@dataclass(frozen=True)
class CaptureCost:
    """What captures took: graph chains, wall seconds (warm-ups included) and the device memory
    reserved meanwhile (graph pools and the warm-ups' allocations)."""
    graphs: int = 0
    seconds: float = 0.0
    bytes: int = 0

    def __add__(self, other: "CaptureCost") -> "CaptureCost":
        return CaptureCost(self.graphs + other.graphs, self.seconds + other.seconds, self.bytes + other.bytes)


def timed_capture(fn: Callable[[], int]) -> tuple[int, CaptureCost]:
    """fn() -> graphs captured, run between two device syncs -> (that count, its CaptureCost).
    The cycle collector runs once before and is off during fn: a collection inside a capture can
    free another engine's graphs and tensors mid-capture (CUDA calls a capture may not see; a
    suspect in the capture failures of docs/design.md, "CUDA graphs", not a proven cause)."""
    gc.collect()
    torch.cuda.synchronize()
    t0, m0 = time.perf_counter(), torch.cuda.memory_reserved()
    was = gc.isenabled()
    gc.disable()
    try:
        n = fn()
    finally:
        if was:
            gc.enable()
    torch.cuda.synchronize()
    return n, CaptureCost(n, time.perf_counter() - t0, torch.cuda.memory_reserved() - m0)
