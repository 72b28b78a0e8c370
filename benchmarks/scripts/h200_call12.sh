#!/usr/bin/env bash
# One H200, call 12 (<= 8.5 minutes): prompt chunks through PackedChunks (one FlexAttention launch a
# layer), the draft's q row-major, PackedChunks compiled before serving (warm_chunks).
#   GPU tests (graphs == eager == transformers: the compiled block lists are checked only here);
#   mixed steps: eager, piecewise, and piecewise with gathered-SDPA chunks, side by side;
#   the baseline with regime B's lengths fixed, then varied, at C=64 and 256 (varied_vs_fixed);
#   regime B at C=64, 3 modes, 3 trials, if time is left.
#   -> $OUT/h200_call12.tar.gz: h200_mixed_step.json, h200_B_fixed.*, h200_B_varied.*, h200_B64.*, h200_call12.log
set -uo pipefail
CALL=12 TAG=h200_call12 DEADLINE=${DEADLINE:-500}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage gpu-tests 80 "$PY" -m pytest -q -m gpu tests/test_gpu.py -k "graphs_equal and flex" -p no:cacheprovider
stage mixed-step 85 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --out "$RES/h200_mixed_step.json"
VF=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
    --concurrency 64,256 --modes baseline --waves 3 --trials 3 --min-requests 2 --warmup-requests 0 --no-progress
    --acceptance bernoulli:0.5 --max-seq-len 424)
stage fixed-B 90 "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_B_fixed"
stage varied-B 100 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_B_varied"
stage C64-B "$(( $(left) - 3 ))" "$PY" -m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" \
  --device cuda --dtype bfloat16 --concurrency 64 --modes baseline,static,dynamic --waves 1 --trials 3 \
  --min-requests 2 --warmup-requests 0 --no-progress --static-k 7 --dynamic-schedule @benchmarks/results/h200_B_schedule.txt \
  --acceptance bernoulli:0.5 --input-len 64:192 --output-len 32:224 --max-seq-len 424 --out "$RES/h200_B64"
finish
