"""Ranks, replicas and the leader's plan channel for tensor parallelism under mpirun
(docs/design.md, section 5: the leader decides, every rank runs the same step).

    mpirun -n R*N ... --tp N
    world rank w -> replica w // N, TP rank w % N; a replica's leader is its TP rank 0.
    -n 4 --tp 2:  replica 0 = ranks {0, 1} (leader 0), replica 1 = ranks {2, 3} (leader 2)

mpi4py gives rank and size; rank 0 picks MASTER_ADDR/MASTER_PORT and broadcasts them over
MPI, so no launcher has to export them. (A rank that is no MPI rank, the Triton launch's TP rank 0
in the python-backend stub, joins through an endpoint instead: init_tp_endpoint.)
Two process groups per replica:
    compute  NCCL on CUDA, gloo on CPU: the model's all-reduces and all-gathers
    control  always gloo (CPU): the leader's messages to its workers (header + pickled body)

Faults (docs/tensor_parallel.md): every gloo collective gives up after `timeout_s`, so a dead or
hung peer surfaces as TpFault on the leader within that bound, never as a hang. While idle the
leader sends a heartbeat every timeout_s / 4, so a silent leader is a fault for the workers.
Whoever sees an error calls `abort_on_error`'s MPI Abort, which ends every rank of the job.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from dynspec.errors import DynspecError
from dynspec.runtime.gc_heap import freeze_heap

DEFAULT_TIMEOUT_S = 60.0
TIMEOUT_ENV = "DYNSPEC_TP_TIMEOUT_S"       # overrides the default everywhere (tests use a few s)


class TpFault(RuntimeError):
    """A peer of this TP group died, hung or went silent; the group cannot continue."""


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
    reducer: Any = None     # runtime.allreduce.Reducer over `group` (tp > 1)

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def tp_rank(self) -> int:
        return self.layout.tp_rank

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the replica's ranks (runtime/allreduce.py): x itself (NCCL, gloo) or a new tensor (one-shot)."""
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_tp(tp: int, *, device: str | torch.device = "cpu", timeout_s: float | None = None,
            allreduce: str = "auto") -> TpContext:
    """Set up torch.distributed from mpi4py's rank and size and split WORLD into replicas.

    tp == 1 (a world of one, or `mpirun -n R` replicas of one rank) initialises nothing.
    allreduce: runtime/allreduce.py's MODES; 'auto' is the one-shot kernel on CUDA, gloo on CPU.
    """
    from dynspec.runtime.allreduce import MODES

    if allreduce not in MODES:
        raise DynspecError(f"--allreduce {allreduce!r} is not one of {', '.join(MODES)}")
    timeout_s = timeout_from_env() if timeout_s is None else timeout_s
    comm, rank, size = _mpi_world()
    lay = layout(rank, size, tp)
    dev = _place(device, local_rank())
    if tp == 1:                        # replicas of one rank: nothing to reduce, no process group
        return TpContext(lay, dev, timeout_s, comm=comm)
    import torch.distributed as dist

    addr, port = _rendezvous(comm)
    td = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size, timeout=td)
    group, control, reducer = _replica_groups(lay, dev, td, allreduce)
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

    from dynspec.runtime.allreduce import Reducer

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


