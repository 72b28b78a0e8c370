#!/usr/bin/env bash
# benchmarks/results/h200_summary_c34.json (version 2) from one lease: H200 calls 31-34, run back to back on
# one machine (h200_runs.md). CPU is fine.
#   regime A  C=1, 4, 16 (at least 8 requests a point) and 64, 256 (call 33), with the schedule tuned
#             from call 30's profile of this engine
#   regime B  C=1..64 and 256 (call 32), with the schedule tuned from call 27's profile;
#             Poisson at the load of C=64 (call 34, which re-ran that closed loop beside it)
#   varied_vs_fixed_baseline: C=64 (call 31) and 256 (call 32), 12 waves of C requests, 3 trials
#   decode_vs_gemm_floor: the median of call 31's three profile --floor runs
# Call 35 (a second lease: regime B re-profiled between b=64 and 256, re-tuned, C=256 over 3 waves)
# is in h200_runs.md and the README, not here.
# -> $RES/h200_summary_c34.json (h200_summary.json until calls 36-40)
set -euo pipefail
RES=${RES:-benchmarks/results}
"${PYTHON:-python3}" -m dynspec.benchmarks.summary \
  --regime "A=$RES/h200_c33_A_small.json" --regime "A=$RES/h200_c33_A64_256.json" \
  --profile "A=$RES/h200_c30_A_profile.json" --tune "A=$RES/h200_c30_A_tune.json" \
  --regime "B=$RES/h200_c32_B.json" --regime "B=$RES/h200_c32_B256.json" --open-loop "B=$RES/h200_c34_B64_poisson.json" \
  --profile "B=$RES/h200_c27_B_profile.json" --tune "B=$RES/h200_c27_B_tune.json" \
  --fixed-baseline "B=$RES/h200_c31_B64_fixed.json" --fixed-baseline "B=$RES/h200_c32_B256_fixed.json" \
  --varied-baseline "B=$RES/h200_c31_B64_varied.json" --varied-baseline "B=$RES/h200_c32_B256_varied.json" \
  --floor-profile "$RES/h200_c31_floor1_profile.json" --floor-profile "$RES/h200_c31_floor2_profile.json" \
  --floor-profile "$RES/h200_c31_floor3_profile.json" --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$RES/h200_summary_c34.json"
