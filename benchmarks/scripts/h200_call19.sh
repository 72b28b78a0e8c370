#!/usr/bin/env bash
# One H200, call 19 (<= 4.5 minutes, the session's last device time): paged_decode.py after call
# 17's kernel table (int64 tables read directly, splits from the table width, K and V together).
#   its GPU test; decode_vs_gemm_floor with and without the Triton kernels, twice each,
#   alternating; the b=1 kernel table; decode attention alone per b (flex vs triton).
#   -> $OUT/h200_call19.tar.gz: h200_c19_floor_{triton,flex}{1,2}_profile.json,
#      h200_c19_tp1_decode.json, h200_c19_flex_decode.json, h200_call19.log
set -uo pipefail
CALL=19 TAG=h200_call19 DEADLINE=${DEADLINE:-270}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage gpu-tests 50 "$PY" -m pytest -q -m gpu -p no:cacheprovider -x "tests/test_gpu.py::test_paged_decode_equals_sdpa"
FL=(-m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16 --no-progress
    --batch-sizes 1 --draft-lens 0 --context-len 1024 --max-seq-len 1032 --warmup 2 --repeats 6 --floor)
for i in 1 2; do
  stage "floor-triton$i" 40 "$PY" "${FL[@]}" --out "$RES/h200_c19_floor_triton${i}_profile.json"
  stage "floor-flex$i" 40 "$PY" "${FL[@]}" --no-triton-kernels --out "$RES/h200_c19_floor_flex${i}_profile.json"
done
stage tp1-decode 40 "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" --device cuda --kernels 20 \
  --out "$RES/h200_c19_tp1_decode.json"
stage flex-decode "$(( $(left) - 3 ))" "$PY" -m dynspec.benchmarks.flex_decode --batch-sizes 1,64,256 --context 1024 \
  --max-seq-len 1032 --variants flex,triton --out "$RES/h200_c19_flex_decode.json"
finish
