#!/usr/bin/env bash
# One H200, call 27 (<= 9.8 minutes), after call 26 on the same machine (the engine reused):
#   the varied and fixed baselines at C=256 (regime B lengths, 12 waves, 3 trials);
#   regime B profiled and tuned on this engine (b 1..256, K 0,1,3,5,7 at 192 of context), then swept
#   (baseline / static K=7 / dynamic, 3 trials, varied lengths) at C=1, 4, 16 and 64.
#   -> $OUT/h200_call27.tar.gz (h200_c27_B_schedule.txt: call 28 sweeps C=256 with it)
set -uo pipefail
CALL=27 TAG=h200_call27 DEADLINE=${DEADLINE:-585}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
VF=("${BASELINE_SWEEP[@]}" --concurrency 256 --waves 12)
stage varied-B256 170 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c27_B256_varied"
stage fixed-B256 150 "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c27_B256_fixed"
stage profile-B 110 "$PY" -m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16 \
  --no-progress --batch-sizes 1,4,16,64,256 --draft-lens 0,1,3,5,7 --context-len 192 --max-seq-len 424 \
  --warmup 2 --repeats 6 --out "$RES/h200_c27_B_profile.json"
stage tune-B 20 "$PY" -m dynspec.cli tune --profile "$RES/h200_c27_B_profile.json" --acceptance 0.5 --min-gain 1.0 \
  --out "$RES/h200_c27_B_schedule.txt" --report "$RES/h200_c27_B_tune.json"
cp "$RES/h200_c27_B_schedule.txt" "$WORK/B_schedule.txt" 2>/dev/null
stage B-small-C "$(( $(left) - 3 ))" "$PY" "${REGIME_B_SWEEP[@]}" --dynamic-schedule "@$RES/h200_c27_B_schedule.txt" \
  --concurrency 1,4,16,64 --out "$RES/h200_c27_B"
finish
