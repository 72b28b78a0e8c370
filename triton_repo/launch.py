"""The reference variant under tensor parallelism, launched as TRT-LLM launches its Triton model
(`mpirun -n N trtllm-llmapi-launch tritonserver ...`): MPI rank 0 serves, the other ranks are
workers (docs/serving_with_triton.md, "Tensor parallel").

    mpirun -n 2 -x OMP_NUM_THREADS=1 python -m dynspec.triton_repo.launch REPO --tp 2 [server.py's flags]

    MPI rank 0        checks the launch and refuses a bad one before anything starts (world size vs
                      --tp, the repository, the pair's split); hosts the rendezvous store; runs
                      tritonserver (server.py's serve) with TpLaunch.env() in its environment
    python stub       spawned by tritonserver: model.py's initialize finds that environment and
                      becomes TP rank 0 (TpLeader): joins through the endpoint, loads shard 0,
                      runs the Executor on a LeaderEngine
    MPI ranks 1..N-1  join as TP ranks 1..N-1, load their shards, serve_worker until the leader's STOP

The stub cannot be an MPI rank (tritonserver spawns it), so the N TP ranks meet at a TCPStore the
launcher hosts (runtime/tp_endpoint.py, init_tp_endpoint), not through MPI.

Ending, each bounded in time:
  - SIGTERM / SIGINT to the launcher (its pid is on the ready line): the server stops, the model's
    finalize sends STOP, the workers leave, mpirun exits 0.
  - A worker dies: the leader's next collective fails (at once; a hung worker: after
    DYNSPEC_TP_TIMEOUT_S), open requests end with that error, new ones are refused with it; the
    stub reports the fault to the launcher (FAULT_KEY in its rendezvous store), which stops the server
    and aborts the MPI job (exit 1). mpirun also ends the job by itself when a rank dies.
  - The server or the stub dies: the launcher sees tritonserver exit, removes what is left of it
    and aborts the job; a worker that loses its leader (connection closed, or no heartbeat for
    DYNSPEC_TP_TIMEOUT_S) gives the launcher LEADER_LOST_GRACE_S to do so, then aborts it itself.
  - The launcher dies (SIGKILL, or mpirun's kill after its SIGTERM): tritonserver gets SIGTERM
    from the kernel (server.py's die_with_parent), so no server is left orphaned.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from dynspec.errors import DynspecError

ENV_ENDPOINT = "DYNSPEC_TP_ENDPOINT"            # addr:port of the launcher's rendezvous store
ENV_SIZE = "DYNSPEC_TP_SIZE"                    # N
ENV_JOIN = "DYNSPEC_TP_JOIN_TIMEOUT_S"          # how long the ranks wait for each other to arrive and load
ENV_LOCAL_RANK = "DYNSPEC_TP_LOCAL_RANK"        # launcher's local rank on its host: places device 'cuda'
ENV_ENGINE_DIR = "DYNSPEC_TP_ENGINE_DIR"        # what the workers load; the stub's config.pbtxt must agree
ENV_DEVICE = "DYNSPEC_TP_DEVICE"
MPI_ENV_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "PRTE_")   # rank 0's MPI identity, kept from the server


# ----------------------------------------------------------------------------- what a launch is

@dataclass(frozen=True)
class TpLaunch:
    """What the launcher tells TP rank 0 in the python stub, through its environment."""
    endpoint: str
    tp: int
    engine_dir: str
    device: str
    local_rank: int
    timeout_s: float
    join_timeout_s: float

    def env(self) -> dict[str, str]:
        from dynspec.runtime.tp_layout import TIMEOUT_ENV

        return {ENV_ENDPOINT: self.endpoint, ENV_SIZE: str(self.tp), ENV_ENGINE_DIR: self.engine_dir,
                ENV_DEVICE: self.device, ENV_LOCAL_RANK: str(self.local_rank), TIMEOUT_ENV: repr(self.timeout_s),
                ENV_JOIN: repr(self.join_timeout_s)}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "TpLaunch | None":
        """None without DYNSPEC_TP_ENDPOINT (a plain `server.py` launch); a bad value is an error naming it."""
        from dynspec.runtime.tp_endpoint import parse_endpoint
        from dynspec.runtime.tp_layout import TIMEOUT_ENV

        if ENV_ENDPOINT not in env:
            return None
        missing = [k for k in (ENV_SIZE, ENV_ENGINE_DIR, ENV_DEVICE, ENV_LOCAL_RANK, TIMEOUT_ENV, ENV_JOIN)
                   if k not in env]
        if missing:
            raise DynspecError(f"{ENV_ENDPOINT} is set but {', '.join(missing)} is not: start the server "
                               "through `python -m dynspec.triton_repo.launch`")
        parse_endpoint(env[ENV_ENDPOINT])

        def number(name: str, kind, low):
            try:
                v = kind(env[name])
            except ValueError:
                v = None
            if v is None or not v >= low:
                raise DynspecError(f"environment variable {name}={env[name]!r} must be a number >= {low}")
            return v

        return cls(env[ENV_ENDPOINT], number(ENV_SIZE, int, 1), env[ENV_ENGINE_DIR], env[ENV_DEVICE],
                   number(ENV_LOCAL_RANK, int, 0), number(TIMEOUT_ENV, float, 1e-3), number(ENV_JOIN, float, 1e-3))

    def check_model(self, engine_dir: str, device: str) -> None:
        """The stub's config.pbtxt parameters must name what the workers load."""
        same = {"engine_dir": Path(engine_dir).resolve() == Path(self.engine_dir).resolve(),
                "device": device == self.device}
        for name, mine, theirs in (("engine_dir", engine_dir, self.engine_dir), ("device", device, self.device)):
            if not same[name]:
                raise DynspecError(f"config.pbtxt parameter {name}={mine!r}, but the launcher's workers load "
                                   f"{name}={theirs!r} (from dynspec_repo.json); regenerate the repository with "
                                   "`dynspec triton` instead of editing one of them")


