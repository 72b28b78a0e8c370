#!/usr/bin/env bash
# One H200, call 26 (<= 9.8 minutes), the first of three run back to back on one machine (27, 28):
#   the GPU tests of this session's kernels (single-pass RMSNorm, the greedy head's first_max, the
#   paged decode kernel's merge) and of the graphs that run them, against eager and transformers;
#   the paged decode kernel at b=1, 64, 256 (call 23: 13.5 / 75.8 us at b=1 / 64); a b=1 kernel table;
#   decode_vs_gemm_floor three times with chained decode graphs, once with one graph;
#   the varied and fixed baselines at C=64 (regime B lengths, 12 waves, 3 trials).
#   -> $OUT/h200_call26.tar.gz
set -uo pipefail
CALL=26 TAG=h200_call26 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
GPU_TEST_PATHS="tests/test_gpu.py::test_norm_triton_equals_eager tests/test_gpu.py::test_first_max_equals_argmax_on_cuda
tests/test_gpu.py::test_paged_decode_equals_sdpa tests/test_gpu.py::test_graphs_equal_eager_and_greedy
tests/test_gpu.py::test_whole_mixed_graphs_equal_transformers" start 1 130
stage flex-decode 45 "$PY" -m dynspec.benchmarks.flex_decode --batch-sizes 1,64,256 --context 1024 \
  --max-seq-len 1032 --variants triton --out "$RES/h200_c26_flex_decode.json"
stage tp1-kernels 45 "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" --device cuda --kernels 20 \
  --out "$RES/h200_c26_tp1_decode.json"
for i in 1 2 3; do
  stage "floor-chain$i" 35 "$PY" "${FLOOR[@]}" --out "$RES/h200_c26_floor_chain${i}_profile.json"
done
stage floor-one1 35 "$PY" "${FLOOR[@]}" --no-split-graphs --out "$RES/h200_c26_floor_one1_profile.json"
VF=("${BASELINE_SWEEP[@]}" --concurrency 64 --waves 12)
stage varied-B64 95 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c26_B64_varied"
stage fixed-B64 "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c26_B64_fixed"
finish
