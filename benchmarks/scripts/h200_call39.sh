#!/usr/bin/env bash
# Eighth session, one lease. One H200, call 39 (<= 9.8 minutes), after call 38 on the same machine:
#   regime B at C=256 over 3 waves (call 35: a one-wave trial runs 3.3 s), then its open loop:
#   Poisson arrivals at the baseline's closed-loop rate at C=64, beside that closed loop (call 35's
#   schedule).
#   -> $OUT/h200_call39.tar.gz
set -uo pipefail
CALL=39 TAG=h200_call39 DEADLINE=${DEADLINE:-420}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage B256 230 "$PY" "${REGIME_B_SWEEP[@]}" --dynamic-schedule @benchmarks/results/h200_c35_B_schedule_dm.txt \
  --concurrency 256 --waves 3 --out "$RES/h200_c39_B256"          # the later --waves wins over SWEEP3's
stage B64-poisson "$(( $(left) - 3 ))" "$PY" "${REGIME_B_SWEEP[@]}" --dynamic-schedule @benchmarks/results/h200_c35_B_schedule_dm.txt \
  --concurrency 64 --poisson-at 64 --out "$RES/h200_c39_B64_poisson"
finish
