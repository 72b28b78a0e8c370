#!/usr/bin/env bash
# One H200, call 23 (<= 9.5 minutes): the host-work fixes of this session against call 22.
#   the GPU tests (whole-forward graphs now take the Triton decode kernel for decode rows);
#   mixed steps b=1 and b=64 + a 128-token chunk at 1024 context with traces (as call 22);
#   the paged decode kernel's knobs at b=1 and 64; decode_vs_gemm_floor once;
#   the varied and fixed baselines, regime B lengths, C=64 and 256, 3 waves, 3 trials (as calls 15/16).
#   -> $OUT/h200_call23.tar.gz
set -uo pipefail
CALL=23 TAG=h200_call23 DEADLINE=${DEADLINE:-565}
. "$(dirname "$0")/h200_lib.sh"
start 1 95
stage mixed-step 90 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --points 1:0:128,64:0:128 --context-len 1024 --trace "$RES/traces" --out "$RES/h200_c23_mixed_step.json"
stage flex-decode 50 "$PY" -m dynspec.benchmarks.flex_decode --batch-sizes 1,64 --context 1024 \
  --max-seq-len 1032 --variants triton,triton-p2,triton-p4,triton-w2,triton-w8,triton-t128 \
  --out "$RES/h200_c23_flex_decode.json"
stage floor 40 "$PY" "${FLOOR[@]}" --out "$RES/h200_c23_floor_profile.json"
VF=("${BASELINE_SWEEP[@]}" --concurrency 64,256 --waves 3)
stage varied-B 130 "$PY" "${VF[@]}" --input-len 64:192 --output-len 32:224 --out "$RES/h200_c23_B_varied"
stage fixed-B "$(( $(left) - 3 ))" "$PY" "${VF[@]}" --input-len 128 --output-len 128 --out "$RES/h200_c23_B_fixed"
finish
