#!/usr/bin/env bash
# Published numbers: the embedded tiny trained pair on the H200 with REAL acceptance.
#   -> $OUT/h200_tiny_real.{json,md,png}
set -euo pipefail
OUT=${OUT:-benchmarks/results}
MPIRUN=${MPIRUN:-mpirun}
ROOT_FLAGS=(); [ "$(id -u)" = 0 ] && ROOT_FLAGS=(--allow-run-as-root)
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
"$MPIRUN" -n "${NGPU:-1}" "${ROOT_FLAGS[@]}" -x NCCL_NVLS_ENABLE=0 \
  "${PYTHON:-python}" -m dynspec.benchmarks.sweep --engine reference --device cuda --dtype "${DTYPE:-float32}" \
    --schedule "${SCHEDULE:-8:4,32:2}" --static-k 4 --modes baseline,static,dynamic \
    --concurrency 1,2,4,8,16,32,64 --acceptance real --prompts stdlib --input-len 64 --output-len 128 \
    --out "$OUT/h200_tiny_real"
