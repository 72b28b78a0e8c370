#!/usr/bin/env bash
# Every H200 number in one GPU lease: prepare the random 8B pair, GPU tests, decode bandwidth,
# regime A and regime B (profile -> tune -> sweep). Results land in $OUT (default
# benchmarks/results); `h200_summary.sh` then makes h200_summary.json from them (CPU is fine).
# Each stage has a time limit so a lease of 10 minutes always brings back what finished.
set -uo pipefail
export OUT=${OUT:-benchmarks/results} NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export ENGINE_DIR=${ENGINE_DIR:-/tmp/dynspec_h200/engine} WARMUP=${WARMUP:-2} REPEATS=${REPEATS:-8}
here=$(dirname "$0")
quiet() { grep --line-buffered -v "round/s\|it/s\|req/s\|tensor/s"; }
mkdir -p "$OUT"
bash "$here/h200_prepare.sh" 2>&1 | quiet | tail -2
timeout 120 python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -2
timeout 60 bash "$here/h200_decode_bandwidth.sh" 2>&1 | quiet | tail -6
BATCHES=1,2,4,8,16,32,64,128,256 DRAFT_LENS=0,1,2,3,4,5 timeout "${TIME_A:-290}" bash "$here/h200_regime_a.sh" 2>&1 | quiet | tail -18
BATCHES=1,2,4,8,16,32,64,128,256 DRAFT_LENS=0,1,2,3,4,5,6,7 timeout "${TIME_B:-170}" bash "$here/h200_regime_b.sh" 2>&1 | quiet | tail -18