def _rendezvous(comm) -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT) chosen by rank 0 and broadcast over MPI. Exported values win.
    All ranks on rank 0's host -> 127.0.0.1; otherwise rank 0's host name. The port is one the
    OS handed out for port 0 a moment earlier (another process could take it first: rare)."""
    from mpi4py import MPI

    host = MPI.Get_processor_name()
    hosts = comm.allgather(host)
    if comm.Get_rank() == 0:
        addr = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if len(set(hosts)) == 1 else host)
        port = int(os.environ.get("MASTER_PORT") or _free_port())
        choice = (addr, port)
    else:
        choice = None
    return comm.bcast(choice, root=0)


def mpi_world() -> tuple[Any, int, int]:
    """(COMM_WORLD, rank, size) under mpirun; (None, 0, 1) without it."""
    return _mpi_world()


# ----------------------------------------------------------------------------- joining through an endpoint
#
# The Triton launch (triton_repo/launch.py) has a TP rank that is not an MPI rank: TP rank 0 is the
# executor inside Triton's python-backend stub, a process tritonserver spawns. So the ranks meet at
# a rendezvous store instead of through MPI:
#     launcher (MPI rank 0)    hosts a TCPStore on a port the OS picks, sends "addr:port" to every MPI rank
#     stub (TP rank 0)         init_tp_endpoint("addr:port", 0, N)      (the address reaches it in its env)
#     MPI ranks 1..N-1         init_tp_endpoint("addr:port", r, N, comm=COMM_WORLD)
# One replica of N ranks; every other path (init_tp, run_replica) is untouched by this.

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
    import torch.distributed as dist

    host, port = parse_endpoint(endpoint)
    join = datetime.timedelta(seconds=join_timeout_s)
    try:
        store = dist.TCPStore(host, port, None, False, timeout=join)
        # WORLD waits up to the join timeout for every rank; the groups used afterwards get timeout_s
        dist.init_process_group("gloo", store=store, rank=tp_rank, world_size=tp, timeout=join)
    except RuntimeError as e:
        raise TpFault(f"TP rank {tp_rank} could not join the {tp} ranks at {endpoint} within "
                      f"{join_timeout_s:g} s: {_reason(e)}") from e
    group, control, reducer = _replica_groups(lay, dev, datetime.timedelta(seconds=timeout_s), allreduce)
    return TpContext(lay, dev, timeout_s, group, control, comm, reducer)


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


# ----------------------------------------------------------------------------- the plan channel

STOP, HEARTBEAT, CALL = 0, 1, 2


class PlanChannel:
    """Leader -> workers messages of one replica: a 2-int header (kind, nbytes), then nbytes of
    pickled body, both broadcast from the leader over the control group.

        leader:  ch.send(("step", (plan, acceptance), {}))     worker:  ch.recv() -> the same tuple
                 ch.close()                                              ch.recv() -> None (stop)

    The leader sends a HEARTBEAT whenever nothing was sent for timeout_s / 4, so a worker waiting
    for its next message can tell an idle leader from a dead one. Only one thread sends at a time:
    callers that must keep a message and the work after it together hold `lock` around both.
    """

    def __init__(self, ctx: TpContext, *, heartbeat: bool = True):
        self.ctx = ctx
        self.lock = threading.RLock()
        self._last = time.monotonic()
        self._closed = False
        self.beat_fault: TpFault | None = None     # why the heartbeat stopped (a fault seen while idle)
        self._beat: threading.Thread | None = None
        if ctx.layout.is_leader and ctx.tp > 1 and heartbeat:
            self._beat = threading.Thread(target=self._heartbeat, name="dynspec-tp-heartbeat", daemon=True)
            self._beat.start()

    def _bcast(self, t: torch.Tensor, what: str) -> None:
        ctx = self.ctx
        _collective(lambda: torch.distributed.broadcast(t, src=ctx.layout.leader, group=ctx.control), ctx, what)

    def _send(self, kind: int, body: bytes = b"") -> None:
        self._bcast(torch.tensor([kind, len(body)], dtype=torch.int64), "plan header broadcast")
        if body:
            self._bcast(torch.frombuffer(bytearray(body), dtype=torch.uint8), "plan body broadcast")
        self._last = time.monotonic()

    def send(self, msg: Any) -> None:
        """Leader only: every worker's next recv() returns msg."""
        if self.ctx.tp == 1:
            return
        with self.lock:
            if self._closed:
                raise TpFault("the plan channel is closed")
            self._send(CALL, pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self) -> Any:
        """Worker only: the leader's next message, or None once it sent STOP."""
        while True:
            head = torch.empty(2, dtype=torch.int64)
            try:
                self._bcast(head, "wait for the leader's next message")
            except TpFault as e:
                raise TpFault(f"no message from the leader (world rank {self.ctx.layout.leader}) within "
                              f"{self.ctx.timeout_s:g} s: it died or hung ({e})") from e
            kind, n = int(head[0]), int(head[1])
            if kind == HEARTBEAT:
                continue
            if kind == STOP:
                return None
            body = torch.empty(n, dtype=torch.uint8)
            self._bcast(body, "plan body broadcast")
            return pickle.loads(body.numpy().tobytes())

    def close(self) -> None:
        """Leader only: tell the workers to stop (their recv() returns None)."""
        if self.ctx.tp == 1:
            return
        with self.lock:
            if not self._closed:
                self._closed = True
                self._send(STOP)

    def _heartbeat(self) -> None:
        period = self.ctx.timeout_s / 4
        while True:
            time.sleep(period / 2)
            with self.lock:
                if self._closed:
                    return
                if time.monotonic() - self._last >= period:
                    try:
                        self._send(HEARTBEAT)
                    except TpFault as e:     # the next send on the serving thread reports it too
                        self.beat_fault = e
                        log(f"heartbeat: {e}", rank=self.ctx.layout.rank, all_ranks=True)
                        return


