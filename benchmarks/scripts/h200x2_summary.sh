#!/usr/bin/env bash
# benchmarks/results/h200x2_summary.json from the nvidia-h200-x2 calls' files (CPU is fine).
# A missing TP=2 tune report leaves crossover_concurrency.tp2 null, saying why.
set -euo pipefail
R=${RES:-benchmarks/results}
tune=(--tune "tp1=$R/h200x2_A_tp1_tune.json")
[ -f "$R/h200x2_A_tp2_tune.json" ] && tune+=(--tune "tp2=$R/h200x2_A_tp2_tune.json")
"${PYTHON:-python3}" -m dynspec.benchmarks.tp_summary --decode "tp1=$R/h200x2_tp1_decode.json" \
  --decode "tp2=$R/h200x2_tp2_decode.json" "${tune[@]}" --scaling-one "$R/h200x2_scaling_1gpu.json" \
  --scaling-two "$R/h200x2_scaling_2rep.json" --out "$R/h200x2_summary.json"
