"""The whole life of one rank under mpirun (run_replica: init_tp, load, lead or serve, shutdown)
and how it ends: the process groups torn down, or on CUDA the hard exit at interpreter exit with
the status the CLI gave exit_status.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import torch

from dynspec.errors import DynspecError
from dynspec.runtime.serving.gc_heap import freeze_heap
from dynspec.runtime.serving.plan_channel import LeaderEngine, PlanChannel, serve_worker
from dynspec.runtime.tp.tp_groups import TpContext, _mpi_world, abort_on_error, init_tp
from dynspec.runtime.tp.tp_layout import log


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
        freeze_heap()                 # every rank: the loaded engine out of the collector's walk (runtime/serving/gc_heap.py)
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
