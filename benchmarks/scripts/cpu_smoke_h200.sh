#!/usr/bin/env bash
# CPU smoke of the two H200 calls at toy sizes: the same scripts, a random 'tiny'-preset pair,
# TP=1, C=1,2, 3 trials. Checks the pipeline end to end (prepare -> profile --floor -> tune ->
# sweeps -> tarballs -> summary version 2), not speed. tests/test_h200_scripts.py runs it.
#   -> $OUT/h200_call1.tar.gz, $OUT/h200_call2.tar.gz (the summary is in the second)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export OUT=${OUT:?set OUT} WORK=${WORK:?set WORK} PYTHON=${PYTHON:-python3}
export PRESET=tiny TP=1 DEVICE=cpu DTYPE=float32 INSTALL=0 GPU_TESTS=0 REF_MAX_SEQ=1024 BUILD_MAX_SEQ=1024
# toy lengths (the regimes' shapes, scaled down): A, B, and B's fixed-length means
export A_INPUT_LEN=24:48 A_OUTPUT_LEN=8:24 B_INPUT_LEN=8:24 B_OUTPUT_LEN=4:16 FIXED_INPUT_LEN=16 FIXED_OUTPUT_LEN=10
export A_CONTEXT=32 B_CONTEXT=16 A_MAX_SEQ=1032     # A's profile --floor decodes at 1024 context
export CONC=1,2 BATCHES=1,2 DRAFT_LENS=0,1,2 WARMUP=1 REPEATS=2 WARMUP_REQUESTS=0 MIN_REQUESTS=2 DEADLINE=600
export FIXED_CONC=1,2
bash "$here/h200_call1.sh" >/dev/null
mkdir -p "$WORK/a" && tar -xzf "$OUT/h200_call1.tar.gz" -C "$WORK/a"
A_RESULTS=$WORK/a POISSON_AT=2 bash "$here/h200_call2.sh" >/dev/null
