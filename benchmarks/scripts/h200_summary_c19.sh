#!/usr/bin/env bash
# benchmarks/results/h200_summary.json (version 2) from the H200 calls up to 19 (h200_runs.md). CPU is fine.
#   regime A  C=64, 256 (call 11) and C=1, 4, 16 (call 13), the schedule tuned from call 9's profile --floor
#   regime B  C=64 and 256 (call 10), the schedule of h200_B_profile.json
#   varied_vs_fixed_baseline from calls 15 and 16 (one lease): whole-forward mixed graphs
#   decode_vs_gemm_floor from call 19's first profile --floor with the Triton kernels (the
#   second gave 1.27, without them 1.26 and 1.29; call 17: 1.23 with, 1.24 without)
# -> $RES/h200_summary_c19.json (h200_summary.json until calls 22-25: h200_summary_c25.sh)
set -euo pipefail
RES=${RES:-benchmarks/results}
"${PYTHON:-python3}" -m dynspec.benchmarks.summary \
  --regime "A=$RES/h200_c11_A64_256.json" --regime "A=$RES/h200_c13_A.json" \
  --profile "A=$RES/h200_A_floor_profile.json" --tune "A=$RES/h200_A_floor_tune.json" \
  --regime "B=$RES/h200_c10_B64.json" --regime "B=$RES/h200_c10_B256.json" \
  --profile "B=$RES/h200_B_profile.json" --tune "B=$RES/h200_B_tune.json" \
  --fixed-baseline "B=$RES/h200_c15_B_fixed_whole.json" --varied-baseline "B=$RES/h200_c16_B_varied_whole.json" \
  --floor-profile "$RES/h200_c19_floor_triton1_profile.json" --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$RES/h200_summary_c19.json"
