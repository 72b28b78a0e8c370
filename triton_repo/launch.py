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
launcher hosts (runtime/tp/tp_endpoint.py, init_tp_endpoint), not through MPI.

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
from pathlib import Path

from dynspec.errors import DynspecError
from dynspec.triton_repo.launch_spec import RepoLaunch, TpLaunch

MPI_ENV_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "PRTE_")   # rank 0's MPI identity, kept from the server


def check_launch(repo: str | os.PathLike, world_size: int, tp: int) -> RepoLaunch:
    """Refuse, before anything starts, a launch that cannot work, naming the numbers:
    -n not a multiple of --tp (layout's message), more than one replica, a repository that is not
    the reference variant, a pair that does not split N ways (check_tp), float64 on a GPU."""
    from dynspec.artifacts import read_json
    from dynspec.config import EngineConfig
    from dynspec.runtime.tp.tp_layout import layout
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
    """tp_shard.check_tp on the pair's config.json files (no weight is read), as load_tp_engine checks them."""
    from dynspec.checkpoint.hf_config import read_config
    from dynspec.runtime.engines.reference.draft import Eagle3Config
    from dynspec.runtime.engines.reference.model_config import TargetConfig
    from dynspec.runtime.engines.reference.tp_shard import check_tp

    twhere, dwhere = str(Path(target_dir) / "config.json"), str(Path(draft_dir) / "config.json")
    tc = TargetConfig.from_hf(read_config(target_dir, "target"), twhere)
    check_tp(tc, Eagle3Config.from_hf(read_config(draft_dir, "draft"), dwhere, tc), tp, twhere, dwhere)


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

    from dynspec.runtime.tp.tp_groups import host_rendezvous, local_rank, mpi_world
    from dynspec.runtime.tp.tp_layout import timeout_from_env
    from dynspec.triton_repo.tp_ranks import read_fault, run_worker

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
    from dynspec.runtime.tp.tp_lifecycle import exit_status

    sys.exit(exit_status(main()))      # a CUDA worker leaves through hard_exit, which needs this status
