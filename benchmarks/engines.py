"""Which engine a benchmark runs, from its flags: --engine-dir DIR, or --target/--draft
(default: the embedded tiny pair). One place, shared by profile and sweep."""
from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

from dynspec.config import DTYPES, MAX_TP, GraphMode
from dynspec.errors import DynspecError
from dynspec.runtime.policy import MAX_BATCH_SIZE, MAX_DRAFT_LEN, DraftSchedule

# Any environment the benchmarks build (mpirun children, trtllm workers) keeps NVLink
# multicast off: NVLS needs a fabric setup these machines do not promise.
BENCH_ENV = {"NCCL_NVLS_ENABLE": "0"}


def apply_bench_env() -> None:
    for k, v in BENCH_ENV.items():
        os.environ.setdefault(k, v)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--engine-dir", metavar="DIR", help="an engine dir written by `dynspec build` (engine.json)")
    g.add_argument("--target", metavar="DIR", help="HF target checkpoint (instead of --engine-dir; default: tiny pair)")
    g.add_argument("--draft", metavar="DIR", help="EAGLE-3 draft checkpoint (with --target)")
    g.add_argument("--schedule", metavar="SPEC", help="the engine's schedule when no --engine-dir is given"
                   " (default '4:4,8:2')")
    g.add_argument("--device", default="cpu", help="cpu | cuda (rank r of mpirun uses cuda:<local rank>) | cuda:N")
    g.add_argument("--dtype", choices=DTYPES,
                   help="reference engine dtype (default: the engine dir's; float64 on CPU only)")
    g.add_argument("--graphs", choices=[m.value for m in GraphMode],
                   help="reference engine on CUDA: full (decode and mixed iterations replay CUDA graphs) or eager"
                        " (default: the engine dir's reference.graphs)")
    g.add_argument("--threads", type=int, help="CPU: torch threads per rank (default 1)")


def add_step_timing_args(p: argparse.ArgumentParser, repeats: int, kernels_help: str) -> None:
    """--trials (modes rotated over them), --repeats (steps per trial), --kernels STEPS, --out:
    the flags of the benchmarks that time single steps (tp_decode, mixed_step)."""
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--kernels", type=int, default=0, metavar="STEPS", help=kernels_help)
    p.add_argument("--out", required=True)


@dataclass(frozen=True)
class EngineChoice:
    config: "object"          # dynspec.config.EngineConfig
    source: str               # "engine dir /x" | "pair target=/a draft=/b"
    engine_dir: str | None


MAX_STEPS = 100_000          # timed or untimed steps per shape, trials, requests: beyond is a typo
# numeric flags of the benchmarks: attribute -> (flag, lowest, highest)
INT_FLAGS = {
    "warmup": ("--warmup", 0, MAX_STEPS), "repeats": ("--repeats", 1, MAX_STEPS),
    "trials": ("--trials", 1, 1000), "kernels": ("--kernels", 0, MAX_STEPS),
    "num_requests": ("--num-requests", 1, MAX_STEPS), "min_requests": ("--min-requests", 1, MAX_STEPS),
    "warmup_requests": ("--warmup-requests", 0, MAX_STEPS),
    "acceptance_concurrency": ("--acceptance-concurrency", 1, MAX_BATCH_SIZE),
    "static_k": ("--static-k", 0, MAX_DRAFT_LEN), "seed": ("--seed", 0, 2**63 - 1),
    "context_len": ("--context-len", 1, MAX_BATCH_SIZE), "max_seq_len": ("--max-seq-len", 1, MAX_BATCH_SIZE),
    "tp": ("--tp", 1, MAX_TP),
}
LIST_FLAGS = {"batch_sizes": ("--batch-sizes", 1, MAX_BATCH_SIZE), "draft_lens": ("--draft-lens", 0, MAX_DRAFT_LEN),
              "concurrency": ("--concurrency", 1, MAX_BATCH_SIZE),
              "context_lens": ("--context-lens", 1, MAX_BATCH_SIZE)}
POSITION_FLAGS = ("context_len", "max_seq_len")     # at most the target's max_position_embeddings


