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
GPU_TEST_PATHS="tests/test_gpu.py::test_whole_k0_graphs_leave_the_piecewise_state
tests/test_gpu.py::test_whole_mixed_graphs_equal_transformers
tests/test_gpu.py::test_chunks_over_several_query_blocks_equal_transformers
tests/test_gpu.py::test_graphs_equal_eager_and_greedy" start 1 150
stage mixed-step 80 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --points 1:0:128,64:0:128 --context-len 1024 --out "$RES/h200_c${CALL}_mixed_step.json"
for i in 1 2 3; do
  stage "floor$i" 45 "$PY" "${FLOOR[@]}" --out "$RES/h200_c${CALL}_floor${i}_profile.json"
done
VF=("${BASELINE_SWEEP[@]}" --concurrency 64 --waves 12)
stage varied-B64 130 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c${CALL}_B64_varied"
stage fixed-B64 "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c${CALL}_B64_fixed"
finish
