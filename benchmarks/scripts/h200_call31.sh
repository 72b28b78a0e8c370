#!/usr/bin/env bash
# One H200, call 31 (<= 9.8 minutes), the first of four run back to back on one machine (32, 33, 34):
#   the GPU tests of this session's changes: K = 0 whole-forward graphs that end the iteration
#   themselves (against piecewise graphs, in lockstep under hashed Bernoulli acceptance), whole and
#   piecewise mixed graphs and decode graphs against transformers;
#   mixed steps b=1 and b=64 + a 128-token chunk at 1024 context (call 23: 9.25 / 11.76 ms whole);
#   decode_vs_gemm_floor three times; the varied and fixed baselines at C=64 (regime B lengths,
#   12 waves, 3 trials).
#   -> $OUT/h200_call$CALL.tar.gz
# CALL=36 ran the same stages in the eighth session's lease, its files named h200_c36_*. On that fresh
#   machine floor1 was killed at its 35-s limit just after writing its profile, and varied-B64 ran past
#   95 s (cold compile caches: 49 s to capture its graphs, 26 s later); the limits are now 45 and 130 s.
set -uo pipefail
CALL=${CALL:-31}; TAG=h200_call$CALL DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
first_stages
VF=("${BASELINE_SWEEP[@]}" --concurrency 64 --waves 12)
stage varied-B64 130 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c${CALL}_B64_varied"
stage fixed-B64 "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c${CALL}_B64_fixed"
finish
