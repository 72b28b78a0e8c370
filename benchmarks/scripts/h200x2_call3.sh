#!/usr/bin/env bash
# nvidia-h200-x2 call 3 (<= 8 minutes): prepare; the regime-A profile + tune at TP=2 with the NCCL
# all-reduce (call 2's, with the one-shot kernel, hung in graph warm-up: see h200x2_call2.log);
# then issue 11's C=128 points, regime B on GPU 0 and regime A on GPU 1 side by side (each a
# one-GPU replica: the two GPUs share nothing but the host), with last round's tuned schedules.
#   -> $OUT/h200x2_call3.tar.gz: h200x2_A_tp2_*, h200_B128.*, h200_A128.*, h200x2_call3.log
set -uo pipefail
CALL=x2_3 TAG=h200x2_call3 DEADLINE=${DEADLINE:-450}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
TP=2 TP_LIMIT=150 PROFILE_EXTRA="--allreduce nccl" . "$here/h200x2_regime_a_tp.sh"
common=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
        --concurrency 128 --modes baseline,static,dynamic --trials 3 --waves 1 --min-requests 2
        --warmup-requests 0 --no-progress)
limit=$(( $(left) - 5 ))
stage C128-A-and-B "$limit" bash -c "
  CUDA_VISIBLE_DEVICES=0 $PY ${common[*]} --static-k 7 --dynamic-schedule @benchmarks/results/h200_B_schedule.txt \
    --acceptance bernoulli:0.5 --input-len 64:192 --output-len 32:224 --max-seq-len 424 --out $RES/h200_B128 &
  CUDA_VISIBLE_DEVICES=1 $PY ${common[*]} --static-k 3 --dynamic-schedule @benchmarks/results/h200_A_schedule.txt \
    --acceptance bernoulli:0.7 --input-len 512:1024 --output-len 64:448 --max-seq-len 1480 --out $RES/h200_A128 &
  wait"
finish
