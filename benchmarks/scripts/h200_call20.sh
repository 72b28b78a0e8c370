#!/usr/bin/env bash
# One H200, call 20 (<= 9.5 minutes; for the next lease, not yet run): what calls 17 and 19 left.
#   the paged decode kernel's launch knobs against flex, per b (its b=1 time, ~10 us a layer, is
#   what keeps decode_vs_gemm_floor above 1.2);
#   decode_vs_gemm_floor with and without the Triton kernels, three times each, alternating
#   (call 19's two pairs tied: 1.28 / 1.27 against 1.26 / 1.29);
#   varied_vs_fixed with the engine's defaults now (whole-forward mixed graphs and the Triton kernels).
#   -> $OUT/h200_call20.tar.gz: h200_c20_flex_decode.json, h200_c20_floor_*_profile.json,
#      h200_c20_B_{varied,fixed}.*, h200_call20.log
set -uo pipefail
CALL=20 TAG=h200_call20 DEADLINE=${DEADLINE:-565}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage flex-decode 100 "$PY" -m dynspec.benchmarks.flex_decode --batch-sizes 1,16,64,256 --context 1024 \
  --max-seq-len 1032 --variants flex,triton,triton-w2,triton-s1,triton-w2-s1,triton-w8,triton-t128 \
  --out "$RES/h200_c20_flex_decode.json"
FL=(-m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16 --no-progress
    --batch-sizes 1 --draft-lens 0 --context-len 1024 --max-seq-len 1032 --warmup 2 --repeats 6 --floor)
for i in 1 2 3; do
  stage "floor-triton$i" 40 "$PY" "${FL[@]}" --out "$RES/h200_c20_floor_triton${i}_profile.json"
  stage "floor-flex$i" 40 "$PY" "${FL[@]}" --no-triton-kernels --out "$RES/h200_c20_floor_flex${i}_profile.json"
done
VF=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
    --concurrency 64,256 --modes baseline --waves 3 --trials 3 --min-requests 2 --no-progress
    --acceptance bernoulli:0.5 --max-seq-len 424)
stage varied-B 120 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c20_B_varied"
stage fixed-B "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c20_B_fixed"
finish
