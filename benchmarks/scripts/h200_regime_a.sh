#!/usr/bin/env bash
# Published numbers: regime A on the H200 (acceptance 0.7, prompt + output ~1024 tokens, static K=3).
# Profile at the sweep's mean context (768 + 256/2 = 896). ENGINE_DIR must be set.
set -euo pipefail
REGIME=A P=0.7 INPUT_LEN=768 OUTPUT_LEN=256 STATIC_K=3 CONTEXT=896 \
  exec "$(dirname "$0")/h200_regime.sh"
