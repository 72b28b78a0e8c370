#!/usr/bin/env bash
# One H200, call 41 (<= 9.8 minutes), the first of four run back to back on one machine (42, 43, 44):
# the figures of calls 36-40 in fewer processes, on the tree whose decode rows rotate and write their
# K/V inside the attention kernel (paged_decode.py, fused_rope). Each sweep process captures its CUDA
# graphs first (26-72 s in calls 36-40), so the loads that share a workload share a process.
#   the GPU tests of the fused kernel and of the decode graphs against transformers; decode_vs_gemm_floor
#   three times, with two --no-fused-rope runs between them (the lever, side by side).
#   -> $OUT/h200_call41.tar.gz
set -uo pipefail
CALL=41 TAG=h200_call41 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
FIRST_TESTS="tests/test_gpu.py::test_paged_decode_rope_equals_rope_write_and_sdpa
tests/test_gpu.py::test_graphs_equal_eager_and_greedy" TIME_TESTS=120 MIXED_STEP=0 FLOOR_AB=1 first_stages
finish
