#!/usr/bin/env bash
# One H200, call 22 (<= 9 minutes): where the two missed targets of issue 11 lose their time.
#   the GPU tests of the two Triton kernels (their review fixes ran on CPU only);
#   the paged decode kernel's knobs, tiles a program (p) among them, against flex, per b;
#   mixed steps b=1 and b=64 + a 128-token chunk at 1024 context: kernel tables and a Chrome
#   trace (CPU ops + kernels) of whole-graph mixed steps and of the decode step beside them;
#   decode_vs_gemm_floor once, for this lease.
#   -> $OUT/h200_call22.tar.gz: h200_c22_flex_decode.json, h200_c22_mixed_step.json, traces/,
#      h200_c22_floor_profile.json, h200_call22.log
set -uo pipefail
CALL=22 TAG=h200_call22 DEADLINE=${DEADLINE:-530}
. "$(dirname "$0")/h200_lib.sh"
GPU_TEST_PATHS="tests/test_gpu.py::test_paged_decode_equals_sdpa tests/test_gpu.py::test_rope_write_triton_equals_rope_write" start 1 60
stage flex-decode 110 "$PY" -m dynspec.benchmarks.flex_decode --batch-sizes 1,16,64,256 --context 1024 \
  --max-seq-len 1032 --variants flex,triton,triton-p2,triton-p4,triton-p18,triton-w2,triton-w8,triton-s1,triton-t128 \
  --out "$RES/h200_c22_flex_decode.json"
stage mixed-step 170 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --points 1:0:128,64:0:128 --context-len 1024 --kernels 10 --trace "$RES/traces" --out "$RES/h200_c22_mixed_step.json"
stage floor "$(( $(left) - 3 ))" "$PY" -m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16 \
  --no-progress --batch-sizes 1 --draft-lens 0 --context-len 1024 --max-seq-len 1032 --warmup 2 --repeats 6 --floor \
  --out "$RES/h200_c22_floor_profile.json"
finish
