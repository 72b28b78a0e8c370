"""The rank layout of tensor parallelism under mpirun (docs/design.md, section 5: the leader
decides, every rank runs the same step), the collectives' timeout and the ranks' log lines.

    mpirun -n R*N ... --tp N
    world rank w -> replica w // N, TP rank w % N; a replica's leader is its TP rank 0.
    -n 4 --tp 2:  replica 0 = ranks {0, 1} (leader 0), replica 1 = ranks {2, 3} (leader 2)
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch

from dynspec.errors import DynspecError

DEFAULT_TIMEOUT_S = 60.0
TIMEOUT_ENV = "DYNSPEC_TP_TIMEOUT_S"       # overrides the default everywhere (tests use a few s)


# ----------------------------------------------------------------------------- layout (pure)

@dataclass(frozen=True)
class Layout:
    rank: int       # world rank
    size: int       # world size = replicas * tp
    tp: int

    @property
    def replicas(self) -> int:
        return self.size // self.tp

    @property
    def replica(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def leader(self) -> int:
        """World rank of this replica's TP rank 0."""
        return self.replica * self.tp

    @property
    def is_leader(self) -> bool:
        return self.tp_rank == 0

    @property
    def tp_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.leader, self.leader + self.tp))


def layout(rank: int, size: int, tp: int) -> Layout:
    """Place world rank `rank` of `size`: -n 6 --tp 2 -> 3 replicas; -n 3 --tp 2 is refused."""
    if tp < 1:
        raise DynspecError(f"--tp {tp} must be at least 1")
    if size % tp:
        raise DynspecError(f"mpirun -n {size} is not a multiple of --tp {tp} ({size} % {tp} = {size % tp}); "
                           f"launch -n R*{tp} for R replicas of {tp} ranks")
    if not 0 <= rank < size:
        raise DynspecError(f"rank {rank} is outside a world of {size}")
    return Layout(rank, size, tp)


def timeout_from_env(default: float = DEFAULT_TIMEOUT_S) -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return default
    try:
        t = float(raw)
    except ValueError:
        t = -1.0
    if not t > 0:
        raise DynspecError(f"environment variable {TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return t


# ----------------------------------------------------------------------------- logging

def log(msg: str, *, rank: int | None = None, all_ranks: bool = False) -> None:
    """One line on stderr from world rank 0 only (or from every rank, prefixed, with all_ranks).
    `print` is never rebound; other ranks just skip the write."""
    r = _world_rank() if rank is None else rank
    if all_ranks:
        sys.stderr.write(f"[dynspec rank {r}] {msg}\n")
    elif r == 0:
        sys.stderr.write(f"[dynspec {time.strftime('%H:%M:%S')}] {msg}\n")
    else:
        return
    sys.stderr.flush()


def _world_rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if v in os.environ:
            return int(os.environ[v])
    return 0
