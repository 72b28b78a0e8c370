#!/usr/bin/env bash
# The baseline with FIXED lengths at regime B's means (prompt 128, output 128), same trials and
# request counts as h200_regime_b.sh: varied_vs_fixed_baseline = h200_B baseline / this, per C.
#   -> $RES/h200_B_fixed.{json,md,png}
set -euo pipefail
: "${ENGINE_DIR:?set ENGINE_DIR to an engine dir written by dynspec build}"
RES=${RES:-benchmarks/results}
mkdir -p "$RES"
NCCL_NVLS_ENABLE=0 "${PYTHON:-python3}" -m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" \
  --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" --concurrency "${FIXED_CONC:-64,256}" --modes baseline \
  --acceptance bernoulli:0.5 --input-len "${FIXED_INPUT_LEN:-128}" --output-len "${FIXED_OUTPUT_LEN:-128}" --max-seq-len "${MAX_SEQ:-424}" --trials "${TRIALS:-3}" \
  --waves "${WAVES:-1}" --min-requests "${MIN_REQUESTS:-2}" --warmup-requests "${WARMUP_REQUESTS:-2}" \
  --no-progress --out "$RES/h200_B_fixed"
