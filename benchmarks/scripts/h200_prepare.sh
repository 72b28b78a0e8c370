#!/usr/bin/env bash
# Prepare the engine the H200 scripts measure: install dynspec (offline), write the random
# Llama-3.1-8B-shaped pair, convert it for TP=8 and build $WORK/engine (bf16 reference settings).
# Skips everything when $WORK/engine/engine.json exists (a warm machine's second call).
#   -> $WORK/hf/{target,draft}, $WORK/ckpt/{target,draft}, $WORK/engine
# CPU smoke (cpu_smoke_h200.sh): PRESET=tiny TP=1 DEVICE=cpu INSTALL=0 BUILD_MAX_SEQ=REF_MAX_SEQ=1024.
set -euo pipefail
WORK=${WORK:-/tmp/dynspec_h200}
PY=${PYTHON:-python3}
PRESET=${PRESET:-llama-3.1-8b} TP=${TP:-8} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16}
if [ -f "$WORK/engine/engine.json" ]; then
  echo "prepare: reusing $WORK/engine"
  exit 0
fi
[ "${INSTALL:-1}" = 1 ] && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
"$PY" -m dynspec.pairs.random_pair --out "$WORK/hf" --preset "$PRESET" --dtype "$DTYPE" --device "$DEVICE" --force
"$PY" -m dynspec.cli convert target --hf "$WORK/hf/target" --out "$WORK/ckpt/target" --tp "$TP" --dtype "$DTYPE" --force
"$PY" -m dynspec.cli convert eagle3 --draft "$WORK/hf/draft" --target "$WORK/ckpt/target" --out "$WORK/ckpt/draft" --tp "$TP" --force
"$PY" -m dynspec.cli build --target "$WORK/ckpt/target" --draft "$WORK/ckpt/draft" --out "$WORK/engine" --tp "$TP" \
  --threshold 32 --max-draft-len 4 --max-seq-len "${BUILD_MAX_SEQ:-2048}" --force \
  --reference-dtype "$DTYPE" --reference-max-batch-size 256 --reference-max-seq-len "${REF_MAX_SEQ:-1480}"
