# Sourced by h200_summary_c19.sh and h200_summary_c25.sh (after setting RES): the regime sweeps,
# profiles and tunes both summaries join (h200_runs.md).
#   regime A  C=64, 256 (call 11) and C=1, 4, 16 (call 13), the schedule tuned from call 9's profile --floor
#   regime B  C=64 and 256 (call 10), the schedule of h200_B_profile.json
REGIMES=(--regime "A=$RES/h200_c11_A64_256.json" --regime "A=$RES/h200_c13_A.json"
         --profile "A=$RES/h200_A_floor_profile.json" --tune "A=$RES/h200_A_floor_tune.json"
         --regime "B=$RES/h200_c10_B64.json" --regime "B=$RES/h200_c10_B256.json"
         --profile "B=$RES/h200_B_profile.json" --tune "B=$RES/h200_B_tune.json")
