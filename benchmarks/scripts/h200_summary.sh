#!/usr/bin/env bash
# benchmarks/results/h200_summary.json (version 2) from the regime sweeps, regime A's profile
# (with --floor: decode_vs_gemm_floor), the tune reports, the fixed-length baseline and the C=128
# and C=256 sweeps of other calls (h200_{A,B}{128,256}.json) joined to their regimes, the varied- and
# fixed-length baselines, and the newest profile --floor. CPU is fine. Run by h200_call2.sh. Over
# the committed files of the older trees it wrote h200_summary_d21045a.json; the committed
# h200_summary.json of the static-batch engine comes from h200_summary_static_batch.sh.
# RES_A / RES_B: where regime A's / B's files are (default benchmarks/results); a regime whose
# sweep is missing, or whose profile predates --floor (an old call 1), is left out, saying so.
# -> $RES_B/h200_summary.json
set -euo pipefail
RES_A=${RES_A:-benchmarks/results} RES_B=${RES_B:-benchmarks/results}
args=()
if [ -f "$RES_A/h200_A.json" ] && ! grep -q '"gemm_floor_ms"' "$RES_A/h200_A_profile.json" 2>/dev/null; then
  echo "h200_summary: $RES_A/h200_A_profile.json has no gemm_floor_ms (not from h200_call1.sh); regime A left out" >&2
elif [ -f "$RES_A/h200_A.json" ]; then
  args+=(--regime "A=$RES_A/h200_A.json" --profile "A=$RES_A/h200_A_profile.json" --tune "A=$RES_A/h200_A_tune.json")
  [ -f "$RES_A/h200_A128.json" ] && args+=(--regime "A=$RES_A/h200_A128.json")     # C=128 (h200x2_call3.sh)
  [ -f "$RES_A/h200_A256.json" ] && args+=(--regime "A=$RES_A/h200_A256.json")     # C=256 (h200_call6.sh)
fi
if [ -f "$RES_B/h200_B.json" ]; then
  args+=(--regime "B=$RES_B/h200_B.json" --profile "B=$RES_B/h200_B_profile.json" --tune "B=$RES_B/h200_B_tune.json")
  [ -f "$RES_B/h200_B128.json" ] && args+=(--regime "B=$RES_B/h200_B128.json")     # C=128 (h200x2_call3.sh)
  [ -f "$RES_B/h200_B256.json" ] && args+=(--regime "B=$RES_B/h200_B256.json")     # C=256 (h200_call4.sh)
  [ -f "$RES_B/h200_B_fixed.json" ] && args+=(--fixed-baseline "B=$RES_B/h200_B_fixed.json")
  [ -f "$RES_B/h200_B_varied.json" ] && args+=(--varied-baseline "B=$RES_B/h200_B_varied.json")   # h200_call5.sh
fi
# decode_vs_gemm_floor from the newest profile --floor (h200_call5.sh's regime-A profile) when there is one
FLOOR=${FLOOR_PROFILE:-$RES_A/h200_A_floor_profile.json}
grep -q '"gemm_floor_ms"' "$FLOOR" 2>/dev/null && args+=(--floor-profile "$FLOOR")
"${PYTHON:-python3}" -m dynspec.benchmarks.summary "${args[@]}" --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$RES_B/h200_summary.json"
