#!/usr/bin/env bash
# One regime: profile (FLOOR=1 adds gemm_floor_ms and decode at b=1, 1024 context) -> tune ->
# sweep baseline / static / dynamic(tuned), TRIALS trials per point with the mode order rotated,
# matched-load Poisson at POISSON_AT. Called by h200_regime_a.sh / h200_regime_b.sh, which set
#   REGIME  P (Bernoulli acceptance)  INPUT_LEN / OUTPUT_LEN (LO:HI, uniform)  STATIC_K  CONTEXT
# Needs ENGINE_DIR (h200_prepare.sh).
#   -> $RES/h200_$REGIME.{json,md,png}, _profile.json, _schedule.txt, _tune.json
set -euo pipefail
: "${ENGINE_DIR:?set ENGINE_DIR to an engine dir written by dynspec build}"
: "${REGIME:?}" "${P:?}" "${INPUT_LEN:?}" "${OUTPUT_LEN:?}" "${STATIC_K:?}" "${CONTEXT:?}"
RES=${RES:-benchmarks/results}
DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16} PY=${PYTHON:-python3}
CONC=${CONC:-1,4,16,64,256}
BATCHES=${BATCHES:-1,2,4,8,16,32,64,128,256}
DRAFT_LENS=${DRAFT_LENS:-0,1,2,3,4,5}
export NCCL_NVLS_ENABLE=0
name="h200_${REGIME}"
# one cache length for profile and sweep: the longest request + K + 1 (graphs may attend over all of it)
MAX_SEQ=${MAX_SEQ:-$(( ${INPUT_LEN#*:} + ${OUTPUT_LEN#*:} + 8 ))}
FLOOR_FLAG=(); [ "${FLOOR:-0}" = 1 ] && FLOOR_FLAG=(--floor)
POISSON_FLAG=(); [ -n "${POISSON_AT:-}" ] && POISSON_FLAG=(--poisson-at "$POISSON_AT")
mkdir -p "$RES"
"$PY" -m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device "$DEVICE" --dtype "$DTYPE" --no-progress \
  --batch-sizes "$BATCHES" --draft-lens "$DRAFT_LENS" --context-len "$CONTEXT" --max-seq-len "$MAX_SEQ" \
  --warmup "${WARMUP:-2}" --repeats "${REPEATS:-8}" "${FLOOR_FLAG[@]}" --out "$RES/${name}_profile.json"
"$PY" -m dynspec.cli tune --profile "$RES/${name}_profile.json" --acceptance "$P" --min-gain "${MIN_GAIN:-1.0}" \
  --out "$RES/${name}_schedule.txt" --report "$RES/${name}_tune.json"
"$PY" -m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device "$DEVICE" --dtype "$DTYPE" \
  --concurrency "$CONC" "${POISSON_FLAG[@]}" --modes baseline,static,dynamic --static-k "$STATIC_K" \
  --dynamic-schedule "@$RES/${name}_schedule.txt" --acceptance "bernoulli:$P" \
  --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --max-seq-len "$MAX_SEQ" --trials "${TRIALS:-3}" \
  --waves "${WAVES:-1}" --min-requests "${MIN_REQUESTS:-2}" --warmup-requests "${WARMUP_REQUESTS:-2}" \
  --no-progress --out "$RES/$name"
