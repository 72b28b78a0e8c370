#!/usr/bin/env bash
# Next lease (not yet run). One H200, call 38 (<= 9.8 minutes), after call 37 on the same machine:
#   regime A (prompts 512..1024, outputs 64..448, p=0.7, static K=3, dynamic with call 30's schedule,
#   tuned from a profile of this engine at 896 of context) at C=1, 4, 16 (at least 8 requests a
#   point: call 28's 4 left C=1 to the draws), then 64 and 256.
#   -> $OUT/h200_call38.tar.gz
set -uo pipefail
CALL=38 TAG=h200_call38 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
A=("${REGIME_A_SWEEP[@]}" --dynamic-schedule @benchmarks/results/h200_c30_A_schedule.txt)
stage A-small-C 260 "$PY" "${A[@]}" --concurrency 1,4,16 --min-requests 8 --out "$RES/h200_c38_A_small"
stage A-64-256 "$(( $(left) - 3 ))" "$PY" "${A[@]}" --concurrency 64,256 --out "$RES/h200_c38_A64_256"
finish
