#!/usr/bin/env bash
# Published number: the tiny pair's CPU profile (iteration ms per (b, K), measured per-position
# acceptance on held-out stdlib text) and the schedule `dynspec tune` derives from it.
#   -> benchmarks/results/cpu_tiny_profile.json, cpu_tiny_schedule.txt, cpu_tiny_tune.json
set -euo pipefail
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
"${PYTHON:-python}" -m dynspec.cli profile --device cpu --batch-sizes 1,2,4,8,16 --draft-lens 0,1,2,3,4 --context-len 96 \
  --warmup 5 --repeats 30 --measure-acceptance --prompts stdlib --input-len 48 --output-len 48 \
  --num-requests 16 --out "$OUT/cpu_tiny_profile.json"
"${PYTHON:-python}" -m dynspec.cli tune --profile "$OUT/cpu_tiny_profile.json" --acceptance-from profile \
  --out "$OUT/cpu_tiny_schedule.txt" --report "$OUT/cpu_tiny_tune.json"
