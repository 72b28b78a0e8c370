#!/usr/bin/env bash
# nvidia-h200-x2 call 2 (<= 9.5 minutes): prepare, the regime-A profile + tune at TP=2 (call 1
# made TP=1's: benchmarks/results/h200x2_A_tp1_*), the TP=2 GPU tests, replica scaling (one GPU
# against `mpirun -n 2` replicas of TP=1, regime-A lengths at C=16 per replica, 3 modes, 3 trials,
# the TP=1 tuned schedule), and the kernels of a TP=1 b=1 decode step (torch.profiler).
#   -> $OUT/h200x2_call2.tar.gz: h200x2_A_tp2_*, h200x2_scaling_{1gpu,2rep}.{json,md,png},
#      h200x2_tp1_kernels.json, h200x2_call2.log
set -uo pipefail
CALL=x2_2 TAG=h200x2_call2 DEADLINE=${DEADLINE:-560}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
TP=2 TP_LIMIT=150 . "$here/h200x2_regime_a_tp.sh"
stage gpu-tests-tp 130 "$PY" -m pytest -q -m gpu tests/test_gpu_tp.py -p no:cacheprovider -x
SWEEP=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
       --concurrency "${SCALING_C:-16}" --modes baseline,static,dynamic --static-k 3
       --dynamic-schedule "@benchmarks/results/h200x2_A_tp1_schedule.txt" --acceptance bernoulli:0.7
       --input-len 512:1024 --output-len 64:448 --max-seq-len 1480 --trials 3 --waves 1 --min-requests 2
       --warmup-requests 0 --no-progress)
stage scaling-1gpu 95 env CUDA_VISIBLE_DEVICES=0 "$PY" "${SWEEP[@]}" --out "$RES/h200x2_scaling_1gpu"
stage scaling-2rep 105 "${MPI[@]}" "$PY" "${SWEEP[@]}" --out "$RES/h200x2_scaling_2rep"
stage tp1-kernels "$(( $(left) - 3 ))" env CUDA_VISIBLE_DEVICES=0 "$PY" -m dynspec.benchmarks.tp_decode \
  --engine-dir "$ENGINE_DIR" --device cuda --trials 1 --repeats 20 --kernels 20 --out "$RES/h200x2_tp1_kernels.json"
finish
