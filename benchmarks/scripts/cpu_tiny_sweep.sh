#!/usr/bin/env bash
# Published number: the CPU sweep of the embedded tiny trained pair (real greedy acceptance),
# two data-parallel replicas under mpirun, baseline / static K=3 / dynamic "2:3".
#   -> benchmarks/results/cpu_tiny.{json,md,png}
# Usage: benchmarks/scripts/cpu_tiny_sweep.sh            (from the repo root; ~1 min on 2 cores)
set -euo pipefail
OUT=${OUT:-benchmarks/results}
NP=${NP:-2}
PY=${PYTHON:-python}
MPIRUN=${MPIRUN:-$(dirname "$(command -v "$PY")")/mpirun}
[ -x "$MPIRUN" ] || MPIRUN=mpirun
ROOT_FLAGS=(); [ "$(id -u)" = 0 ] && ROOT_FLAGS=(--allow-run-as-root)
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
"$MPIRUN" -n "$NP" "${ROOT_FLAGS[@]}" --oversubscribe -x NCCL_NVLS_ENABLE=0 -x OMP_NUM_THREADS=1 \
  "$PY" -m dynspec.benchmarks.sweep --engine reference --device cpu \
    --schedule 2:3 --static-k 3 --modes baseline,static,dynamic --concurrency 1,2,4,8 \
    --acceptance real --prompts stdlib --input-len 32:64 --output-len 32:64 --waves 2 --min-requests 4 --trials 3 \
    --out "$OUT/cpu_tiny"
