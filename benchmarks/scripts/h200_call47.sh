#!/usr/bin/env bash
# One H200, call 47 (tenth session, a lease of its own after calls 41-44): the baseline with varied
# (regime B lengths) and fixed (128/128) outputs side by side at C=64 and 256, 12 waves of C requests as
# in calls 36-40 (call 44's 6 waves put a finite closed loop's drain tail into the ratio). The fixed
# run keeps 6 waves at C=256 (lockstep waves of one length have no tail; the lease's time was short).
#   -> $OUT/h200_call47.tar.gz
set -uo pipefail
CALL=47 TAG=h200_call47 DEADLINE=${DEADLINE:-440}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage varied-B 230 "$PY" "${BASELINE_SWEEP[@]}" --concurrency 64,256 --waves 12 \
  --input-len 64:192 --output-len 32:224 --out "$RES/h200_c47_B_varied"
stage fixed-B "$(( $(left) - 3 ))" "$PY" "${BASELINE_SWEEP[@]}" --concurrency 64,256 --waves 12 --waves-at 256:6 \
  --input-len 128 --output-len 128 --out "$RES/h200_c47_B_fixed"
finish
