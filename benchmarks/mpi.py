"""The MPI world as the benchmarks see it, and the one rank-0 log helper.

Launched plainly (`python -m dynspec.benchmarks.sweep ...`) the world is one rank and
mpi4py is never imported. Under `mpirun -n N` (Open MPI sets OMPI_COMM_WORLD_SIZE, MPICH
and PMIx set PMI_SIZE / PMIX_RANK) mpi4py's COMM_WORLD is used for barrier and gather.

`print` is never rebound: ranks other than 0 simply do not call `log`'s output path.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID")


def launched_by_mpirun() -> bool:
    return any(int(os.environ.get(v, "1") or 1) > 1 for v in _SIZE_VARS)


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    comm: Any = None          # mpi4py COMM_WORLD, or None for a world of one

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.comm is not None:
            self.comm.Barrier()

    def gather(self, obj: Any) -> list | None:
        """Every rank's obj as a list on rank 0 (None elsewhere)."""
        if self.comm is None:
            return [obj]
        return self.comm.gather(obj, root=0)

    def bcast(self, obj: Any) -> Any:
        if self.comm is None:
            return obj
        return self.comm.bcast(obj, root=0)

    def allreduce_max(self, x: float) -> float:
        if self.comm is None:
            return x
        from mpi4py import MPI

        return self.comm.allreduce(x, op=MPI.MAX)


@lru_cache(maxsize=1)
def world() -> World:
    """The process's place in the MPI world (cached; mpi4py imported only under mpirun)."""
    if not launched_by_mpirun():
        return World(0, 1, 0, None)
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - mpi4py is a dev dependency
        raise RuntimeError("launched by mpirun but mpi4py is not installed: pip install mpi4py") from e
    comm = MPI.COMM_WORLD
    local = next((int(os.environ[v]) for v in _LOCAL_RANK_VARS if v in os.environ), comm.Get_rank())
    return World(comm.Get_rank(), comm.Get_size(), local, comm)


def log(msg: str, *, all_ranks: bool = False) -> None:
    """Rank-0 log line on stderr (stdout stays free for machine-readable output).

    all_ranks=True prefixes the rank and writes from every rank (for errors worth seeing
    from each replica)."""
    w = world()
    if w.is_root and not all_ranks:
        sys.stderr.write(f"[dynspec {time.strftime('%H:%M:%S')}] {msg}\n")
    elif all_ranks:
        who = f"rank {w.rank}/{w.size}" if w.size > 1 else time.strftime("%H:%M:%S")
        sys.stderr.write(f"[dynspec {who}] {msg}\n")
    sys.stderr.flush()


def split_leaders(w: World, tp: int) -> World | None:
    """Under `--tp tp` the replicas' leaders (world ranks 0, tp, 2*tp, ...) as a world of their
    own, so that barriers and gathers involve only the ranks that time and report:
        -n 4 --tp 2:  ranks 0, 2 -> World(0, 2), World(1, 2) over one communicator;  ranks 1, 3 -> None
    tp == 1 returns w. Collective (MPI Comm.Split): every rank of w calls it."""
    if tp == 1 or w.comm is None:
        return w
    leader = w.rank % tp == 0
    sub = w.comm.Split(0 if leader else 1, w.rank)
    if not leader:
        sub.Free()
        return None
    return World(sub.Get_rank(), sub.Get_size(), w.local_rank, sub)
