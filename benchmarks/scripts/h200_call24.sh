#!/usr/bin/env bash
# One H200, call 24 (<= 9.5 minutes): this session's last lease.
#   the GPU tests of the decode graphs (now chains of three graphs), whole-forward graphs and kernels;
#   decode_vs_gemm_floor with chained and single decode graphs, twice each, alternating;
#   the varied and fixed baselines (regime B lengths, C=64 and 256, 3 trials) over 6 waves: a
#   finite closed loop of varied lengths ends in a drain tail that 3 waves make a third of the run.
#   -> $OUT/h200_call24.tar.gz
set -uo pipefail
CALL=24 TAG=h200_call24 DEADLINE=${DEADLINE:-560}
. "$(dirname "$0")/h200_lib.sh"
GPU_TEST_PATHS="tests/test_gpu.py::test_graphs_equal_eager_and_greedy tests/test_gpu.py::test_whole_mixed_graphs_equal_transformers tests/test_gpu.py::test_paged_decode_equals_sdpa" start 1 80
for i in 1 2; do
  stage "floor-chain$i" 35 "$PY" "${FLOOR[@]}" --out "$RES/h200_c24_floor_chain${i}_profile.json"
  stage "floor-one$i" 35 "$PY" "${FLOOR[@]}" --no-split-graphs --out "$RES/h200_c24_floor_one${i}_profile.json"
done
VF=("${BASELINE_SWEEP[@]}" --concurrency 64,256 --waves 6)
stage varied-B 150 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c24_B_varied"
stage fixed-B "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c24_B_fixed"
finish
