#!/usr/bin/env bash
# On the H200: install dynspec (offline), write the random Llama-3.1-8B-shaped pair, convert it
# for TP=8 and build ENGINE_DIR (bf16 reference settings). Used by the h200_*.sh scripts.
#   -> $WORK/hf/{target,draft}, $WORK/ckpt/{target,draft}, $WORK/engine
set -euo pipefail
WORK=${WORK:-/tmp/dynspec_h200}
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
"$PY" -m dynspec.runtime.engines.reference.random_pair --out "$WORK/hf" --preset llama-3.1-8b --dtype bfloat16 --device cuda --force
"$PY" -m dynspec.cli convert target --hf "$WORK/hf/target" --out "$WORK/ckpt/target" --tp 8 --dtype bfloat16 --force
"$PY" -m dynspec.cli convert eagle3 --draft "$WORK/hf/draft" --target "$WORK/ckpt/target" --out "$WORK/ckpt/draft" --tp 8 --force
"$PY" -m dynspec.cli build --target "$WORK/ckpt/target" --draft "$WORK/ckpt/draft" --out "$WORK/engine" --tp 8 \
  --threshold 32 --max-draft-len 4 --max-seq-len 2048 --force \
  --reference-dtype bfloat16 --reference-max-batch-size 256 --reference-max-seq-len 1040
