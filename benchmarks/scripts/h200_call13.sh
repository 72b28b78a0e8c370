#!/usr/bin/env bash
# One H200, call 13 (<= 9.5 minutes; for the next lease, not yet run): what calls 9-12 left
# unmeasured on the static-batch engine with PackedChunks.
#   the GPU tests of the whole-forward mixed graphs (mixed_graphs.py) and of prompt chunks over
#   several query blocks (piecewise and whole), first, so a cut stage loses the least;
#   mixed steps side by side: eager / piecewise (PackedChunks) / piecewise with SDPA chunks /
#   whole-forward graphs (mixed_step writes its JSON after every point);
#   regime A at C=1, 4, 16 (3 modes, 3 trials, the sweep's default warm-up this time).
# Left for a later call: flex_decode with a dynamo reset per variant, regime B at C=1, 4, 16.
#   -> $OUT/h200_call13.tar.gz: h200_mixed_step.json, h200_c13_A.*, h200_call13.log
set -uo pipefail
CALL=13 TAG=h200_call13 DEADLINE=${DEADLINE:-565}
. "$(dirname "$0")/h200_lib.sh"
start 0 0
stage gpu-tests 180 "$PY" -m pytest -q -m gpu -p no:cacheprovider \
  "tests/test_gpu.py::test_whole_mixed_graphs_equal_transformers" \
  "tests/test_gpu.py::test_chunks_over_several_query_blocks_equal_transformers"
stage mixed-step 170 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" --device cuda \
  --out "$RES/h200_mixed_step.json"
stage small-C-A "$(( $(left) - 3 ))" "$PY" -m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" \
  --device cuda --dtype bfloat16 --concurrency 1,4,16 --modes baseline,static,dynamic --waves 1 --trials 3 \
  --min-requests 2 --no-progress --static-k 3 --dynamic-schedule @benchmarks/results/h200_A_floor_schedule.txt \
  --acceptance bernoulli:0.7 --input-len 512:1024 --output-len 64:448 --max-seq-len 1480 --out "$RES/h200_c13_A"
finish
