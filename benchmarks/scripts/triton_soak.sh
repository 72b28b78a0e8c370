#!/usr/bin/env bash
# 10 minutes of the reference Triton model (tiny pair, CPU) under mixed good,
# malformed, cancelled and disconnected loopback load; RSS of tritonserver and the python stub
# every 30 s, slope after warm-up, nothing left behind at the end.
#   -> $OUT/triton_soak.json, triton_soak.png (OUT default: benchmarks/results/triton_soak)
set -euo pipefail
OUT=${OUT:-benchmarks/results/triton_soak}
mkdir -p "$OUT"
"${PYTHON:-python}" -m dynspec.benchmarks.triton_soak --minutes "${MINUTES:-10}" --clients 2 --sample-s 30 \
  --out "$OUT/triton_soak.json" --plot "$OUT/triton_soak.png"
