#!/usr/bin/env bash
# One H200, call 41 (<= 9.8 minutes), the first of four run back to back on one machine (42, 43, 44):
# the figures of calls 36-40 in fewer processes, on the tree whose decode rows rotate and write their
# K/V inside the attention kernel (paged_decode.py, fused_rope). Each sweep process captures its CUDA
# graphs first (26-72 s in calls 36-40), so the loads that share a workload share a process.
#   the GPU tests of the decode and whole-forward graphs and of the fused kernel; mixed steps b=1 and b=64
#   + a 128-token chunk at 1024 context; decode_vs_gemm_floor three times, with two --no-fused-rope runs
#   between them (the lever, side by side). The ninth session ran it with only the fused kernel's test
#   and test_graphs_equal_eager_and_greedy, and no mixed step (250 s).
#   -> $OUT/h200_call41.tar.gz
set -uo pipefail
CALL=41 TAG=h200_call41 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
FIRST_TESTS="$FIRST_TESTS
tests/test_gpu.py::test_paged_decode_rope_equals_rope_write_and_sdpa" TIME_TESTS=170 FLOOR_AB=1 first_stages
finish
