#!/usr/bin/env bash
# One H200 regime: profile (same run) -> tune -> sweep baseline / static / dynamic(tuned).
# Called by h200_regime_a.sh and h200_regime_b.sh, which set the regime's parameters:
#   REGIME (name)  P (Bernoulli acceptance)  INPUT_LEN  OUTPUT_LEN  STATIC_K  CONTEXT (profile KV length)
# Needs ENGINE_DIR (from `dynspec build`, e.g. of the random Llama-3.1-8B-shaped pair).
#   -> $OUT/h200_$REGIME.{json,md,png}, _profile.json, _schedule.txt, _tune.json
set -euo pipefail
: "${ENGINE_DIR:?set ENGINE_DIR to an engine dir written by dynspec build}"
: "${REGIME:?}" "${P:?}" "${INPUT_LEN:?}" "${OUTPUT_LEN:?}" "${STATIC_K:?}" "${CONTEXT:?}"
OUT=${OUT:-benchmarks/results}
NGPU=${NGPU:-1}
DTYPE=${DTYPE:-bfloat16}
CONC=${CONC:-1,2,4,8,16,32,64,128,256}
BATCHES=${BATCHES:-1,2,4,8,16,32,48,64,96,128,192,256}
DRAFT_LENS=${DRAFT_LENS:-0,1,2,3,4,5,6,7}
PY=${PYTHON:-python}
MPIRUN=${MPIRUN:-mpirun}
ROOT_FLAGS=(); [ "$(id -u)" = 0 ] && ROOT_FLAGS=(--allow-run-as-root)
export NCCL_NVLS_ENABLE=0
name="h200_${REGIME}"
# one cache length for profile and sweep: captured graphs attend over the whole cache
MAX_SEQ=${MAX_SEQ:-$((INPUT_LEN + OUTPUT_LEN + 8))}
mkdir -p "$OUT"
"$PY" -m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype "$DTYPE" \
  --batch-sizes "$BATCHES" --draft-lens "$DRAFT_LENS" --context-len "$CONTEXT" --max-seq-len "$MAX_SEQ" --warmup "${WARMUP:-5}" --repeats "${REPEATS:-20}" \
  --out "$OUT/${name}_profile.json"
"$PY" -m dynspec.cli tune --profile "$OUT/${name}_profile.json" --acceptance "$P" --min-gain "${MIN_GAIN:-1.0}" \
  --out "$OUT/${name}_schedule.txt" --report "$OUT/${name}_tune.json"
"$MPIRUN" -n "$NGPU" "${ROOT_FLAGS[@]}" -x NCCL_NVLS_ENABLE=0 \
  "$PY" -m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype "$DTYPE" \
    --concurrency "$CONC" --modes baseline,static,dynamic --static-k "$STATIC_K" \
    --dynamic-schedule "@$OUT/${name}_schedule.txt" --acceptance "bernoulli:$P" \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --max-seq-len "$MAX_SEQ" --waves "${WAVES:-2}" --min-requests "${MIN_REQUESTS:-4}" \
    --out "$OUT/$name"
