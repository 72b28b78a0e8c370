#!/usr/bin/env bash
# Next lease (not yet run). One H200, call 41 (<= 9.8 minutes), the first of four run back to back on one
# machine (42, 43, 44): the figures of calls 36-40 in fewer processes, on the tree whose decode rows
# rotate and write their K/V inside the attention kernel (paged_decode.py, fused_rope). Each sweep process
# captures its CUDA graphs first (26-72 s in calls 36-40, about a quarter of that lease), so the loads
# that share a workload share a process.
#   the GPU tests (the fused kernel's among them); mixed steps b=1 and b=64 + a 128-token chunk at 1024
#   context; decode_vs_gemm_floor three times, each beside one with --no-fused-rope (the lever, side by side).
#   -> $OUT/h200_call41.tar.gz
set -uo pipefail
CALL=41 TAG=h200_call41 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
FIRST_TESTS="tests/test_gpu.py::test_paged_decode_rope_equals_rope_write_and_sdpa" TIME_TESTS=170 FLOOR_AB=1 first_stages
finish
