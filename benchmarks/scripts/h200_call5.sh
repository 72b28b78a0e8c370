#!/usr/bin/env bash
# One H200, call 5 (<= 9 minutes): the regime-A profile at TP=1 with --floor (decode_vs_gemm_floor;
# the floor decodes at 1024 context, so the cache is 1032 long here) and its tuned schedule; the
# baseline at C=64 and 256 with regime B's mean lengths fixed (128/128), then varied (64..192 /
# 32..224), 3 waves each so that finished rows are refilled while others decode (steady_tok_per_s).
#   -> $OUT/h200_call5.tar.gz: h200x2_A_tp1_*, h200_B_fixed.*, h200_B_varied.*, h200_call5.log
set -uo pipefail
CALL=5 TAG=h200_call5 DEADLINE=${DEADLINE:-540}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
TP=1 TP_LIMIT=120 PROFILE_EXTRA="--floor --max-seq-len 1032" . "$here/h200x2_regime_a_tp.sh"
VF=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
    --concurrency 64,256 --modes baseline --waves 3 --trials 3 --min-requests 2 --warmup-requests 0 --no-progress
    --acceptance bernoulli:0.5 --max-seq-len 424)
stage fixed-B 150 "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_B_fixed"
stage varied-B "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_B_varied"
finish
