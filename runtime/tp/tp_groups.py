"""Process groups of tensor parallelism under mpirun: TpContext, init_tp, and what ends a group
(docs/tensor_parallel.md). Which rank is where: runtime/tp/tp_layout.py.

mpi4py gives rank and size; rank 0 hosts the rendezvous TCPStore on a port it binds itself and
broadcasts the endpoint over MPI (host_rendezvous, below), so no launcher has to
export one and no other process can take the port first. (A rank that is no MPI rank, the Triton
launch's TP rank 0 in the python-backend stub, joins through an endpoint instead:
runtime/tp/tp_endpoint.py, init_tp_endpoint.)
Two process groups per replica:
    compute  NCCL on CUDA, gloo on CPU: the model's all-reduces and all-gathers
    control  always gloo (CPU): the leader's messages to its workers (header + pickled body,
             runtime/serving/plan_channel.py)

Faults (docs/tensor_parallel.md): every gloo collective gives up after `timeout_s`, so a dead or
hung peer surfaces as TpFault on the leader within that bound, never as a hang. While idle the
leader sends a heartbeat every timeout_s / 4, so a silent leader is a fault for the workers.
Whoever sees an error calls `abort_on_error`'s MPI Abort, which ends every rank of the job.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from dynspec.errors import DynspecError
from dynspec.runtime.tp.tp_layout import Layout, layout, log, timeout_from_env

DEFAULT_JOIN_TIMEOUT_S = 300.0
ADDR_ENV, PORT_ENV = "DYNSPEC_TP_ADDR", "DYNSPEC_TP_PORT"   # not MASTER_*: clusters export those for other jobs


class TpFault(RuntimeError):
    """A peer of this TP group died, hung or went silent; the group cannot continue."""


# ----------------------------------------------------------------------------- the TP context

@dataclass(frozen=True)
class TpContext:
    """What one rank needs at run time. tp == 1 has no groups and every collective is the identity."""
    layout: Layout
    device: torch.device
    timeout_s: float
    group: Any = None       # compute group of this replica (NCCL on CUDA, gloo on CPU)
    control: Any = None     # gloo group of this replica for the leader's messages
    comm: Any = None        # mpi4py COMM_WORLD (None in a world of one)
    reducer: Any = None     # runtime.tp.allreduce.Reducer over `group` (tp > 1)

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def tp_rank(self) -> int:
        return self.layout.tp_rank

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the replica's ranks (runtime/tp/allreduce.py): x itself (NCCL, gloo) or a new tensor (one-shot)."""
        if self.tp == 1:
            return x
        return _collective(lambda: self.reducer(x), self, "all_reduce")

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's x along `dim`, in TP-rank order: [.., n] -> [.., tp*n]."""
        if self.tp == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.tp)]
        _collective(lambda: torch.distributed.all_gather(parts, x.contiguous(), group=self.group), self, "all_gather")
        return torch.cat(parts, dim=dim)

    def barrier(self) -> None:
        """Every rank of the world (MPI, no timeout: loading times differ across ranks)."""
        if self.comm is not None:
            self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        if self.comm is not None:
            self.comm.Abort(code)
        os._exit(code)


def _collective(fn: Callable[[], Any], ctx: TpContext, what: str) -> Any:
    """fn()'s result; a RuntimeError (a peer gone, a timeout) becomes a TpFault naming the collective."""
    try:
        return fn()
    except RuntimeError as e:
        raise TpFault(f"TP rank {ctx.tp_rank} (world rank {ctx.layout.rank}): {what} over ranks "
                      f"{list(ctx.layout.tp_ranks)} failed (timeout {ctx.timeout_s:g} s): {_reason(e)}") from e


def _reason(e: BaseException) -> str:
    """gloo's first line without its source path: '[.../pair.cc:553] Connection closed by peer
    [127.0.0.1]:53648. This is ...' -> 'Connection closed by peer [127.0.0.1]:53648'."""
    line = (str(e).splitlines() or [type(e).__name__])[0]
    line = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\] ", "", line)
    return line.split(". ")[0]


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


def init_tp(tp: int, *, device: str | torch.device = "cpu", timeout_s: float | None = None,
            allreduce: str = "auto") -> TpContext:
    """Set up torch.distributed from mpi4py's rank and size and split WORLD into replicas.

    tp == 1 (a world of one, or `mpirun -n R` replicas of one rank) initialises nothing.
    allreduce: runtime/tp/allreduce.py's MODES; 'auto' is the one-shot kernel on CUDA, gloo on CPU.
    """
    from dynspec.runtime.tp.allreduce import MODES

    if allreduce not in MODES:
        raise DynspecError(f"--allreduce {allreduce!r} is not one of {', '.join(MODES)}")
    timeout_s = timeout_from_env() if timeout_s is None else timeout_s
    comm, rank, size = _mpi_world()
    lay = layout(rank, size, tp)
    dev = _place(device, local_rank())
    if tp == 1:                        # replicas of one rank: nothing to reduce, no process group
        return TpContext(lay, dev, timeout_s, comm=comm)
    join_s = max(timeout_s, DEFAULT_JOIN_TIMEOUT_S)
    store, endpoint = host_rendezvous(comm, join_s)         # rank 0's store lives as long as the group
    join_world(endpoint, rank, size, join_s, store, who=f"rank {rank}")
    group, control, reducer = _replica_groups(lay, dev, datetime.timedelta(seconds=timeout_s), allreduce)
    return TpContext(lay, dev, timeout_s, group, control, comm, reducer)