# ----------------------------------------------------------------------------- engines over the channel

# Engine calls that change state on every rank (runtime/executor.py's Engine protocol): the
# paged cache's reserve/release (the block allocator is deterministic, so the same calls give
# every rank the same slots) and the step, whole (serial loop) or its launch (overlapped loop:
# the plan of i+1 is broadcast while i runs; `result` reads the leader's own copy and is not sent).
FORWARDED = ("reserve", "release", "step", "launch")


class LeaderEngine:
    """Leader side of a TP replica: each call in `forwarded` is sent to the workers, then run on
    the local engine while the channel is held, so messages and collectives stay in step on every
    rank. Everything else (max_batch_size, buckets, ...) reads the local engine.
    A TpFault or collective error inside a forwarded call is re-raised as TpFault."""

    def __init__(self, engine, channel: PlanChannel, forwarded: Sequence[str] = FORWARDED):
        self._engine, self._channel, self._forwarded = engine, channel, tuple(forwarded)
        self.fault: TpFault | None = None      # the first fault seen; every later call re-raises it

    def __getattr__(self, name: str):
        attr = getattr(self._engine, name)
        if name not in self._forwarded:
            return attr

        def call(*args, **kwargs):
            if self.fault is not None:
                raise self.fault
            with self._channel.lock:
                try:
                    self._channel.send((name, args, kwargs))
                    return attr(*args, **kwargs)
                except TpFault as e:
                    self.fault = e
                    raise
                except RuntimeError as e:
                    self.fault = TpFault(f"leader: {name} failed in a collective: {_reason(e)}")
                    raise self.fault from e
        return call

    def close(self) -> None:
        self._channel.close()


def serve_worker(engine, channel: PlanChannel) -> int:
    """Worker side: run exactly the calls the leader sends, until it sends STOP. Returns how many."""
    n = 0
    while (msg := channel.recv()) is not None:
        name, args, kwargs = msg
        getattr(engine, name)(*args, **kwargs)
        n += 1
    return n


