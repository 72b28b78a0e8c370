"""Joining a TP replica through an endpoint instead of MPI (docs/serving_with_triton.md).

The Triton launch (triton_repo/launch.py) has a TP rank that is not an MPI rank: TP rank 0 is the
executor inside Triton's python-backend stub, a process tritonserver spawns. So the ranks meet at
a rendezvous store instead of through MPI:
    launcher (MPI rank 0)    hosts a TCPStore on a port the OS picks, sends "addr:port" to every MPI rank
    stub (TP rank 0)         init_tp_endpoint("addr:port", 0, N)      (the address reaches it in its env)
    MPI ranks 1..N-1         init_tp_endpoint("addr:port", r, N, comm=COMM_WORLD)
One replica of N ranks; every other path (init_tp, run_replica) is untouched by this.
"""
from __future__ import annotations

import datetime
import os
from typing import Any

import torch

from dynspec.errors import DynspecError
from dynspec.runtime.tp_groups import TpContext, TpFault, _place, _reason, _replica_groups
from dynspec.runtime.tp_layout import layout, timeout_from_env

DEFAULT_JOIN_TIMEOUT_S = 300.0
ADDR_ENV, PORT_ENV = "DYNSPEC_TP_ADDR", "DYNSPEC_TP_PORT"   # not MASTER_*: clusters export those for other jobs


def host_rendezvous(comm, timeout_s: float = DEFAULT_JOIN_TIMEOUT_S) -> tuple[Any, str]:
    """Collective over `comm`: world rank 0 hosts the rendezvous store, every rank gets its
    endpoint "addr:port" -> (the store on rank 0, else None; endpoint). The address is 127.0.0.1
    when all ranks share rank 0's host, else its host name; the port is bound by the store itself
    (port 0), so no other process can take it between the choice and the bind. DYNSPEC_TP_ADDR /
    DYNSPEC_TP_PORT override them (MASTER_ADDR / MASTER_PORT are left alone: cluster launchers
    export them for their own jobs). Rank 0 must keep the store alive until every rank has joined."""
    from mpi4py import MPI

    host = MPI.Get_processor_name()
    hosts = comm.allgather(host)
    store = endpoint = error = None
    if comm.Get_rank() == 0:
        addr = os.environ.get(ADDR_ENV) or ("127.0.0.1" if len(set(hosts)) == 1 else host)
        raw = os.environ.get(PORT_ENV) or "0"
        try:
            if not raw.isdigit() or int(raw) > 65535:
                raise DynspecError(f"environment variable {PORT_ENV}={raw!r} is not a port number")
            try:
                store = torch.distributed.TCPStore("0.0.0.0", int(raw), None, True,
                                                   timeout=datetime.timedelta(seconds=timeout_s),
                                                   wait_for_workers=False)
            except RuntimeError as e:
                raise DynspecError(f"cannot host the TP rendezvous on port {raw} ({PORT_ENV}): {_reason(e)}") from e
            endpoint = f"{addr}:{store.port}"
        except DynspecError as e:
            error = str(e)
    endpoint, error = comm.bcast((endpoint, error), root=0)   # every rank learns of a failure, none waits
    if error is not None:
        raise DynspecError(error)
    return store, endpoint


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """'127.0.0.1:29500' -> ('127.0.0.1', 29500); '[::1]:29500' -> ('::1', 29500)."""
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DynspecError(f"TP endpoint {endpoint!r} is not HOST:PORT (e.g. 127.0.0.1:29500)")
    return host.strip("[]"), int(port)


def join_world(endpoint: str, rank: int, size: int, join_s: float, store: Any = None, *, who: str) -> None:
    """init_process_group (gloo) as `rank` of `size` at the store `endpoint` (rank 0 passes the store
    it hosts). WORLD waits up to join_s for every rank (a store connect can stall seconds on a
    loaded host); the groups used afterwards get their own timeout. A failure is a TpFault naming `who`."""
    import torch.distributed as dist

    join = datetime.timedelta(seconds=join_s)
    try:
        if store is None:
            host, port = parse_endpoint(endpoint)
            store = dist.TCPStore(host, port, None, False, timeout=join)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=join)
    except RuntimeError as e:
        raise TpFault(f"{who} could not join the {size} ranks at {endpoint} within {join_s:g} s: {_reason(e)}") from e


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
    from dynspec.runtime.allreduce import MODES

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
