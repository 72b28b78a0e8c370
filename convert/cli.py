"""`dynspec convert target` and `dynspec convert eagle3`."""
from __future__ import annotations

import argparse


def _count(n: int) -> str:
    """70553706496 -> '70.55B'; 1234567 -> '1.23M'; 4321 -> '4321'."""
    for div, unit in ((1e9, "B"), (1e6, "M")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _cmd_target(args: argparse.Namespace) -> int:
    from dynspec.convert.target import TargetOptions, convert_target

    opts = TargetOptions(tp=args.tp, dtype=args.dtype, quant=args.quant, max_shard_bytes=args.max_shard_bytes)
    m = convert_target(args.hf, args.out, opts, force=args.force)
    print(f"wrote {args.out}: {m['architecture']} {_count(m['parameter_count'])} params, "
          f"{m['weight_bytes_per_rank'] / 2**30:.2f} GiB weights and "
          f"{m['kv_bytes_per_token_per_rank']} KV bytes/token per rank at tp={m['tp']}")
    return 0


def _cmd_eagle3(args: argparse.Namespace) -> int:
    from dynspec.convert.eagle3 import convert_eagle3

    m = convert_eagle3(args.draft, args.target, args.out, tp=args.tp, dtype=args.dtype, force=args.force)
    print(f"wrote {args.out}: EAGLE-3 draft, capture layers {m['capture_layers']} ({m['capture_layers_source']}), "
          f"draft vocab {m['draft_vocab_size']}, {m['weight_bytes_per_rank'] / 2**20:.1f} MiB per rank")
    return 0


def register(sub) -> None:
    p = sub.add_parser("convert", help="check and convert HF checkpoints for a TP deployment")
    csub = p.add_subparsers(dest="convert_kind", required=True)

    t = csub.add_parser("target", help="HF Llama-family target -> normalized checkpoint + dynspec.json")
    t.add_argument("--hf", required=True, metavar="DIR", help="HF folder: config.json + safetensors")
    t.add_argument("--out", required=True, metavar="DIR", help="the converted checkpoint (created)")
    t.add_argument("--tp", type=int, default=8, help="tensor parallel ranks the shapes are checked for")
    t.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="weights' dtype")
    t.add_argument("--quant", choices=("fp8",), help="FP8 weights via NVIDIA ModelOpt (must be importable)")
    t.add_argument("--max-shard-bytes", type=int, default=5 * 10**9, help="largest safetensors shard, bytes")
    t.add_argument("--force", action="store_true", help="replace a non-empty --out")
    t.set_defaults(func=_cmd_target)

    e = csub.add_parser("eagle3", help="public EAGLE-3 draft -> TRT-LLM two-model draft layout + dynspec.json")
    e.add_argument("--draft", required=True, metavar="DIR", help="EAGLE-3 folder: config.json + weights")
    e.add_argument("--target", required=True, metavar="DIR", help="the target converted by `convert target`")
    e.add_argument("--out", required=True, metavar="DIR", help="the converted draft (created)")
    e.add_argument("--tp", type=int, default=8, help="tensor parallel ranks, as the target's")
    e.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="default: the target's dtype")
    e.add_argument("--force", action="store_true", help="replace a non-empty --out")
    e.set_defaults(func=_cmd_eagle3)