def run_replica(tp: int, load: Callable[[TpContext], Any], lead: Callable[[Any, TpContext], Any], *,
                device: str | torch.device = "cpu", timeout_s: float | None = None,
                allreduce: str = "auto") -> tuple[TpContext, Any, Any]:
    """The whole life of one rank under `mpirun -n R*tp ... --tp tp`:
        every rank   ctx = init_tp(tp); engine = load(ctx)    (its shard; wrap it here to record steps)
        leaders      result = lead(LeaderEngine(engine), ctx); then STOP to the workers
        workers      serve_worker(engine) until STOP; result None
        every rank   shutdown(ctx): the process groups are gone; ctx.comm (MPI) still works
    Returns (ctx, engine, result). Any exception on any rank aborts the job (abort_on_error).
    tp == 1: every rank is a replica of its own and lead runs on the plain engine."""
    try:
        ctx = init_tp(tp, device=device, timeout_s=timeout_s, allreduce=allreduce)
    except BaseException as e:            # no ctx yet: still end every rank, not only this one
        _abort_world(e)
        raise
    with abort_on_error(ctx):
        engine = load(ctx)
        freeze_heap()                 # every rank: the loaded engine out of the collector's walk (runtime/gc_heap.py)
        if ctx.tp == 1:
            return ctx, engine, lead(engine, ctx)
        ctx.barrier()                 # loading times differ; the channel's timeouts start here
        channel = PlanChannel(ctx)
        if not ctx.layout.is_leader:
            serve_worker(engine, channel)
            result = None
        else:
            leader = LeaderEngine(engine, channel)
            result = lead(leader, ctx)
            leader.close()
        shutdown(ctx)
        return ctx, engine, result


def _abort_world(e: BaseException) -> None:
    """init_tp failed on this rank before a TpContext existed: one line, then MPI Abort of the
    whole job (its peers may be waiting for this rank in a rendezvous or a barrier)."""
    if isinstance(e, SystemExit) and e.code in (0, None):
        return
    comm, rank, size = _mpi_world()
    if comm is not None and size > 1:
        log(f"{type(e).__name__}: {e}; aborting all {size} ranks", rank=rank, all_ranks=True)
        comm.Abort(2 if isinstance(e, DynspecError) else 1)


def shutdown(ctx: TpContext) -> None:
    """Tear down the process groups (every rank, after its last collective). Left to interpreter
    exit, a gloo worker thread can drop its last tensor after Python is gone and abort the
    process ("terminate called without an active exception").

    On CUDA there is no teardown: on 2 H200s a TP=2 rank whose NCCL communicator had been
    captured into CUDA graphs (and whose symmetric-memory buffer its peer had mapped) never
    exited after writing its results. The rank synchronizes and leaves at interpreter exit
    through hard_exit, before any C++ destructor runs."""
    if not (ctx.tp > 1 and torch.distributed.is_initialized()):
        return
    if ctx.device.type != "cuda" and os.environ.get(HARD_EXIT_ENV) != "1":
        torch.distributed.destroy_process_group()
        return
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    hard_exit()


HARD_EXIT_ENV = "DYNSPEC_TP_HARD_EXIT"     # "1": CPU ranks leave the CUDA way too (tests of that exit path)
_HARD_EXIT = []
_EXIT_STATUS = [1]       # until exit_status() hears the CLI's own status, leaving is a failure


def hard_exit() -> None:
    """At interpreter exit: flush, then os._exit with the status the CLI gave `exit_status` (after
    MPI_Finalize), or, if the CLI never got there (an exception after the last collective), status
    1 after MPI Abort, which also releases peers waiting in an MPI barrier. C++ destructors that
    would hang are skipped."""
    if not _HARD_EXIT:
        import atexit

        _HARD_EXIT.append(True)
        atexit.register(_exit_now)       # registered last, so it runs before torch's own handlers


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    status = _EXIT_STATUS[0]
    mpi = sys.modules.get("mpi4py.MPI")          # mpirun counts a rank that skips MPI_Finalize as failed
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        if status != 0 and mpi.COMM_WORLD.Get_size() > 1:
            mpi.COMM_WORLD.Abort(status)
        mpi.Finalize()
    os._exit(status)


def exit_status(code: int | None) -> int | None:
    """Remember the status a CLI's main returns (hard_exit uses it); returns it unchanged.
    None and 0 -> 0; an int -> itself; anything else (a message) -> 1."""
    _EXIT_STATUS[0] = int(code or 0) if isinstance(code, (int, type(None))) else 1
    return code
