#!/usr/bin/env bash
# Published numbers: benchmarks/results/h200_summary.json from the regime sweeps and profiles
# (run h200_decode_bandwidth.sh, h200_regime_a.sh, h200_regime_b.sh first).
set -euo pipefail
OUT=${OUT:-benchmarks/results}
"${PYTHON:-python}" -m dynspec.benchmarks.summary \
  --regime "A=$OUT/h200_A.json" --regime "B=$OUT/h200_B.json" \
  --profile "decode=$OUT/h200_decode_profile.json" --profile "A=$OUT/h200_A_profile.json" \
  --profile "B=$OUT/h200_B_profile.json" --tune "A=$OUT/h200_A_tune.json" --tune "B=$OUT/h200_B_tune.json" \
  --bandwidth-profile decode --peak-bandwidth-tbps "${PEAK_TBPS:-4.8}" \
  --out "$OUT/h200_summary.json"
