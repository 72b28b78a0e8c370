#!/usr/bin/env bash
# benchmarks/results/h200_summary.json (version 2) from the H200 calls up to 25 (h200_runs.md). CPU is fine.
#   regimes A and B as h200_summary_regimes.sh lists them
#   varied_vs_fixed_baseline from call 24 (one lease, this session's engine: host work in one copy,
#     chained decode graphs), 6 waves of C requests, 3 trials
#   decode_vs_gemm_floor: the median of call 24's two and call 25's one profile --floor with chained
#     decode graphs (the single-graph runs beside them: h200_c24_floor_one*, h200_c25_floor_one3)
# -> $RES/h200_summary_c25.json (h200_summary.json until calls 26-29 replaced it)
set -euo pipefail
RES=${RES:-benchmarks/results}
. "$(dirname "$0")/h200_summary_regimes.sh"
"${PYTHON:-python3}" -m dynspec.benchmarks.summary "${REGIMES[@]}" \
  --fixed-baseline "B=$RES/h200_c24_B_fixed.json" --varied-baseline "B=$RES/h200_c24_B_varied.json" \
  --floor-profile "$RES/h200_c24_floor_chain1_profile.json" --floor-profile "$RES/h200_c24_floor_chain2_profile.json" \
  --floor-profile "$RES/h200_c25_floor_chain3_profile.json" --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$RES/h200_summary_c25.json"
