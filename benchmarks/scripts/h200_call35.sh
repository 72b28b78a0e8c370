#!/usr/bin/env bash
# One H200, call 35 (<= 6 minutes), a second lease after calls 31-34:
#   regime B re-profiled with batch sizes between 64 and 256 (call 27's profile had none there, so
#   tune interpolated K=1's step time linearly up to its 242 threshold), re-tuned, and swept at
#   C=256 with 3 waves of requests (the lease's 1 wave ran 3.3 s a trial; its baseline trials
#   spread 7%; the later --waves wins over SWEEP3's).
#   -> $OUT/h200_call35.tar.gz
set -uo pipefail
CALL=35 TAG=h200_call35 DEADLINE=${DEADLINE:-360}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage profile-B 90 "$PY" -m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16 \
  --no-progress --batch-sizes 1,4,16,64,128,192,256 --draft-lens 0,1,3 --context-len 192 --max-seq-len 424 \
  --warmup 2 --repeats 6 --out "$RES/h200_c35_B_profile.json"
stage tune-B 20 "$PY" -m dynspec.cli tune --profile "$RES/h200_c35_B_profile.json" --acceptance 0.5 --min-gain 1.0 \
  --out "$RES/h200_c35_B_schedule.txt" --report "$RES/h200_c35_B_tune.json"
stage B256-3waves "$(( $(left) - 3 ))" "$PY" "${REGIME_B_SWEEP[@]}" --waves 3 \
  --dynamic-schedule "@$RES/h200_c35_B_schedule.txt" --concurrency 256 --out "$RES/h200_c35_B256"
finish
