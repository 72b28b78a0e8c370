#!/usr/bin/env bash
# One H200, call 15 (<= 9.5 minutes): call 13 found the whole-forward graphs failing to compile at
# the 8B shape in bf16 (packed chunks of < 128 queries took inductor's decoding kernel, whose
# BLOCK_M then exceeds the 128-query sparse block); packed_attention now forces the main kernel.
#   the chunk GPU tests (piecewise and whole) with that kernel, first;
#   mixed steps side by side: eager / piecewise / piecewise_sdpa / whole;
#   issue 11's varied_vs_fixed with the whole-forward graphs (baseline, regime B lengths, 3 trials).
#   -> $OUT/h200_call15.tar.gz: h200_mixed_step.json, h200_c15_B_{varied,fixed}_whole.*, h200_call15.log
set -uo pipefail
CALL=15 TAG=h200_call15 DEADLINE=${DEADLINE:-565}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage gpu-tests 100 "$PY" -m pytest -q -m gpu -p no:cacheprovider \
  "tests/test_gpu.py::test_chunks_over_several_query_blocks_equal_transformers"
stage mixed-step 170 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --out "$RES/h200_mixed_step.json"
VF=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
    --concurrency 64,256 --modes baseline --waves 3 --trials 3 --min-requests 2 --no-progress
    --acceptance bernoulli:0.5 --max-seq-len 424 --whole-mixed-graphs)
stage varied-B-whole 115 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c15_B_varied_whole"
stage fixed-B-whole "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 \
  --out "$RES/h200_c15_B_fixed_whole"
finish
