#!/usr/bin/env bash
# nvidia-h200-x2 call 5 (<= 9 minutes): issue 11's C=256 points and the varied-vs-fixed baseline,
# each GPU a one-GPU replica (the two share nothing but the host). GPU 1: regime A at C=256 (3
# modes, 3 trials, last round's tuned schedule). GPU 0: regime B at C=256, then the baseline at
# C=64 and 256 with regime B's mean lengths fixed (128/128) and then varied (64..192 / 32..224),
# 4 waves each so that finished rows are refilled while others decode (steady_tok_per_s).
#   -> $OUT/h200x2_call5.tar.gz: h200_{A,B}256.*, h200_B_fixed.*, h200_B_varied.*, h200x2_call5.log
set -uo pipefail
CALL=x2_5 TAG=h200x2_call5 DEADLINE=${DEADLINE:-540}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
sweep=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
       --trials 3 --min-requests 2 --warmup-requests 0 --no-progress)
C256=("${sweep[@]}" --concurrency 256 --modes baseline,static,dynamic --waves 1)
VF=("${sweep[@]}" --concurrency 64,256 --modes baseline --waves 4 --acceptance bernoulli:0.5 --max-seq-len 424)
limit=$(( $(left) - 5 ))
stage C256-and-varied-vs-fixed "$limit" bash -c "
  { CUDA_VISIBLE_DEVICES=0 $PY ${C256[*]} --static-k 7 --dynamic-schedule @benchmarks/results/h200_B_schedule.txt \
      --acceptance bernoulli:0.5 --input-len 64:192 --output-len 32:224 --max-seq-len 424 --out $RES/h200_B256
    CUDA_VISIBLE_DEVICES=0 $PY ${VF[*]} --input-len 128 --output-len 128 --out $RES/h200_B_fixed
    CUDA_VISIBLE_DEVICES=0 $PY ${VF[*]} --input-len 64:192 --output-len 32:224 --out $RES/h200_B_varied; } &
  CUDA_VISIBLE_DEVICES=1 $PY ${C256[*]} --static-k 3 --dynamic-schedule @benchmarks/results/h200_A_schedule.txt \
    --acceptance bernoulli:0.7 --input-len 512:1024 --output-len 64:448 --max-seq-len 1480 --out $RES/h200_A256 &
  wait"
finish
