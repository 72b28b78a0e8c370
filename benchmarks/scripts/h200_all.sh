#!/usr/bin/env bash
# Every H200 number in one run (one GPU lease): prepare the random 8B pair, GPU tests,
# decode bandwidth, regime B and regime A (profile -> tune -> sweep), then the tiny real pair.
# Results land in $OUT (default benchmarks/results); `h200_summary.sh` then makes h200_summary.json.
set -uo pipefail
export OUT=${OUT:-benchmarks/results} NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export ENGINE_DIR=${ENGINE_DIR:-/tmp/dynspec_h200/engine}
here=$(dirname "$0")
mkdir -p "$OUT"
bash "$here/h200_prepare.sh" 2>&1 | grep -v "it/s\|tensor/s" | tail -3
python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -2
bash "$here/h200_decode_bandwidth.sh" 2>&1 | tail -6
BATCHES=${BATCHES_B:-1,2,4,8,16,32,64,128,256} DRAFT_LENS=0,1,2,3,4,5,6,7 bash "$here/h200_regime_b.sh" 2>&1 | grep -v "round/s\|it/s\|req/s" | tail -22
BATCHES=${BATCHES_A:-1,2,4,8,16,32,64,128,256} DRAFT_LENS=0,1,2,3,4,5 bash "$here/h200_regime_a.sh" 2>&1 | grep -v "round/s\|it/s\|req/s" | tail -22
