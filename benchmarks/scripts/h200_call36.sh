#!/usr/bin/env bash
# Next lease (not yet run): calls 31-34 again, with regime B re-tuned (call 35's schedule) and its
# C=256 point over 3 waves. One H200, call 36 (<= 9.8 minutes), the first of four (37, 38, 39):
#   the GPU tests of this session's changes: K = 0 whole-forward graphs that end the iteration
#   themselves (against piecewise graphs, in lockstep under hashed Bernoulli acceptance), whole and
#   piecewise mixed graphs and decode graphs against transformers;
#   mixed steps b=1 and b=64 + a 128-token chunk at 1024 context (call 23: 9.25 / 11.76 ms whole);
#   decode_vs_gemm_floor three times; the varied and fixed baselines at C=64 (regime B lengths,
#   12 waves, 3 trials).
#   -> $OUT/h200_call36.tar.gz
set -uo pipefail
CALL=36 TAG=h200_call36 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
GPU_TEST_PATHS="tests/test_gpu.py::test_whole_k0_graphs_leave_the_piecewise_state
tests/test_gpu.py::test_whole_mixed_graphs_equal_transformers
tests/test_gpu.py::test_chunks_over_several_query_blocks_equal_transformers
tests/test_gpu.py::test_graphs_equal_eager_and_greedy" start 1 150
stage mixed-step 80 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --points 1:0:128,64:0:128 --context-len 1024 --out "$RES/h200_c36_mixed_step.json"
for i in 1 2 3; do
  stage "floor$i" 35 "$PY" "${FLOOR[@]}" --out "$RES/h200_c36_floor${i}_profile.json"
done
VF=("${BASELINE_SWEEP[@]}" --concurrency 64 --waves 12)
stage varied-B64 95 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c36_B64_varied"
stage fixed-B64 "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c36_B64_fixed"
finish
