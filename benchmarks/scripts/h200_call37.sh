#!/usr/bin/env bash
# Eighth session, one lease. One H200, call 37 (<= 9.8 minutes), after call 36 on the same machine:
#   the varied and fixed baselines at C=256 (regime B lengths, 12 waves, 3 trials);
#   regime B (baseline / static K=7 / dynamic with call 35's profile (b=128 and 192 too) tuned with --draft-margin 1.01,
#   3 trials, varied lengths) at C=1, 4, 16 and 64 (C=256 over 3 waves is call 39's).
#   -> $OUT/h200_call37.tar.gz
set -uo pipefail
CALL=37 TAG=h200_call37 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
VF=("${BASELINE_SWEEP[@]}" --concurrency 256 --waves 12)
stage varied-B256 170 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c37_B256_varied"
stage fixed-B256 150 "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c37_B256_fixed"
B=("${REGIME_B_SWEEP[@]}" --dynamic-schedule @benchmarks/results/h200_c35_B_schedule_dm.txt)
stage B-small-C "$(( $(left) - 3 ))" "$PY" "${B[@]}" --concurrency 1,4,16,64 --out "$RES/h200_c37_B"
finish
