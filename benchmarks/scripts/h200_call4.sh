#!/usr/bin/env bash
# One H200, call 4 (<= 9 minutes; for when the two-GPU kind is not lent): the GPU tests (graphs,
# piecewise mixed graphs and eager against transformers); mixed iterations eager vs piecewise
# graphs (benchmarks/mixed_step.py); b=1 decode with 1024 context with its kernel table, after the
# fused layer glue (benchmarks/tp_decode.py at TP=1); the regime-A profile at TP=1 with --floor
# (decode_vs_gemm_floor) and its tuned schedule; issue 11's regime B at C=256 (3 modes, 3 trials).
#   -> $OUT/h200_call4.tar.gz: h200_mixed_step.json, h200x2_tp1_decode.json, h200x2_A_tp1_*,
#      h200_B256.{json,md,png}, h200_call4.log
set -uo pipefail
CALL=4 TAG=h200_call4 DEADLINE=${DEADLINE:-540}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage gpu-tests 100 "$PY" -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
stage mixed-step 100 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --out "$RES/h200_mixed_step.json"
stage tp1-decode 80 "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" --device cuda --kernels 20 \
  --out "$RES/h200x2_tp1_decode.json"
TP=1 TP_LIMIT=110 PROFILE_EXTRA="--floor" . "$here/h200x2_regime_a_tp.sh"
stage C256-B "$(( $(left) - 3 ))" "$PY" -m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" \
  --device cuda --dtype bfloat16 --concurrency 256 --modes baseline,static,dynamic --waves 1 --trials 3 \
  --min-requests 2 --warmup-requests 0 --no-progress --static-k 7 --dynamic-schedule @benchmarks/results/h200_B_schedule.txt \
  --acceptance bernoulli:0.5 --input-len 64:192 --output-len 32:224 --max-seq-len 424 --out "$RES/h200_B256"
finish
