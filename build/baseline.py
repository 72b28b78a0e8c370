"""The no-speculation baseline: a plain TP target engine from TRT-LLM's legacy TensorRT flow
(examples/models/core/llama/convert_checkpoint.py -> trtllm-build). That flow has no EAGLE-3
and no per-batch draft length; it is only what the benchmarks compare against.

The script builds into baseline_trt_engine.tmp/ and renames it into place when both steps
succeed, so a failed build leaves no half-written engine.
"""
from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dynspec.errors import DynspecError

SCRIPT = "build_baseline_trt_engine.sh"
OUT_DIR = "baseline_trt_engine"
CONVERT = "models/core/llama/convert_checkpoint.py"


@dataclass(frozen=True)
class BaselineSpec:
    target_dir: str            # absolute
    tp: int
    dtype: str
    max_batch_size: int
    max_seq_len: int
    max_num_tokens: int


def baseline_commands(b: BaselineSpec, out: str = f"$HERE/{OUT_DIR}.tmp") -> list[list[str]]:
    """argv of the two legacy steps (shell variables left for the script to expand)."""
    return [
        ["python3", f"$TRTLLM_EXAMPLES_DIR/{CONVERT}", "--model_dir", b.target_dir,
         "--output_dir", f"{out}/checkpoint", "--dtype", b.dtype, "--tp_size", str(b.tp)],
        ["trtllm-build", "--checkpoint_dir", f"{out}/checkpoint", "--output_dir", f"{out}/engine",
         "--gemm_plugin", "auto", "--max_batch_size", str(b.max_batch_size),
         "--max_input_len", str(b.max_seq_len - 1), "--max_seq_len", str(b.max_seq_len),
         "--max_num_tokens", str(b.max_num_tokens)],
    ]


def _shell(argv: list[str]) -> str:
    """Quote for bash, keeping $VARS expandable inside double quotes."""
    return " ".join(f'"{a}"' if "$" in a else shlex.quote(a) for a in argv)


def baseline_script(b: BaselineSpec) -> str:
    convert, build = baseline_commands(b)
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# Baseline for the benchmarks: plain TP={b.tp} target engine, no speculation, built with",
        "# TensorRT-LLM's legacy TensorRT flow. Written by `dynspec build --baseline-trt-engine`.",
        "set -euo pipefail",
        ': "${TRTLLM_EXAMPLES_DIR:?set TRTLLM_EXAMPLES_DIR to the examples/ folder of a TensorRT-LLM checkout}"',
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'rm -rf "$HERE/{OUT_DIR}.tmp"',
        _shell(convert),
        _shell(build),
        f'rm -rf "$HERE/{OUT_DIR}"',
        f'mv "$HERE/{OUT_DIR}.tmp" "$HERE/{OUT_DIR}"',
        f'echo "baseline engine: $HERE/{OUT_DIR}/engine"',
        "",
    ])


def run_baseline(engine_dir: Path) -> None:
    script = Path(engine_dir) / SCRIPT
    proc = subprocess.run(["bash", str(script)], check=False)
    if proc.returncode != 0:
        raise DynspecError(f"{script} exited with status {proc.returncode}; the engine dir itself is complete")