@dataclass(frozen=True)
class RepoLaunch:
    """A checked launch of REPO at --tp N."""
    engine_dir: str
    device: str
    tp: int


def check_launch(repo: str | os.PathLike, world_size: int, tp: int) -> RepoLaunch:
    """Refuse, before anything starts, a launch that cannot work, naming the numbers:
    -n not a multiple of --tp (layout's message), more than one replica, a repository that is not
    the reference variant, a pair that does not split N ways (check_tp), float64 on a GPU."""
    from dynspec.artifacts import read_json
    from dynspec.config import EngineConfig
    from dynspec.runtime.tp_layout import layout
    from dynspec.triton_repo.generate import REPO_MANIFEST

    lay = layout(0, world_size, tp)
    if lay.replicas > 1:
        raise DynspecError(f"mpirun -n {world_size} with --tp {tp} would make {lay.replicas} replicas; one Triton "
                           f"server serves one replica: launch -n {tp} (and another launcher, on other ports, "
                           "for another replica)")
    path = Path(repo) / REPO_MANIFEST
    manifest = read_json(path, "repository manifest")
    if manifest.get("variant") != "reference":
        raise DynspecError(f"{path}: variant {manifest.get('variant')!r}; this launcher runs the 'reference' "
                           "variant (the trtllm-llmapi variant has its own launch_triton.sh)")
    for key in ("engine_dir", "device"):
        if not isinstance(manifest.get(key), str):
            raise DynspecError(f"{path}: field {key!r} is {manifest.get(key)!r}; regenerate the repository "
                               "with `dynspec triton`")
    cfg = EngineConfig.load(manifest["engine_dir"])
    if tp > 1:
        check_split(cfg.target_dir, cfg.draft_dir, tp)
    if cfg.reference.dtype == "float64" and manifest["device"] != "cpu":
        raise DynspecError(f"{Path(manifest['engine_dir']) / 'engine.json'}: reference.dtype float64 is for CPU "
                           f"exactness tests; device {manifest['device']} takes float32, bfloat16 or float16")
    return RepoLaunch(manifest["engine_dir"], manifest["device"], tp)


def check_split(target_dir: str, draft_dir: str, tp: int) -> None:
    """tp.check_tp on the pair's config.json files (no weight is read), as load_tp_engine checks them."""
    from dynspec.checkpoint.hf_config import read_config
    from dynspec.runtime.engines.reference.draft import Eagle3Config
    from dynspec.runtime.engines.reference.model_config import TargetConfig
    from dynspec.runtime.engines.reference.tp import check_tp

    twhere, dwhere = str(Path(target_dir) / "config.json"), str(Path(draft_dir) / "config.json")
    tc = TargetConfig.from_hf(read_config(target_dir, "target"), twhere)
    check_tp(tc, Eagle3Config.from_hf(read_config(draft_dir, "draft"), dwhere, tc), tp, twhere, dwhere)


# ----------------------------------------------------------------------------- every TP rank

