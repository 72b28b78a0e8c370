#!/usr/bin/env bash
# One H200, call 25 (<= 5.5 minutes, the session's last device time): a third floor pair (chained /
# single decode graphs) for medians of three, and the varied and fixed baselines at C=64 over 20
# waves: a closed loop of varied lengths drains over about one longest output, whatever its length,
# so only a long run shows what inflight batching costs per iteration.
#   -> $OUT/h200_call25.tar.gz
set -uo pipefail
CALL=25 TAG=h200_call25 DEADLINE=${DEADLINE:-330}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage floor-chain3 35 "$PY" "${FLOOR[@]}" --out "$RES/h200_c25_floor_chain3_profile.json"
stage floor-one3 35 "$PY" "${FLOOR[@]}" --no-split-graphs --out "$RES/h200_c25_floor_one3_profile.json"
VF=("${BASELINE_SWEEP[@]}" --concurrency 64 --waves 20)
stage varied-B64 110 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c25_B64_varied"
stage fixed-B64 "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c25_B64_fixed"
finish
