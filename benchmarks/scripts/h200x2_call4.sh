#!/usr/bin/env bash
# nvidia-h200-x2 call 4 (<= 9.5 minutes): the fused layer glue (model.Kernels: 4 glue kernels a
# layer) measured. b=1 decode with 1024 context at TP=1 with its kernel table (GPU 0) and at TP=2
# per all-reduce mode; the regime-A profile + tune at TP=2 (the TP=2 crossover; graph capture order
# fixed since call 3); the TP=2 GPU test; the one-GPU GPU tests (graphs vs eager vs transformers).
#   -> $OUT/h200x2_call4.tar.gz: h200x2_tp{1,2}_decode.json, h200x2_A_tp2_*, h200x2_call4.log
set -uo pipefail
CALL=x2_4 TAG=h200x2_call4 DEADLINE=${DEADLINE:-560}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage tp1-decode 90 env CUDA_VISIBLE_DEVICES=0 "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" \
  --device cuda --kernels 20 --out "$RES/h200x2_tp1_decode.json"
stage tp2-decode 120 "${MPI[@]}" "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" --device cuda \
  --tp 2 --modes nccl,one-shot,skip --out "$RES/h200x2_tp2_decode.json"
TP=2 TP_LIMIT=170 . "$here/h200x2_regime_a_tp.sh"
stage gpu-tests-tp 120 "$PY" -m pytest -q -m gpu tests/test_gpu_tp.py -p no:cacheprovider -x
stage gpu-tests "$(( $(left) - 3 ))" env CUDA_VISIBLE_DEVICES=0 "$PY" -m pytest -q -m gpu tests/test_gpu.py \
  -p no:cacheprovider
finish