def check_bench_flags(args: argparse.Namespace) -> None:
    """Every numeric flag a benchmark has lies in its range (INT_FLAGS, LIST_FLAGS), one line
    naming flag, value and range: `profile --draft-lens 1000` -> "--draft-lens 1000 is outside 0..32"."""
    bounds = dict(INT_FLAGS, threads=("--threads", 1, os.cpu_count() or 1))
    for attr, (flag, lo, hi) in bounds.items():
        v = getattr(args, attr, None)
        if isinstance(v, int) and not lo <= v <= hi:
            raise DynspecError(f"{flag} {v} is outside {lo}..{hi}")
    waves = getattr(args, "waves", None)
    if isinstance(waves, float) and not (math.isfinite(waves) and 0 < waves <= MAX_STEPS):
        raise DynspecError(f"--waves {waves} is outside (0, {MAX_STEPS}]")
    for attr, (flag, lo, hi) in LIST_FLAGS.items():
        text = getattr(args, attr, None)
        if not isinstance(text, str) or not text.strip():
            continue
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise DynspecError(f"{flag} {text!r} is not a comma-separated list of integers") from None
        bad = next((v for v in vals if not lo <= v <= hi), None)
        if bad is not None:
            raise DynspecError(f"{flag} {text!r}: {bad} is outside {lo}..{hi}")


def check_positions(args: argparse.Namespace, cfg) -> None:
    """--context-len / --context-lens / --max-seq-len / synthetic --input-len + --output-len fit the target's
    max_position_embeddings (the cache is refused beyond it: runtime/generate/session.py)."""
    from dynspec.runtime.generate.session import check_positions as within

    for attr in POSITION_FLAGS:
        v = getattr(args, attr, None)
        if isinstance(v, int):
            within(cfg.target_dir, v, INT_FLAGS[attr][0])
    ctxs = getattr(args, "context_lens", None)
    if isinstance(ctxs, str) and ctxs.strip():
        within(cfg.target_dir, max(int(x) for x in ctxs.split(",") if x.strip()), "--context-lens")
    if getattr(args, "input_len", None) is not None and not getattr(args, "dataset", None) \
            and hasattr(args, "waves"):
        from dynspec.benchmarks.workload import LengthDist

        il, ol = LengthDist.parse(args.input_len, "--input-len"), LengthDist.parse(args.output_len, "--output-len")
        within(cfg.target_dir, il.hi + ol.hi, f"--input-len+--output-len (the longest request: {il.hi} + {ol.hi})")


def engine_choice(args: argparse.Namespace) -> EngineChoice:
    from dynspec.config import EngineConfig
    from dynspec.runtime.generate.session import engine_config_for, tiny_pair_dirs

    if args.engine_dir:
        if args.target or args.draft:
            raise DynspecError("give either --engine-dir or --target/--draft, not both")
        cfg = EngineConfig.load(args.engine_dir)
        check_row_flags(args, cfg)
        if args.schedule:
            cfg = replace(cfg, schedule=DraftSchedule.parse(args.schedule))
        src, edir = f"engine dir {args.engine_dir}", str(args.engine_dir)
    else:
        if bool(args.target) != bool(args.draft):
            raise DynspecError("--target and --draft go together")
        target, draft = (args.target, args.draft) if args.target else tiny_pair_dirs()
        for what, d in (("target", target), ("draft", draft)):
            if not (Path(d) / "config.json").is_file():
                raise DynspecError(f"{what} checkpoint {d} has no config.json")
        cfg = engine_config_for(target, draft, DraftSchedule.parse(args.schedule or "4:4,8:2"))
        src, edir = f"pair target={target} draft={draft}", None
    check_bench_flags(args)
    check_positions(args, cfg)
    ref = cfg.reference
    if args.dtype:
        ref = replace(ref, dtype=args.dtype)
    if getattr(args, "graphs", None):
        ref = replace(ref, graphs=GraphMode(args.graphs))
    return EngineChoice(replace(cfg, reference=ref), src, edir)


# the flags with which a benchmark asks for rows in flight: (attribute, flag, parser)
ROW_FLAGS = (("concurrency", "--concurrency", "list"), ("batch_sizes", "--batch-sizes", "list"),
             ("acceptance_concurrency", "--acceptance-concurrency", "int"))


