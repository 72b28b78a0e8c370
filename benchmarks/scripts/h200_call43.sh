#!/usr/bin/env bash
# One H200, call 43 (<= 9.8 minutes), after call 42 on the same machine:
#   regime A (prompts 512..1024, outputs 64..448, p=0.7, static K=3, dynamic with call 30's profile tuned
#   with --draft-margin 1.01) at C=1, 4, 16, 64, 256 in one process; at least 8 requests a point
#   (calls 33 and 38 ran C=64 and 256 apart with at least 2: the same counts, as 8 < C there).
#   -> $OUT/h200_call43.tar.gz
set -uo pipefail
CALL=43 TAG=h200_call43 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage A "$(( $(left) - 3 ))" "$PY" "${REGIME_A_SWEEP[@]}" --dynamic-schedule @benchmarks/results/h200_c30_A_schedule_dm.txt \
  --concurrency 1,4,16,64,256 --min-requests 8 --out "$RES/h200_c43_A"
finish
