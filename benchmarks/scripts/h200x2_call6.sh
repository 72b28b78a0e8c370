#!/usr/bin/env bash
# nvidia-h200-x2 call 6 (<= 9 minutes; not yet run: the two-GPU kind was not lent in the session
# that wrote it): replica scaling (one GPU against `mpirun -n 2` TP=1 replicas, regime-B lengths
# at C=64 per replica, 2 waves so that rows are refilled: the summary's replica_scaling_steady
# compares iterations at >= 0.9 C), then the regime-A profile + tune at TP=1 and at TP=2 (the
# crossover of each, in one lease; decode_vs_gemm_floor came from h200_call5.sh).
#   -> $OUT/h200x2_call6.tar.gz: h200x2_scaling_{1gpu,2rep}.*, h200x2_A_tp{1,2}_*, h200x2_call6.log
set -uo pipefail
CALL=x2_6 TAG=h200x2_call6 DEADLINE=${DEADLINE:-550}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
SWEEP=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
       --concurrency "${SCALING_C:-64}" --modes baseline,static,dynamic --static-k 7
       --dynamic-schedule "@benchmarks/results/h200_B_schedule.txt" --acceptance bernoulli:0.5
       --input-len 64:192 --output-len 32:224 --max-seq-len 424 --trials 3 --waves 2 --min-requests 2
       --warmup-requests 0 --no-progress)
stage scaling-1gpu 100 env CUDA_VISIBLE_DEVICES=0 "$PY" "${SWEEP[@]}" --out "$RES/h200x2_scaling_1gpu"
stage scaling-2rep 110 "${MPI[@]}" "$PY" "${SWEEP[@]}" --out "$RES/h200x2_scaling_2rep"
TP=1 TP_LIMIT=110 . "$here/h200x2_regime_a_tp.sh"
TP=2 TP_LIMIT=$(( $(left) - 35 )) . "$here/h200x2_regime_a_tp.sh"
finish
