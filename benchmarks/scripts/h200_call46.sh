#!/usr/bin/env bash
# One H200, call 46 (<= 9.8 minutes), the second lease of the ninth session: decode_vs_gemm_floor three
# times with two --no-fused-rope runs between them (fused, unfused, fused, unfused, fused), each run now
# also timing the decode step's graphs replayed back to back (decode_graph_ms): the GPU's part of the
# step apart from the host's serial part, where call 41's five runs differed by up to 4% between processes.
#   -> $OUT/h200_call46.tar.gz
set -uo pipefail
CALL=46 TAG=h200_call46 DEADLINE=${DEADLINE:-400}
. "$(dirname "$0")/h200_lib.sh"
GPU_TESTS=0 MIXED_STEP=0 FLOOR_AB=1 first_stages
finish
