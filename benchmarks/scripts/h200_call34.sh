#!/usr/bin/env bash
# One H200, call 34 (<= 9.8 minutes), after call 33 on the same machine:
#   regime B open loop: Poisson arrivals at the baseline's closed-loop rate at C=64, beside that
#   closed loop (call 27's schedule).
#   -> $OUT/h200_call34.tar.gz
set -uo pipefail
CALL=34 TAG=h200_call34 DEADLINE=${DEADLINE:-300}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage B64-poisson "$(( $(left) - 3 ))" "$PY" "${REGIME_B_SWEEP[@]}" --dynamic-schedule @benchmarks/results/h200_c27_B_schedule.txt \
  --concurrency 64 --poisson-at 64 --out "$RES/h200_c34_B64_poisson"
finish
