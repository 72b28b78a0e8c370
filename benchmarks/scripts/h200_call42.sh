#!/usr/bin/env bash
# One H200, call 42 (<= 9.8 minutes), after call 41 on the same machine (the ninth session ran it in a lease of
# its own, on a fresh machine: 470 s, of which 158 s capturing graphs):
#   the fixed baseline at C=64 and 256 (regime B's means, 6 waves, 3 trials) in one process; regime B
#   (baseline / static K=7 / dynamic with call 35's profile tuned with --draft-margin 1.01, 3 trials,
#   varied lengths) at C=1, 4, 16, 64 (one wave) and 256 (3 waves: one is a 3.3-s trial), with Poisson
#   arrivals at C=64's baseline rate, in one process.
#   -> $OUT/h200_call42.tar.gz
set -uo pipefail
CALL=42 TAG=h200_call42 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage fixed-B 220 "$PY" "${BASELINE_SWEEP[@]}" --concurrency 64,256 --waves 6 \
  --input-len 128 --output-len 128 --out "$RES/h200_c42_B_fixed"
stage B "$(( $(left) - 3 ))" "$PY" "${REGIME_B_SWEEP[@]}" --dynamic-schedule @benchmarks/results/h200_c35_B_schedule_dm.txt \
  --concurrency 1,4,16,64,256 --waves-at 256:3 --poisson-at 64 --out "$RES/h200_c42_B"
finish
