#!/usr/bin/env bash
# Published number: the tiny pair on CPU with the dynamic schedule that `dynspec tune` chose
# (run cpu_tiny_profile_tune.sh first), against baseline and static K=3, one replica.
#   -> benchmarks/results/cpu_tiny_tuned.{json,md,png}
set -euo pipefail
OUT=${OUT:-benchmarks/results}
export NCCL_NVLS_ENABLE=0
"${PYTHON:-python}" -m dynspec.benchmarks.sweep --engine reference --device cpu \
  --dynamic-schedule "@$OUT/cpu_tiny_schedule.txt" --static-k 3 --modes baseline,static,dynamic \
  --concurrency 1,2,4,8,16 --acceptance real --prompts stdlib --input-len 48 --output-len 48 --waves 3 --trials 3 \
  --out "$OUT/cpu_tiny_tuned"
