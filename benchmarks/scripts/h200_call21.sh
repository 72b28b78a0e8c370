#!/usr/bin/env bash
# One H200, call 21 (<= 9.5 minutes; for the next lease, after h200_call20.sh; not yet run):
#   mixed steps with kernel tables of the piecewise and the whole-graph step (what a whole-graph
#   mixed step still runs outside its graph: the draft's passes, the head; varied_vs_fixed's lever);
#   regime B re-profiled and re-tuned on the engine's defaults (whole-forward mixed graphs, Triton
#   kernels), then swept at C=1, 4, 16, 64, 256 (its schedule is still the older tree's).
#   -> $OUT/h200_call21.tar.gz: h200_c21_mixed_step.json, h200_B{,_profile,_tune}.*, h200_B_schedule.txt, h200_call21.log
set -uo pipefail
CALL=21 TAG=h200_call21 DEADLINE=${DEADLINE:-565}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage mixed-step 150 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --points 1:0:128,64:0:128,64:2:64 --kernels 10 --out "$RES/h200_c21_mixed_step.json"
stage regime-B "$(( $(left) - 3 ))" env RES="$RES" REGIME=B P=0.5 INPUT_LEN=64:192 OUTPUT_LEN=32:224 STATIC_K=7 \
  CONTEXT=192 CONC=1,4,16,64,256 BATCHES=1,4,16,64,256 DRAFT_LENS=0,1,3,5,7 REPEATS=6 bash "$here/h200_regime.sh"
finish
