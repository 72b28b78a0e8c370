#!/usr/bin/env bash
# benchmarks/results/h200_summary.json (version 2) from the runs of the engine with FlexAttention's
# static batch per row bucket (calls 9-12, benchmarks/results/h200_runs.md). CPU is fine.
#   regime A  C=64 and 256 (call 11) with the schedule tuned from call 9's profile --floor
#   regime B  C=64 and 256 (call 10), the schedule of h200_B_profile.json
#   varied_vs_fixed_baseline from call 12 (PackedChunks); decode_vs_gemm_floor from call 9's profile
# The summary of the older trees (C=1..256, before the static batch) is h200_summary_d21045a.json.
# -> $RES/h200_summary_static_batch.json (superseded by h200_summary_c19.sh)
set -euo pipefail
RES=${RES:-benchmarks/results}
"${PYTHON:-python3}" -m dynspec.benchmarks.summary \
  --regime "A=$RES/h200_c11_A64_256.json" --profile "A=$RES/h200_A_floor_profile.json" --tune "A=$RES/h200_A_floor_tune.json" \
  --regime "B=$RES/h200_c10_B64.json" --regime "B=$RES/h200_c10_B256.json" \
  --profile "B=$RES/h200_B_profile.json" --tune "B=$RES/h200_B_tune.json" \
  --fixed-baseline "B=$RES/h200_c12_B_fixed.json" --varied-baseline "B=$RES/h200_c12_B_varied.json" \
  --floor-profile "$RES/h200_A_floor_profile.json" --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$RES/h200_summary_static_batch.json"
