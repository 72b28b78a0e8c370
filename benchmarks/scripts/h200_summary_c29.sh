#!/usr/bin/env bash
# benchmarks/results/h200_summary_c29.json (version 2) from one lease: H200 calls 26-29, run back to back on
# one machine (h200_runs.md). CPU is fine.
#   regime A  C=1, 4, 16 and 64, 256 (call 28), with the schedule tuned from call 9's profile --floor
#   regime B  C=1..64 (call 27) and 256 (call 28), tuned from call 27's profile of this engine;
#             Poisson at the load of C=64 (call 29, which re-ran that closed loop beside it)
#   varied_vs_fixed_baseline: C=64 (call 26) and 256 (call 27), 12 waves of C requests, 3 trials
#   decode_vs_gemm_floor: the median of call 26's three profile --floor runs (chained decode graphs)
# Call 30 (a second lease: regime A re-profiled and re-tuned, C=1 and 4) is in h200_runs.md, not here.
# -> $RES/h200_summary_c29.json (h200_summary.json until calls 31-34 replaced it)
set -euo pipefail
RES=${RES:-benchmarks/results}
"${PYTHON:-python3}" -m dynspec.benchmarks.summary \
  --regime "A=$RES/h200_c28_A_small.json" --regime "A=$RES/h200_c28_A64_256.json" \
  --profile "A=$RES/h200_A_floor_profile.json" --tune "A=$RES/h200_A_floor_tune.json" \
  --regime "B=$RES/h200_c27_B.json" --regime "B=$RES/h200_c28_B256.json" --open-loop "B=$RES/h200_c29_B64_poisson.json" \
  --profile "B=$RES/h200_c27_B_profile.json" --tune "B=$RES/h200_c27_B_tune.json" \
  --fixed-baseline "B=$RES/h200_c26_B64_fixed.json" --fixed-baseline "B=$RES/h200_c27_B256_fixed.json" \
  --varied-baseline "B=$RES/h200_c26_B64_varied.json" --varied-baseline "B=$RES/h200_c27_B256_varied.json" \
  --floor-profile "$RES/h200_c26_floor_chain1_profile.json" --floor-profile "$RES/h200_c26_floor_chain2_profile.json" \
  --floor-profile "$RES/h200_c26_floor_chain3_profile.json" --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$RES/h200_summary_c29.json"
