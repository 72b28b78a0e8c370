#!/usr/bin/env bash
# One H200, call 10 (<= 9.5 minutes), after call 9 on the same tree: the baseline at C=64 and 256
# with regime B's mean lengths fixed (128/128), then varied (64..192 / 32..224), 3 waves and 3
# trials each (varied_vs_fixed_baseline); then regime B at C=64 and 256, 3 modes, 3 trials.
#   -> $OUT/h200_call10.tar.gz: h200_B_fixed.*, h200_B_varied.*, h200_B64.*, h200_B256.*, h200_call10.log
set -uo pipefail
CALL=10 TAG=h200_call10 DEADLINE=${DEADLINE:-565}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
VF=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
    --concurrency 64,256 --modes baseline --waves 3 --trials 3 --min-requests 2 --warmup-requests 0 --no-progress
    --acceptance bernoulli:0.5 --max-seq-len 424)
stage fixed-B 130 "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_B_fixed"
stage varied-B 130 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_B_varied"
SW=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
    --modes baseline,static,dynamic --waves 1 --trials 3 --min-requests 2 --warmup-requests 0 --no-progress
    --static-k 7 --dynamic-schedule @benchmarks/results/h200_B_schedule.txt --acceptance bernoulli:0.5
    --input-len 64:192 --output-len 32:224 --max-seq-len 424)
stage C64-B 120 "$PY" "${SW[@]}" --concurrency 64 --out "$RES/h200_B64"
stage C256-B "$(( $(left) - 3 ))" "$PY" "${SW[@]}" --concurrency 256 --out "$RES/h200_B256"
finish
