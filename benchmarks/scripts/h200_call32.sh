#!/usr/bin/env bash
# One H200, call 32 (<= 9.8 minutes), after call 31 on the same machine (the engine reused):
#   the varied and fixed baselines at C=256 (regime B lengths, 12 waves, 3 trials);
#   regime B (baseline / static K=7 / dynamic with call 27's schedule, tuned on this engine's decode
#   steps, 3 trials, varied lengths) at C=1, 4, 16, 64 and 256.
#   -> $OUT/h200_call32.tar.gz
set -uo pipefail
CALL=32 TAG=h200_call32 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
VF=("${BASELINE_SWEEP[@]}" --concurrency 256 --waves 12)
stage varied-B256 170 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c32_B256_varied"
stage fixed-B256 150 "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c32_B256_fixed"
B=("${REGIME_B_SWEEP[@]}" --dynamic-schedule @benchmarks/results/h200_c27_B_schedule.txt)
stage B-small-C 120 "$PY" "${B[@]}" --concurrency 1,4,16,64 --out "$RES/h200_c32_B"
stage B256 "$(( $(left) - 3 ))" "$PY" "${B[@]}" --concurrency 256 --out "$RES/h200_c32_B256"
finish
