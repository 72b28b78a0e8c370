#!/usr/bin/env bash
# One H200, call 28 (<= 9.8 minutes), after call 27 on the same machine:
#   regime B at C=256 with call 27's schedule ($WORK/B_schedule.txt there; on a fresh machine the
#   committed benchmarks/results/h200_c27_B_schedule.txt);
#   regime A (prompts 512..1024, outputs 64..448, p=0.7, static K=3, the schedule tuned from call 9's
#   profile --floor) at C=1, 4, 16, then 64 and 256.
#   -> $OUT/h200_call28.tar.gz
set -uo pipefail
CALL=28 TAG=h200_call28 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
REGIME_A_SWEEP+=(--dynamic-schedule @benchmarks/results/h200_A_floor_schedule.txt)   # call 9's
sched=$WORK/B_schedule.txt; [ -f "$sched" ] || sched=benchmarks/results/h200_c27_B_schedule.txt
stage B256 140 "$PY" "${REGIME_B_SWEEP[@]}" --dynamic-schedule "@$sched" --concurrency 256 --out "$RES/h200_c28_B256"
stage A-small-C 170 "$PY" "${REGIME_A_SWEEP[@]}" --concurrency 1,4,16 --min-requests 4 --out "$RES/h200_c28_A_small"
stage A-64-256 "$(( $(left) - 3 ))" "$PY" "${REGIME_A_SWEEP[@]}" --concurrency 64,256 --out "$RES/h200_c28_A64_256"
finish
