#!/usr/bin/env bash
# One H200, call 33 (<= 9.8 minutes), after call 32 on the same machine:
#   regime A (prompts 512..1024, outputs 64..448, p=0.7, static K=3, dynamic with call 30's schedule,
#   tuned from a profile of this engine at 896 of context) at C=1, 4, 16 (at least 8 requests a
#   point: call 28's 4 left C=1 to the draws), then 64 and 256.
#   -> $OUT/h200_call$CALL.tar.gz
# CALL=38 ran the same stages in the eighth session's lease, its files named h200_c38_*,
#   with call 30's profile tuned with --draft-margin 1.01 (h200_c30_A_schedule_dm.txt: K=3, not 4, at b < 9).
set -uo pipefail
CALL=${CALL:-33}; TAG=h200_call$CALL DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
SCHED=h200_c30_A_schedule.txt; (( CALL >= 38 )) && SCHED=h200_c30_A_schedule_dm.txt
A=("${REGIME_A_SWEEP[@]}" --dynamic-schedule "@benchmarks/results/$SCHED")
stage A-small-C 260 "$PY" "${A[@]}" --concurrency 1,4,16 --min-requests 8 --out "$RES/h200_c${CALL}_A_small"
stage A-64-256 "$(( $(left) - 3 ))" "$PY" "${A[@]}" --concurrency 64,256 --out "$RES/h200_c${CALL}_A64_256"
finish
