#!/usr/bin/env bash
# Published number: plain decode at b=1 with 1024 tokens of context (weight-streaming bandwidth).
#   -> $OUT/h200_decode_profile.json (decode_ms["1"], target_weight_bytes)
set -euo pipefail
: "${ENGINE_DIR:?set ENGINE_DIR to an engine dir written by dynspec build}"
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
"${PYTHON:-python}" -m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype "${DTYPE:-bfloat16}" \
  --batch-sizes 1,2,4,8 --draft-lens 0,1,3 --context-len 1024 --warmup 10 --repeats 50 \
  --out "$OUT/h200_decode_profile.json"
