#!/usr/bin/env bash
# One H200, call 13 (<= 9.5 minutes; for the next lease, not yet run): what calls 9-12 left
# unmeasured on the static-batch engine with PackedChunks.
#   mixed steps side by side: eager / piecewise (PackedChunks) / piecewise with SDPA chunks /
#   whole-forward graphs (mixed_graphs.py, attention inside), and the GPU test of the latter;
#   flex alone with dynamo reset per variant (the symbolic-batch column in the same run);
#   regime A and B at C=1, 4, 16 (3 modes, 3 trials, the sweep's default warm-up this time).
#   -> $OUT/h200_call13.tar.gz: h200_mixed_step.json, h200_flex_decode_engine.json,
#      h200_c13_A.*, h200_c13_B.*, h200_call13.log
set -uo pipefail
CALL=13 TAG=h200_call13 DEADLINE=${DEADLINE:-565}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage gpu-tests 100 "$PY" -m pytest -q -m gpu tests/test_gpu.py -k "whole_mixed or several_query_blocks or (graphs_equal and flex)" -p no:cacheprovider
stage mixed-step 170 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --out "$RES/h200_mixed_step.json"
stage flex-decode 100 "$PY" -m dynspec.benchmarks.flex_decode --batch-sizes 1,16,64,256 \
  --variants flex,flex_dynamic,flex_static --out "$RES/h200_flex_decode_engine.json"
SW=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
    --concurrency 1,4,16 --modes baseline,static,dynamic --waves 1 --trials 3 --min-requests 2 --no-progress)
stage small-C-A 120 "$PY" "${SW[@]}" --static-k 3 --dynamic-schedule @benchmarks/results/h200_A_floor_schedule.txt \
  --acceptance bernoulli:0.7 --input-len 512:1024 --output-len 64:448 --max-seq-len 1480 --out "$RES/h200_c13_A"
stage small-C-B "$(( $(left) - 3 ))" "$PY" "${SW[@]}" --static-k 7 --dynamic-schedule @benchmarks/results/h200_B_schedule.txt \
  --acceptance bernoulli:0.5 --input-len 64:192 --output-len 32:224 --max-seq-len 424 --out "$RES/h200_c13_B"
finish
