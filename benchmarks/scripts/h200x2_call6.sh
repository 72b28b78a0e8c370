#!/usr/bin/env bash
# nvidia-h200-x2 call 6 (<= 7 minutes): replica scaling (one GPU against `mpirun -n 2` TP=1
# replicas, regime-B lengths at C=64 per replica, 2 waves so that rows are refilled: the summary's
# replica_scaling_steady compares iterations at >= 0.9 C), then the regime-A profile at TP=1 with
# --floor (decode_vs_gemm_floor, and the TP=1 crossover in the same lease as call 4's TP=2 one).
#   -> $OUT/h200x2_call6.tar.gz: h200x2_scaling_{1gpu,2rep}.*, h200x2_A_tp1_*, h200x2_call6.log
set -uo pipefail
CALL=x2_6 TAG=h200x2_call6 DEADLINE=${DEADLINE:-420}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
SWEEP=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
       --concurrency "${SCALING_C:-64}" --modes baseline,static,dynamic --static-k 7
       --dynamic-schedule "@benchmarks/results/h200_B_schedule.txt" --acceptance bernoulli:0.5
       --input-len 64:192 --output-len 32:224 --max-seq-len 424 --trials 3 --waves 2 --min-requests 2
       --warmup-requests 0 --no-progress)
stage scaling-1gpu 100 env CUDA_VISIBLE_DEVICES=0 "$PY" "${SWEEP[@]}" --out "$RES/h200x2_scaling_1gpu"
stage scaling-2rep 110 "${MPI[@]}" "$PY" "${SWEEP[@]}" --out "$RES/h200x2_scaling_2rep"
TP=1 TP_LIMIT=$(( $(left) - 35 )) PROFILE_EXTRA="--floor" . "$here/h200x2_regime_a_tp.sh"
finish
