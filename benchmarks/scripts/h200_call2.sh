#!/usr/bin/env bash
# H200 call 2 of 2 (one H200, <= 9 minutes): regime B (profile -> tune -> sweep, 3 trials, Poisson
# beside the closed loop at C=64), the fixed-length baseline at C=64 and C=256, and the
# summary. Reuses call 1's engine on a warm machine, else prepares it again (POISSON_AT=16,64 adds
# C=16 when there is time).
# A_RESULTS: where call 1's files are (default benchmarks/results, where the lead commits them).
#   -> $OUT/h200_call2.tar.gz: h200_B*, h200_B_fixed.*, h200_summary.json, h200_call2.log
# Sizing, from the old h200_B.json run times (2 waves, fixed lengths; C=1,4,16,64,256 x 3 modes:
# 50 s per trial): WAVES=2 (refills, so staggered finishes and admissions happen) x 3 trials
# ~150 s, Poisson at C=64 ~27 s, profile ~90 s, fixed baseline ~25 s + ~50 s start, B sweep start
# ~75 s: ~420 s on a warm machine; a cold one adds ~120 s of prepare and may cut the fixed baseline.
CALL=2
export WAVES=${WAVES:-2}
A_RESULTS=${A_RESULTS:-benchmarks/results}
. "$(dirname "$0")/h200_lib.sh"
start 0 90
POISSON_AT=${POISSON_AT:-64} stage regime-B "$(( $(left) - 80 ))" bash "$here/h200_regime_b.sh"
stage fixed-baseline "$(( $(left) - 15 ))" bash "$here/h200_fixed_baseline.sh"
RES_A=$A_RESULTS RES_B=$RES stage summary 30 bash "$here/h200_summary.sh"
finish
