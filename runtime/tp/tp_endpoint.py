"""Joining a TP replica through an endpoint instead of MPI (docs/serving_with_triton.md).

The Triton launch (triton_repo/launch.py) has a TP rank that is not an MPI rank: TP rank 0 is the
executor inside Triton's python-backend stub, a process tritonserver spawns. So the ranks meet at
a rendezvous store instead of through MPI:
    launcher (MPI rank 0)    hosts a TCPStore on a port the OS picks, sends "addr:port" to every MPI rank
    stub (TP rank 0)         init_tp_endpoint("addr:port", 0, N)      (the address reaches it in its env)
    MPI ranks 1..N-1         init_tp_endpoint("addr:port", r, N, comm=COMM_WORLD)
One replica of N ranks; every other path (init_tp, run_replica) is untouched by this. The
rendezvous itself (host_rendezvous, parse_endpoint, join_world) is runtime/tp/tp_groups.py's, which
init_tp uses too; this module builds on it and tp_groups never imports it.
"""
from __future__ import annotations

import datetime
from typing import Any

import torch

from dynspec.errors import DynspecError
from dynspec.runtime.tp.tp_groups import DEFAULT_JOIN_TIMEOUT_S, TpContext, _place, _replica_groups, join_world
from dynspec.runtime.tp.tp_layout import layout, timeout_from_env


def init_tp_endpoint(endpoint: str, tp_rank: int, tp: int, *, device: str | torch.device = "cpu",
                     local_rank: int = 0, timeout_s: float | None = None,
                     join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S, allreduce: str = "auto",
                     comm: Any = None) -> TpContext:
    """Join one replica of `tp` ranks as TP rank `tp_rank` at the store `endpoint` ("addr:port",
    host_rendezvous's), without MPI. The TpContext is init_tp's for a world of exactly `tp` ranks:
    the same compute and control groups, the same Reducer.

    join_timeout_s bounds the wait for every rank to arrive (the stub comes up with tritonserver,
    seconds after the MPI workers); timeout_s (default: DYNSPEC_TP_TIMEOUT_S, else 60) bounds
    every collective after that, as in init_tp. local_rank places device 'cuda' (cuda:local_rank).
    comm: the MPI communicator for ctx.abort (the workers); None in the stub, which is no MPI rank."""
    from dynspec.runtime.tp.allreduce import MODES

    if allreduce not in MODES:
        raise DynspecError(f"--allreduce {allreduce!r} is not one of {', '.join(MODES)}")
    timeout_s = timeout_from_env() if timeout_s is None else timeout_s
    lay = layout(tp_rank, tp, tp)
    dev = _place(device, local_rank)
    if tp == 1:
        return TpContext(lay, dev, timeout_s, comm=comm)
    join_world(endpoint, tp_rank, tp, join_timeout_s, who=f"TP rank {tp_rank}")
    group, control, reducer = _replica_groups(lay, dev, datetime.timedelta(seconds=timeout_s), allreduce)
    return TpContext(lay, dev, timeout_s, group, control, comm, reducer)
