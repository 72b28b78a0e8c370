#!/usr/bin/env bash
# Published numbers: regime B on the H200 (acceptance 0.5, contexts <= 256 tokens, static K=7:
# deep speculation that must lose under load). Profile at the mean context (128 + 64 = 192).
set -euo pipefail
REGIME=B P=0.5 INPUT_LEN=128 OUTPUT_LEN=128 STATIC_K=7 CONTEXT=192 \
  exec "$(dirname "$0")/h200_regime.sh"
