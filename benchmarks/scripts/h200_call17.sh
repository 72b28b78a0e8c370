#!/usr/bin/env bash
# One H200, call 17 (<= 9 minutes): the hand-written Triton kernels (paged_decode.py: decode rows'
# attention in one launch; rope_kernel.py: RoPE + K/V stores in one launch), on by default.
#   GPU tests: both kernels against their oracles (SDPA; model.rope_write), eagerly and from a
#   replayed graph, then the engine's graphs == eager == transformers with them;
#   decode_vs_gemm_floor side by side: profile --floor with the kernels, then without;
#   the b=1 decode kernel table with them; regime A at C=1, 4 with them (call 13 ran it without).
#   -> $OUT/h200_call17.tar.gz: h200_c17_floor_{triton,flex}_profile.json, h200_c17_tp1_decode.json,
#      h200_c17_A.*, h200_call17.log
set -uo pipefail
CALL=17 TAG=h200_call17 DEADLINE=${DEADLINE:-530}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage gpu-tests 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider -x \
  "tests/test_gpu.py::test_paged_decode_equals_sdpa" "tests/test_gpu.py::test_rope_write_triton_equals_rope_write" \
  "tests/test_gpu.py::test_graphs_equal_eager_and_greedy"
FL=(-m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16 --no-progress
    --batch-sizes 1 --draft-lens 0 --context-len 1024 --max-seq-len 1032 --warmup 2 --repeats 6 --floor)
stage floor-triton 80 "$PY" "${FL[@]}" --out "$RES/h200_c17_floor_triton_profile.json"
stage floor-flex 80 "$PY" "${FL[@]}" --no-triton-kernels --out "$RES/h200_c17_floor_flex_profile.json"
stage tp1-decode 70 "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" --device cuda --kernels 20 \
  --out "$RES/h200_c17_tp1_decode.json"
stage small-C-A "$(( $(left) - 3 ))" "$PY" -m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" \
  --device cuda --dtype bfloat16 --concurrency 1,4 --modes baseline,static,dynamic --waves 1 --trials 3 \
  --min-requests 2 --no-progress --static-k 3 --dynamic-schedule @benchmarks/results/h200_A_floor_schedule.txt \
  --acceptance bernoulli:0.7 --input-len 512:1024 --output-len 64:448 --max-seq-len 1480 --out "$RES/h200_c17_A"
finish
