#!/usr/bin/env bash
# benchmarks/results/h200_summary.json (version 2) from the H200 calls up to 19 (h200_runs.md). CPU is fine.
#   regimes A and B as h200_summary_regimes.sh lists them
#   varied_vs_fixed_baseline from calls 15 and 16 (one lease): whole-forward mixed graphs
#   decode_vs_gemm_floor from call 19's first profile --floor with the Triton kernels (the
#   second gave 1.27, without them 1.26 and 1.29; call 17: 1.23 with, 1.24 without)
# -> $RES/h200_summary_c19.json (h200_summary.json until calls 22-25: h200_summary_c25.sh)
set -euo pipefail
RES=${RES:-benchmarks/results}
. "$(dirname "$0")/h200_summary_regimes.sh"
"${PYTHON:-python3}" -m dynspec.benchmarks.summary "${REGIMES[@]}" \
  --fixed-baseline "B=$RES/h200_c15_B_fixed_whole.json" --varied-baseline "B=$RES/h200_c16_B_varied_whole.json" \
  --floor-profile "$RES/h200_c19_floor_triton1_profile.json" --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$RES/h200_summary_c19.json"