def check_row_flags(args: argparse.Namespace, cfg) -> None:
    """Every row count a benchmark's flags ask for fits the engine dir's batch limit
    (dynspec.config.check_batch_limit): `profile --batch-sizes 1,256` on an engine dir of max
    batch size 8 is refused, naming 256 and 8."""
    from dynspec.benchmarks.flags import int_list
    from dynspec.config import check_batch_limit

    for attr, flag, kind in ROW_FLAGS:
        v = getattr(args, attr, None)
        if v is None or (kind == "list" and not str(v).strip()):
            continue
        if attr == "acceptance_concurrency" and not getattr(args, "measure_acceptance", False):
            continue
        asked = max(int_list(v, flag)) if kind == "list" else v
        check_batch_limit(flag, asked, cfg, args.engine_dir, getattr(args, "engine", "reference"))


def set_cpu_threads(threads: int | None, device: str) -> int | None:
    """On CPU, torch threads per rank: `threads`, default 1. CPU runs are for tiny models, whose
    steps are per-op overhead; more intra-op threads gain little there, and when any other
    process wants a core their OpenMP barriers stall whole steps (a 1 ms step measured 50-500 ms
    with 2 threads on 2 busy cores). Returns the count set, or None on GPU."""
    if not device.startswith("cpu"):
        return None
    import torch

    n = 1 if threads is None else threads
    cores = os.cpu_count() or 1
    if not 1 <= n <= cores:
        raise DynspecError(f"--threads {n} is outside 1..{cores} (this machine's cores)")
    torch.set_num_threads(n)
    return n


def device_for_rank(device: str, local_rank: int) -> str:
    """'cuda' -> 'cuda:<local rank>' (one replica per GPU); anything else unchanged."""
    return f"cuda:{local_rank}" if device == "cuda" else device


def target_vocab_size(cfg) -> int | None:
    """vocab_size from the target's HF config.json (None when it does not say)."""
    try:
        return int(json.loads((Path(cfg.target_dir) / "config.json").read_text())["vocab_size"])
    except (OSError, KeyError, ValueError, TypeError):
        return None


def target_tokenizer(cfg):
    """A callable str -> ids from the target dir's tokenizer, or None when it has none."""
    d = Path(cfg.target_dir)
    if not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d))
    return lambda text: tok(text)["input_ids"]


def open_reference(cfg, *, device: str, max_batch_size: int, max_seq_len: int, max_draft_len: int):
    """The reference engine sized for exactly what a benchmark needs: the KV cache is
    max_batch_size x max_seq_len and drafts go up to max_draft_len (the engine dir's own sizes
    and its schedule's K do not enlarge it: every request must fit prompt + output + K + 1)."""
    from dynspec.runtime.generate.session import open_reference_engine

    return open_reference_engine(replace(cfg, schedule=DraftSchedule()), device=device, max_draft_len=max_draft_len,
                                 max_batch_size=max_batch_size, max_seq_len=max_seq_len)


def versions() -> dict:
    """Versions of what produced a number (tensorrt_llm only if importable; never imported eagerly elsewhere)."""
    import platform
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("dynspec", "torch", "transformers", "numpy", "mpi4py", "tensorrt_llm"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        idx = torch.device(device).index or 0
        return f"{device} ({torch.cuda.get_device_name(idx)})"
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def graphs_run(cfg, device: str) -> str:
    """The GraphMode value a reference run on `device` ran under: cfg's on CUDA, "eager" elsewhere."""
    return cfg.reference.graphs.value if str(device).startswith("cuda") else GraphMode.EAGER.value


def open_sized(cfg, *, device: str, max_batch_size: int, max_seq_len: int, max_draft_len: int, tp=None):
    """open_reference's engine, or (tp: this rank's TpContext) its shard on tp.device."""
    from dynspec.runtime.generate.session import open_reference_engine

    sizes = dict(max_batch_size=max_batch_size, max_seq_len=max_seq_len, max_draft_len=max_draft_len)
    if tp is None:
        return open_reference(cfg, device=device, **sizes)
    return open_reference_engine(replace(cfg, schedule=DraftSchedule()), tp=tp, **sizes)
