#!/usr/bin/env bash
# Next lease (not yet run). One H200, call 41 (<= 9.8 minutes), the first of three run back to back on one
# machine (42, 43): the figures of calls 36-40 in fewer processes. Each sweep process captures its CUDA
# graphs first (26-72 s in calls 36-40, about a quarter of that lease), so the loads that share a
# workload share a process: about 1300 s for the three calls against calls 36-40's 1614 s, leaving
# room for a floor experiment.
#   the GPU tests; mixed steps b=1 and b=64 + a 128-token chunk at 1024 context; decode_vs_gemm_floor
#   three times; the varied baseline at C=64 and 256 (regime B lengths, 12 waves, 3 trials) in one process.
#   -> $OUT/h200_call41.tar.gz
set -uo pipefail
CALL=41 TAG=h200_call41 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
first_stages
stage varied-B "$(( $(left) - 3 ))" "$PY" "${BASELINE_SWEEP[@]}" --concurrency 64,256 --waves 12 \
  --input-len 64:192 --output-len 32:224 --out "$RES/h200_c41_B_varied"
finish
