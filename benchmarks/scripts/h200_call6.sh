#!/usr/bin/env bash
# One H200, call 6 (<= 8 minutes): mixed iterations eager vs piecewise again, now with a kernel
# table per point (kernel time against wall time: is a mixed step host-bound?), then issue 11's
# regime A at C=256 (3 modes, 3 trials, the tuned schedule its other points ran).
#   -> $OUT/h200_call6.tar.gz: h200_mixed_step.json, h200_A256.{json,md,png}, h200_call6.log
set -uo pipefail
CALL=6 TAG=h200_call6 DEADLINE=${DEADLINE:-500}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage mixed-step 110 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda --kernels 10 \
  --out "$RES/h200_mixed_step.json"
stage C256-A "$(( $(left) - 3 ))" "$PY" -m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" \
  --device cuda --dtype bfloat16 --concurrency 256 --modes baseline,static,dynamic --waves 1 --trials 3 \
  --min-requests 2 --warmup-requests 0 --no-progress --static-k 3 --dynamic-schedule @benchmarks/results/h200_A_schedule.txt \
  --acceptance bernoulli:0.7 --input-len 512:1024 --output-len 64:448 --max-seq-len 1480 --out "$RES/h200_A256"
finish
