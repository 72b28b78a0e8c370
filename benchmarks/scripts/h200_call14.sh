#!/usr/bin/env bash
# One H200, call 14 (<= 9.5 minutes; for the next lease, after call 13 shows the whole-forward
# graphs correct and faster in mixed_step): issue 11's varied_vs_fixed with them, side by side
# with piecewise in the same lease, then regime B at C=64 and 256 with them.
#   -> $OUT/h200_call14.tar.gz: h200_c14_B_{fixed,varied}{,_whole}.*, h200_c14_B_whole.*, h200_call14.log
set -uo pipefail
CALL=14 TAG=h200_call14 DEADLINE=${DEADLINE:-565}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
VF=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
    --concurrency 64,256 --modes baseline --waves 3 --trials 3 --min-requests 2 --no-progress
    --acceptance bernoulli:0.5 --max-seq-len 424)
stage varied-B-whole 110 "$PY" "${VF[@]}" --whole-mixed-graphs --input-len 64:192 --output-len 32:224 \
  --out "$RES/h200_c14_B_varied_whole"
stage varied-B 100 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c14_B_varied"
stage fixed-B-whole 100 "$PY" "${VF[@]}" --whole-mixed-graphs --input-len 128 --output-len 128 \
  --out "$RES/h200_c14_B_fixed_whole"
stage C64-256-B-whole "$(( $(left) - 3 ))" "$PY" -m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" \
  --device cuda --dtype bfloat16 --concurrency 64,256 --modes baseline,static,dynamic --waves 1 --trials 3 \
  --min-requests 2 --no-progress --whole-mixed-graphs --static-k 7 --dynamic-schedule @benchmarks/results/h200_B_schedule.txt \
  --acceptance bernoulli:0.5 --input-len 64:192 --output-len 32:224 --max-seq-len 424 --out "$RES/h200_c14_B_whole"
finish
