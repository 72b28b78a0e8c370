#!/usr/bin/env bash
# One H200, call 44 (<= 9.8 minutes), after call 43 on the same machine:
#   the varied baseline at C=64 and 256 (regime B lengths, 6 waves, 3 trials) in one process, beside
#   call 42's fixed one.
#   -> $OUT/h200_call44.tar.gz
set -uo pipefail
CALL=44 TAG=h200_call44 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage varied-B "$(( $(left) - 3 ))" "$PY" "${BASELINE_SWEEP[@]}" --concurrency 64,256 --waves 6 \
  --input-len 64:192 --output-len 32:224 --out "$RES/h200_c44_B_varied"
finish
