#!/usr/bin/env bash
# One H200, call 25 (<= 5.5 minutes, the session's last device time): a third floor pair (chained /
# single decode graphs) for medians of three, and the varied and fixed baselines at C=64 over 20
# waves: a closed loop of varied lengths drains over about one longest output, whatever its length,
# so only a long run shows what inflight batching costs per iteration.
#   -> $OUT/h200_call25.tar.gz
set -uo pipefail
CALL=25 TAG=h200_call25 DEADLINE=${DEADLINE:-330}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
FL=(-m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16 --no-progress
    --batch-sizes 1 --draft-lens 0 --context-len 1024 --max-seq-len 1032 --warmup 2 --repeats 6 --floor)
stage floor-chain3 35 "$PY" "${FL[@]}" --out "$RES/h200_c25_floor_chain3_profile.json"
stage floor-one3 35 "$PY" "${FL[@]}" --no-split-graphs --out "$RES/h200_c25_floor_one3_profile.json"
VF=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
    --concurrency 64 --modes baseline --waves 20 --trials 3 --min-requests 2 --no-progress
    --acceptance bernoulli:0.5 --max-seq-len 424)
stage varied-B64 110 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c25_B64_varied"
stage fixed-B64 "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c25_B64_fixed"
finish
