#!/usr/bin/env bash
# benchmarks/results/h200_summary.json (version 2) from one lease: H200 calls 36-40, run back to back on
# one machine, prepared once in call 36 (h200_runs.md, "eighth"). CPU is fine.
#   regime A  C=1, 4, 16 (at least 8 requests a point) and 64, 256 (call 38), with the schedule tuned
#             from call 30's profile with --draft-margin 1.01
#   regime B  C=1..64 (call 37) and 256 over 3 waves (call 39), with the schedule tuned from call 35's
#             profile (b=128 and 192 as well) with --draft-margin 1.01; Poisson at the load of C=64
#             (call 39, which re-ran that closed loop beside it)
#   varied_vs_fixed_baseline: C=64 (fixed: call 36; varied: call 40, as call 36's ran past its stage
#             limit) and 256 (call 37), 12 waves of C requests, 3 trials
#   decode_vs_gemm_floor: the median of call 36's three profile --floor runs
# -> $RES/h200_summary.json
set -euo pipefail
RES=${RES:-benchmarks/results}
"${PYTHON:-python3}" -m dynspec.benchmarks.summary \
  --regime "A=$RES/h200_c38_A_small.json" --regime "A=$RES/h200_c38_A64_256.json" \
  --profile "A=$RES/h200_c30_A_profile.json" --tune "A=$RES/h200_c30_A_tune_dm.json" \
  --regime "B=$RES/h200_c37_B.json" --regime "B=$RES/h200_c39_B256.json" --open-loop "B=$RES/h200_c39_B64_poisson.json" \
  --profile "B=$RES/h200_c35_B_profile.json" --tune "B=$RES/h200_c35_B_tune_dm.json" \
  --fixed-baseline "B=$RES/h200_c36_B64_fixed.json" --fixed-baseline "B=$RES/h200_c37_B256_fixed.json" \
  --varied-baseline "B=$RES/h200_c40_B64_varied.json" --varied-baseline "B=$RES/h200_c37_B256_varied.json" \
  --floor-profile "$RES/h200_c36_floor1_profile.json" --floor-profile "$RES/h200_c36_floor2_profile.json" \
  --floor-profile "$RES/h200_c36_floor3_profile.json" --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$RES/h200_summary_c40.json"
