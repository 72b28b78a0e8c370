#!/usr/bin/env bash
# Regime A: acceptance 0.7, prompts 512..1024, outputs 64..448 (means 768 / 256), static K=3.
# Profile at the mean context (768 + 256/2 = 896) with --floor. ENGINE_DIR must be set.
set -euo pipefail
REGIME=A P=0.7 INPUT_LEN=${A_INPUT_LEN:-512:1024} OUTPUT_LEN=${A_OUTPUT_LEN:-64:448} STATIC_K=3 CONTEXT=${A_CONTEXT:-896} MAX_SEQ=${A_MAX_SEQ:-} FLOOR=${FLOOR:-1} \
  exec "$(dirname "$0")/h200_regime.sh"