def local_rank() -> int:
    """This rank's index among the ranks of its host (Open MPI, MPICH); 0 without mpirun."""
    return int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", "0")))


def _place(device: str | torch.device, local_rank: int) -> torch.device:
    """'cuda' -> one GPU per rank of the host (cuda:local_rank, modulo the GPUs); 'cuda:N' and 'cpu' as given."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    return dev


def _replica_groups(lay: Layout, dev: torch.device, td: datetime.timedelta, allreduce: str) -> tuple[Any, Any, Any]:
    """(compute group, control group, Reducer) of this rank's replica, after init_process_group."""
    import torch.distributed as dist

    from dynspec.runtime.tp.allreduce import Reducer

    group = control = None
    for r in range(lay.replicas):      # every rank creates every group, in the same order
        ranks = list(range(r * lay.tp, (r + 1) * lay.tp))
        g = dist.new_group(ranks, timeout=td, backend="nccl" if dev.type == "cuda" else "gloo")
        c = dist.new_group(ranks, timeout=td, backend="gloo")
        if r == lay.replica:
            group, control = g, c
    reducer = Reducer("nccl" if dev.type != "cuda" and allreduce == "auto" else allreduce, group, dev)
    if dev.type == "cuda" and allreduce == "auto":
        # every rank must take the same route: one-shot only where all of the replica set it up
        ok = torch.tensor([int(reducer.mode == "one-shot")])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=control)
        if reducer.mode == "one-shot" and not int(ok):
            reducer.use("nccl")
            reducer.fallback = "another rank of the replica could not set it up"
    if reducer.fallback:
        log(f"all-reduce: NCCL (the one-shot kernel could not be set up: {reducer.fallback})",
            rank=lay.rank, all_ranks=True)
    return group, control, reducer


def _mpi_world() -> tuple[Any, int, int]:
    if not any(int(os.environ.get(v, "1") or 1) > 1 for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")):
        return None, 0, 1
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DynspecError("launched by mpirun but mpi4py is not installed: pip install mpi4py") from e
    return MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def mpi_world() -> tuple[Any, int, int]:
    """(COMM_WORLD, rank, size) under mpirun; (None, 0, 1) without it."""
    return _mpi_world()


def wait_for_peers(ctx: TpContext, timeout_s: float) -> None:
    """Every rank of the replica has loaded its shard (a barrier over the control group with its
    own bound: loading times differ, and the channel's timeouts start after it). TpFault names
    the rank that did not arrive."""
    if ctx.tp == 1:
        return
    _collective(lambda: torch.distributed.monitored_barrier(
        group=ctx.control, timeout=datetime.timedelta(seconds=timeout_s)), ctx,
        f"waiting up to {timeout_s:g} s for every rank to load its shard")


def release_groups(ctx: TpContext, wait_s: float = 5.0) -> bool:
    """Destroy the process groups, giving up after wait_s (a hung peer can hold the teardown);
    no MPI, no hard exit: for a process that must go on (the Triton stub returns to tritonserver).
    True when the teardown finished."""
    if not (ctx.tp > 1 and torch.distributed.is_initialized()):
        return True
    done = threading.Event()

    def teardown() -> None:
        torch.distributed.destroy_process_group()
        done.set()

    threading.Thread(target=teardown, daemon=True, name="dynspec-teardown").start()
    return done.wait(wait_s)


@contextlib.contextmanager
def abort_on_error(ctx: TpContext | None) -> Iterator[None]:
    """Any exception on any rank ends the whole job (MPI Abort), after one line naming the rank.
    A rank that merely exits would leave its peers waiting on their next collective."""
    try:
        yield
    except SystemExit as e:
        if e.code not in (0, None) and ctx is not None and ctx.layout.size > 1:
            log(f"exit status {e.code}; aborting all {ctx.layout.size} ranks", rank=ctx.layout.rank, all_ranks=True)
            ctx.abort(e.code if isinstance(e.code, int) else 1)
        raise
    except BaseException as e:
        if ctx is None or ctx.layout.size == 1:
            raise
        log(f"{type(e).__name__}: {e}; aborting all {ctx.layout.size} ranks", rank=ctx.layout.rank, all_ranks=True)
        ctx.abort(2 if isinstance(e, DynspecError) else 1)      # bad input exits 2, as the CLIs do