def open_rank(cfg, ctx):
    """This rank's shard of cfg's pair as a ready engine; on CUDA (under reference.graphs "full") the
    graphs of every (bucket, K) the engine's policy reaches, captured on every rank in one order (their
    warm-up runs collectives), as open_executor does for one device."""
    from dynspec.runtime.engines.reference.engine import reachable_graphs
    from dynspec.runtime.session import capture, open_reference_engine, policy_of

    policy = policy_of(cfg)
    engine = open_reference_engine(cfg, tp=ctx, max_draft_len=policy.max_draft_len)
    if ctx.device.type == "cuda":
        capture(engine, reachable_graphs([policy], engine.max_batch_size, cfg.reference.keep_warm,
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

        from dynspec.runtime.executor import Executor
        from dynspec.runtime.plan_channel import LeaderEngine, PlanChannel
        from dynspec.runtime.tp_endpoint import init_tp_endpoint, parse_endpoint
        from dynspec.runtime.tp_groups import wait_for_peers

        launch.check_model(engine_dir, device)
        self.ctx = init_tp_endpoint(launch.endpoint, 0, launch.tp, device=device, local_rank=launch.local_rank,
                                    timeout_s=launch.timeout_s, join_timeout_s=launch.join_timeout_s)
        engine = open_rank(cfg, self.ctx)
        wait_for_peers(self.ctx, launch.join_timeout_s)
        self.channel = PlanChannel(self.ctx)
        self.engine = LeaderEngine(engine, self.channel)
        limit = {} if stats_limit is None else {"stats_limit": stats_limit}
        from dynspec.runtime.session import policy_of

        self.executor = Executor(self.engine, policy_of(cfg), keep_warm=cfg.reference.keep_warm,
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
        from dynspec.runtime.tp_groups import TpFault, release_groups

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
    from dynspec.runtime.gc_heap import freeze_heap
    from dynspec.runtime.plan_channel import PlanChannel, serve_worker
    from dynspec.runtime.tp_endpoint import init_tp_endpoint
    from dynspec.runtime.tp_groups import TpFault, abort_on_error, local_rank, wait_for_peers
    from dynspec.runtime.tp_layout import log
    from dynspec.runtime.tp_lifecycle import shutdown

    try:
        ctx = init_tp_endpoint(endpoint, rank, launch.tp, device=launch.device, local_rank=local_rank(),
                               timeout_s=timeout_s, join_timeout_s=join_timeout_s, comm=comm)
    except Exception as e:
        log(f"{type(e).__name__}: {e}; aborting the job", rank=rank, all_ranks=True)
        comm.Abort(1)
        raise
    with abort_on_error(ctx):
        engine = open_rank(EngineConfig.load(launch.engine_dir), ctx)
        freeze_heap()                 # the loaded shard out of the collector's walk (runtime/gc_heap.py)
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


# ----------------------------------------------------------------------------- the CLI

def make_parser():
    """The TP launcher's parser: the server CLI's flags plus --tp."""
    from dynspec.triton_repo import server

    p = server.make_parser("python -m dynspec.triton_repo.launch", __doc__.splitlines()[0])
    p.add_argument("--tp", type=int, metavar="N", help="tensor-parallel ranks (default: the MPI world size)")
    return p


def main(argv: list[str] | None = None) -> int:
    from dynspec.triton_repo import server

    args = make_parser().parse_args(argv)

    from dynspec.runtime.tp_endpoint import host_rendezvous
    from dynspec.runtime.tp_groups import local_rank, mpi_world
    from dynspec.runtime.tp_layout import timeout_from_env

    comm, rank, size = mpi_world()
    tp = size if args.tp is None else args.tp
    checked = timeout_s = error = None
    if rank == 0:                       # one rank reads the files and prints the refusal
        try:
            checked, timeout_s = check_launch(args.repo, size, tp), timeout_from_env()
        except DynspecError as e:
            error = str(e)
            print(f"error: {error}", file=sys.stderr, flush=True)
    if comm is not None:
        checked, timeout_s, error = comm.bcast((checked, timeout_s, error), root=0)
    if error is not None:
        return 2
    if tp == 1:
        return server.serve(args)
    join_s = args.ready_timeout
    try:
        store, endpoint = host_rendezvous(comm, join_s)     # rank 0 holds the store until main returns
    except DynspecError as e:
        if rank == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    if rank != 0:
        return run_worker(checked, endpoint, rank, comm, timeout_s, join_s)
    launch = TpLaunch(endpoint, tp, checked.engine_dir, checked.device, local_rank(), timeout_s, join_s)
    env = {**launch.env(), **{k: None for k in os.environ if k.startswith(MPI_ENV_PREFIXES)}}
    workers = "MPI rank 1 as worker" if tp == 2 else f"MPI ranks 1-{tp - 1} as workers"
    note = (f"  (tp {tp}: TP rank 0 in the python backend, {workers}, rendezvous {endpoint}; "
            f"stop: kill -TERM {os.getpid()})")
    code = server.serve(args, env=env, watch=lambda: read_fault(store), note=note)
    if code != 0:                       # the workers may be waiting to join or serving a dead leader
        print(f"error: tritonserver is stopped; aborting the {size} MPI ranks (exit status {code})",
              file=sys.stderr, flush=True)
        comm.Abort(code)
    return 0


if __name__ == "__main__":
    from dynspec.runtime.tp_lifecycle import exit_status

    sys.exit(exit_status(main()))      # a CUDA worker leaves through hard_exit, which needs this status
