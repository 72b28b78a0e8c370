"""`dynspec build`: converted target + draft -> ENGINE_DIR for TRT-LLM's PyTorch backend."""
from __future__ import annotations

import argparse
import sys

from dynspec.config import DTYPES


def _cmd_build(args: argparse.Namespace) -> int:
    from dynspec.artifacts import check_apart, check_writable
    from dynspec.build.baseline import SCRIPT, run_baseline
    from dynspec.build.engine_dir import BuildRequest, plan_build, write_engine_dir
    from dynspec.build.plan import format_plan
    from dynspec.errors import DynspecError
    from dynspec.runtime.policy.prefill_cap import json_form, parse_cap
    from dynspec.runtime.policy.schedule_args import schedule_of

    if args.out is None and not args.plan:
        raise DynspecError("--out ENGINE_DIR is required (or pass --plan to print the memory plan only)")
    if args.run and not args.baseline_trt_engine:
        raise DynspecError("--run executes the baseline script; it needs --baseline-trt-engine")
    if args.out is not None:
        check_apart(args.out, {"--target": args.target, "--draft": args.draft,
                               **({"--cost-model": args.cost_model} if args.cost_model else {})})
        check_writable(args.out, folder=True)
    req = BuildRequest(
        target=args.target, draft=args.draft, schedule=schedule_of(args), tp=args.tp,
        trtllm_version=args.trtllm_version, max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len,
        kv_cache_fraction=args.kv_cache_fraction, min_draft_len=args.min_draft_len, gpu_mem_gb=args.gpu_mem_gb,
        baseline=args.baseline_trt_engine, reference_dtype=args.reference_dtype,
        reference_max_batch_size=args.reference_max_batch_size, reference_max_seq_len=args.reference_max_seq_len,
        max_num_tokens=args.max_num_tokens, cost_model=args.cost_model, ttft_weight=args.ttft_weight,
        prefill_k=None if args.prefill_k is None else json_form(parse_cap(args.prefill_k)),   # @FILE read once, here
    )
    bp = plan_build(req)
    if args.plan:
        print(format_plan(bp.plan, req.tp))
    cfg = write_engine_dir(req, bp, args.out, force=args.force) if args.out is not None else None
    for w in bp.warnings:                 # after the work: a refused build prints its error alone
        print(w, file=sys.stderr)
    if cfg is None:
        return 0
    print(f"wrote {args.out}: schedule {cfg.schedule} -> TRT-LLM {cfg.trtllm_version} draft_len_schedule "
          f"{bp.options['speculative_config']['draft_len_schedule']}, tp={cfg.tp}, max_batch_size {cfg.max_batch_size}")
    if args.baseline_trt_engine:
        print(f"baseline script: {args.out}/{SCRIPT}")
        if args.run:
            run_baseline(args.out)
    return 0


def register(sub) -> None:
    from dynspec.runtime.policy.schedule_args import add_prefill_k_arg, add_schedule_args, add_ttft_weight_arg

    p = sub.add_parser("build", help="engine dir: TRT-LLM LLM-API options + engine.json (+ baseline script)")
    p.add_argument("--target", required=True, metavar="DIR", help="target from `dynspec convert target`")
    p.add_argument("--draft", required=True, metavar="DIR", help="draft from `dynspec convert eagle3`")
    p.add_argument("--out", metavar="ENGINE_DIR", help="the engine dir (created; required unless --plan)")
    p.add_argument("--tp", type=int, default=8, help="tensor parallel ranks, as converted")
    add_schedule_args(p)
    p.add_argument("--trtllm-version", default="1.2.1",
                   help="TRT-LLM release the options are rendered for: 1.2.x (the default pin 1.2.1), 1.3.x or 1.4.x")
    p.add_argument("--max-batch-size", type=int, default=256, help="TRT-LLM's max_batch_size")
    p.add_argument("--max-seq-len", type=int, help="default: min(4096, the target's max_position_embeddings)")
    p.add_argument("--max-num-tokens", type=int, metavar="N",
                   help="tokens per iteration, decode rows x (K+1) + prompt chunks (TRT-LLM and reference engine;"
                        " default: TRT-LLM max(8192, largest decode iteration), reference 8192); at least max K + 1")
    p.add_argument("--kv-cache-fraction", type=float, default=0.9, help="kv_cache_config.free_gpu_memory_fraction")
    p.add_argument("--min-draft-len", type=int, default=0,
                   help="floor K at this value up to --max-batch-size (1 avoids the K=0 stale-draft trap)")
    p.add_argument("--plan", action="store_true", help="print the per-rank memory plan (writes only with --out)")
    p.add_argument("--gpu-mem-gb", type=float, default=141.0, help="GPU memory for --plan, GB = 1e9 bytes (H200: 141)")
    p.add_argument("--baseline-trt-engine", action="store_true",
                   help="also write the legacy convert_checkpoint.py + trtllm-build script for a no-speculation engine")
    p.add_argument("--run", action="store_true", help="execute the baseline script after writing it")
    p.add_argument("--force", action="store_true", help="replace a non-empty ENGINE_DIR")
    add_ttft_weight_arg(p, "the policy's; kept in engine.json ttft_weight")
    add_prefill_k_arg(p, "the schedule's K; kept in engine.json prefill_k")
    p.add_argument("--cost-model", metavar="PROFILE.json",
                   help="a `dynspec profile` JSON: copied to ENGINE_DIR/cost_model.json and engine.json policy "
                        "'adaptive' (the reference engine picks K from it and the measured acceptance)")
    ref = p.add_argument_group("reference engine settings (engine.json 'reference')")
    ref.add_argument("--reference-dtype", default="float32", choices=DTYPES, help="the reference engine's dtype")
    ref.add_argument("--reference-max-batch-size", type=int, help="default: min(64, --max-batch-size)")
    ref.add_argument("--reference-max-seq-len", type=int, help="default: min(1024, the max seq len)")
    p.set_defaults(func=_cmd_build)
