"""The TP ranks of the Triton launch (triton_repo/launch.py; docs/serving_with_triton.md, "Tensor
parallel"): TP rank 0 inside the python stub (TpLeader, model.py's shell), MPI ranks 1..N-1 as
workers (run_worker), and the fault rank 0 leaves for the launcher (FAULT_KEY, read_fault)."""
from __future__ import annotations

import time

from dynspec.triton_repo.launch_spec import RepoLaunch, TpLaunch


# ----------------------------------------------------------------------------- every TP rank

def open_rank(cfg, ctx):
    """This rank's shard of cfg's pair as a ready engine; on CUDA (under reference.graphs "full") the
    graphs of every (bucket, K) the engine's policy reaches, captured on every rank in one order (their
    warm-up runs collectives), as open_executor does for one device."""
    from dynspec.runtime.engines.reference.engine import reachable_graphs
    from dynspec.runtime.generate.session import capture, open_reference_engine, policy_of

    policy = policy_of(cfg)
    engine = open_reference_engine(cfg, tp=ctx, max_draft_len=policy.max_draft_len)
    if ctx.device.type == "cuda":
        capture(engine, reachable_graphs([policy], engine.max_batch_size, cfg.reference.draft_sync,
                                         engine.max_num_tokens), cfg.reference, strict=False)
    return engine


class TpLeader:
    """TP rank 0 inside the python stub, Triton-free (model.py is its shell): joins the workers,
    loads shard 0 and runs the Executor on a LeaderEngine, so every engine call goes to every rank.

        leader = TpLeader(TpLaunch.from_env(os.environ), cfg, engine_dir, device)
        leader.executor.submit(...)       # as open_executor's
        leader.fault()                    # None, or why the group is gone (then every request fails)
        leader.report()                   # tell the launcher (once); it stops the server
        leader.close()                    # STOP to the workers, process groups torn down
    """

    def __init__(self, launch: TpLaunch, cfg, engine_dir: str, device: str, stats_limit: int | None = None):
        import datetime

        import torch.distributed as dist

        from dynspec.runtime.serving.executor import Executor
        from dynspec.runtime.serving.plan_channel import LeaderEngine, PlanChannel
        from dynspec.runtime.tp.tp_endpoint import init_tp_endpoint
        from dynspec.runtime.tp.tp_groups import parse_endpoint, wait_for_peers

        launch.check_model(engine_dir, device)
        self.ctx = init_tp_endpoint(launch.endpoint, 0, launch.tp, device=device, local_rank=launch.local_rank,
                                    timeout_s=launch.timeout_s, join_timeout_s=launch.join_timeout_s)
        engine = open_rank(cfg, self.ctx)
        wait_for_peers(self.ctx, launch.join_timeout_s)
        self.channel = PlanChannel(self.ctx)
        self.engine = LeaderEngine(engine, self.channel)
        limit = {} if stats_limit is None else {"stats_limit": stats_limit}
        from dynspec.runtime.generate.session import policy_of

        self.executor = Executor(self.engine, policy_of(cfg), draft_sync=cfg.reference.draft_sync,
                                 loop=cfg.reference.loop(engine.device), **limit)
        # the launcher's store: where report() leaves a fault (it lives and dies with the launcher)
        self._store = dist.TCPStore(*parse_endpoint(launch.endpoint), None, False,
                                    timeout=datetime.timedelta(seconds=launch.timeout_s))
        self._reported = False

    def fault(self) -> str | None:
        """The first fault of the group: seen by an engine call, or by the heartbeat while idle."""
        f = self.engine.fault or self.channel.beat_fault
        return None if f is None else str(f)

    def report(self) -> str | None:
        """fault(); the first time there is one, left in the launcher's store (FAULT_KEY)."""
        f = self.fault()
        if f is not None and not self._reported:
            self._store.set(FAULT_KEY, f)
            self._reported = True          # only once the launcher can see it: a failed set is retried
        return f

    def close(self, teardown_s: float = 5.0) -> str | None:
        """STOP to the workers, then the process groups go (bounded). None, or what went wrong."""
        from dynspec.runtime.tp.tp_groups import TpFault, release_groups

        problem = None
        try:
            self.channel.close()
        except TpFault as e:
            problem = f"STOP did not reach the workers: {e}"
        if self.ctx.device.type == "cuda":
            # no destroy_process_group on CUDA: with NCCL captured into graphs it never returned
            # on 2 H200s (tp_lifecycle.shutdown); the stub's process ends with tritonserver's
            import torch

            torch.cuda.synchronize()
            return problem
        if not release_groups(self.ctx, teardown_s):
            problem = (problem + "; " if problem else "") + f"process group teardown gave up after {teardown_s:g} s"
        return problem


FAULT_KEY = "dynspec/tp_fault"


def read_fault(store) -> str | None:
    """The fault TP rank 0 left in the rendezvous store, as the launcher prints it; None while none."""
    if not store.check([FAULT_KEY]):
        return None
    text = store.get(FAULT_KEY).decode(errors="replace").strip()
    return f"TP rank 0 (the python stub) reported a fault: {text or '(no message)'}"


LEADER_LOST_GRACE_S = 3.0              # > server.WATCH_S + the time to stop a dead server's group


def run_worker(launch: RepoLaunch, endpoint: str, rank: int, comm, timeout_s: float, join_timeout_s: float) -> int:
    """MPI rank `rank` >= 1 as TP rank `rank`: join, load its shard, serve the leader's calls until
    STOP. Any failure aborts the MPI job (abort_on_error), which ends the launcher and its server."""
    from dynspec.config import EngineConfig
    from dynspec.runtime.serving.gc_heap import freeze_heap
    from dynspec.runtime.serving.plan_channel import PlanChannel, serve_worker
    from dynspec.runtime.tp.tp_endpoint import init_tp_endpoint
    from dynspec.runtime.tp.tp_groups import TpFault, abort_on_error, local_rank, wait_for_peers
    from dynspec.runtime.tp.tp_layout import log
    from dynspec.runtime.tp.tp_lifecycle import shutdown

    try:
        ctx = init_tp_endpoint(endpoint, rank, launch.tp, device=launch.device, local_rank=local_rank(),
                               timeout_s=timeout_s, join_timeout_s=join_timeout_s, comm=comm)
    except Exception as e:
        log(f"{type(e).__name__}: {e}; aborting the job", rank=rank, all_ranks=True)
        comm.Abort(1)
        raise
    with abort_on_error(ctx):
        engine = open_rank(EngineConfig.load(launch.engine_dir), ctx)
        freeze_heap()                 # the loaded shard out of the collector's walk (runtime/serving/gc_heap.py)
        wait_for_peers(ctx, join_timeout_s)
        try:
            calls = serve_worker(engine, PlanChannel(ctx))
        except TpFault:
            # The leader is gone with its server, most likely. The launcher sees that within
            # WATCH_S, stops what is left of the server (its /dev/shm regions included) and
            # aborts the job itself; an abort from here first would kill it mid-cleanup.
            time.sleep(LEADER_LOST_GRACE_S)
            raise
        log(f"STOP from the leader after {calls} calls", rank=rank, all_ranks=True)
        shutdown(ctx)
    return 0
