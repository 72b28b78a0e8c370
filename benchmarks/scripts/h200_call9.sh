#!/usr/bin/env bash
# One H200, call 9 (<= 9.5 minutes): FlexAttention with a static batch per row bucket (the engine
# marks the row dimension static; mixed iterations pad their decode rows to the bucket).
#   GPU tests (graphs == eager == transformers, piecewise mixed graphs, padded decode rows);
#   flex alone: the engine's compile against the old automatic-dynamic one and dynamic=False;
#   b=1 decode with its kernel table; mixed steps eager vs piecewise; the regime-A profile with
#   --floor (decode_vs_gemm_floor) and its tuned schedule.
#   -> $OUT/h200_call9.tar.gz: h200_flex_decode_engine.json, h200_tp1_decode.json,
#      h200_mixed_step.json, h200x2_A_tp1_* (renamed h200_A_floor_* on CPU), h200_call9.log
set -uo pipefail
CALL=9 TAG=h200_call9 DEADLINE=${DEADLINE:-565}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage gpu-tests 130 "$PY" -m pytest -q -m gpu tests/test_gpu.py -k "graphs_equal and flex" -p no:cacheprovider
stage flex-decode 90 "$PY" -m dynspec.benchmarks.flex_decode --batch-sizes 1,16,64,256 \
  --variants flex,flex_dynamic,flex_static --out "$RES/h200_flex_decode_engine.json"
stage tp1-decode 70 "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" --device cuda --kernels 20 \
  --out "$RES/h200_tp1_decode.json"
stage mixed-step 110 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda --kernels 10 \
  --out "$RES/h200_mixed_step.json"
TP=1 TP_LIMIT="$(( $(left) - 8 ))" PROFILE_EXTRA="--floor --max-seq-len 1032" . "$here/h200x2_regime_a_tp.sh"
finish
