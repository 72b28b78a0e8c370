#!/usr/bin/env bash
# Regime B: acceptance 0.5, prompts 64..192, outputs 32..224 (means 128 / 128), static K=7
# (deep speculation that must lose under load). Profile at the mean context (128 + 64 = 192).
set -euo pipefail
REGIME=B P=0.5 INPUT_LEN=${B_INPUT_LEN:-64:192} OUTPUT_LEN=${B_OUTPUT_LEN:-32:224} STATIC_K=7 CONTEXT=${B_CONTEXT:-192} DRAFT_LENS=${DRAFT_LENS:-0,1,2,3,4,5,6,7} \
  exec "$(dirname "$0")/h200_regime.sh"
