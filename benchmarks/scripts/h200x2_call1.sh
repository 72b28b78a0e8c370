#!/usr/bin/env bash
# nvidia-h200-x2 call 1 (two H200s, <= 9 minutes): prepare the random Llama-3.1-8B-shaped engine,
# then decode at b=1 with 1024 context at TP=1 (GPU 0) and TP=2 (both GPUs, each all-reduce mode,
# with the GEMM floors: benchmarks/tp_decode.py), the TP=2 GPU tests, and the regime-A profile +
# tune at TP=1 when time is left (call 2 repeats it if not).
#   -> $OUT/h200x2_call1.tar.gz: h200x2_tp{1,2}_decode.json, h200x2_call1.log, maybe h200x2_A_tp1_*
set -uo pipefail
CALL=x2_1 TAG=h200x2_call1
. "$(dirname "$0")/h200_lib.sh"
nvidia-smi topo -m >>"$LOG" 2>&1
start 0 0
stage tp1-decode 100 env CUDA_VISIBLE_DEVICES=0 "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" \
  --device cuda --out "$RES/h200x2_tp1_decode.json"
stage tp2-decode 150 "${MPI[@]}" "$PY" -m dynspec.benchmarks.tp_decode --engine-dir "$ENGINE_DIR" --device cuda \
  --tp 2 --modes nccl,one-shot,skip --out "$RES/h200x2_tp2_decode.json"
stage gpu-tests-tp 170 "$PY" -m pytest -q -m gpu tests/test_gpu_tp.py -p no:cacheprovider -x
TP=1 TP_LIMIT=$(( $(left) - 5 )) . "$here/h200x2_regime_a_tp.sh"
finish
