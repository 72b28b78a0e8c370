#!/usr/bin/env bash
# After calls 41-44 of one lease: benchmarks/results/h200_summary.json (version 2) from them alone,
# run back to back on one machine. CPU is fine.
#   regime A  C=1..256 (call 43); regime B  C=1..256 and its Poisson point at C=64 (call 42, one file);
#   schedules tuned with --draft-margin 1.01 from call 30's (A) and call 35's (B) profiles
#   varied_vs_fixed_baseline: C=64 and 256 (calls 44 and 42), 6 waves of C requests, 3 trials
#   decode_vs_gemm_floor: the median of call 41's three profile --floor runs
# -> $RES/h200_summary.json
set -euo pipefail
RES=${RES:-benchmarks/results}
"${PYTHON:-python3}" -m dynspec.benchmarks.summary \
  --regime "A=$RES/h200_c43_A.json" \
  --profile "A=$RES/h200_c30_A_profile.json" --tune "A=$RES/h200_c30_A_tune_dm.json" \
  --regime "B=$RES/h200_c42_B.json" \
  --profile "B=$RES/h200_c35_B_profile.json" --tune "B=$RES/h200_c35_B_tune_dm.json" \
  --fixed-baseline "B=$RES/h200_c42_B_fixed.json" --varied-baseline "B=$RES/h200_c44_B_varied.json" \
  --floor-profile "$RES/h200_c41_floor1_profile.json" --floor-profile "$RES/h200_c41_floor2_profile.json" \
  --floor-profile "$RES/h200_c41_floor3_profile.json" --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$RES/h200_summary.json"
