#!/usr/bin/env bash
# nvidia-h200-x2 call 4 (<= 6 minutes; not yet run: the two-GPU kind was not lent in the session that
# wrote it): b=1 decode with 1024 context at TP=1 with its kernel table (GPU 0) and at TP=2 per
# all-reduce mode, in one lease, with the fused layer glue; the TP=2 GPU test (piecewise graphs with
# collectives inside them). Then `bash benchmarks/scripts/h200x2_call6.sh` and h200x2_summary.sh.
#   -> $OUT/h200x2_call4.tar.gz: h200x2_tp{1,2}_decode.json, h200x2_call4.log
set -uo pipefail
CALL=x2_4 TAG=h200x2_call4 DEADLINE=${DEADLINE:-380}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage tp1-decode 80 env CUDA_VISIBLE_DEVICES=0 "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" \
  --device cuda --kernels 20 --out "$RES/h200x2_tp1_decode.json"
stage tp2-decode 110 "${MPI[@]}" "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" --device cuda \
  --tp 2 --modes nccl,one-shot,skip --out "$RES/h200x2_tp2_decode.json"
stage gpu-tests-tp "$(( $(left) - 3 ))" "$PY" -m pytest -q -m gpu tests/test_gpu_tp.py -p no:cacheprovider -x
finish
