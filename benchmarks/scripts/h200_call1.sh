#!/usr/bin/env bash
# H200 call 1 of 2 (one H200, <= 9 minutes): prepare the random Llama-3.1-8B-shaped engine, the
# GPU tests, regime A (profile --floor -> tune -> sweep, 3 trials per point). Every stage has a
# time limit inside DEADLINE seconds, the sweep rewrites its JSON after every load point, and
# $OUT/h200_call1.tar.gz is re-packed after every stage: a call cut short still returns what finished.
#   -> $OUT/h200_call1.tar.gz: h200_A{.json,.md,.png,_profile.json,_schedule.txt,_tune.json}, h200_call1.log
# Sizing, from the old h200_A.json run times (2 waves, fixed lengths; sum over C=1,4,16,64,256 and
# the 3 modes: 119 s per trial): at WAVES=1 (C requests at C) ~75 s per trial, 3 trials ~225 s;
# sweep start (load, graph capture) ~55 s with no untimed warm-up (WARMUP_REQUESTS=0: the median of
# 3 trials absorbs first-use costs); prepare ~120 s, GPU tests <= 60 s, profile ~55 s: ~515 s.
CALL=1
. "$(dirname "$0")/h200_lib.sh"
# GPU_TESTS=0 moves the GPU tests to call 2 (GPU_TESTS=1 there) when regime A needs the time
start 1 60
WARMUP_REQUESTS=${WARMUP_REQUESTS:-0} REPEATS=${REPEATS:-6} stage regime-A "$(( $(left) - 8 ))" \
  bash "$here/h200_regime_a.sh"
finish
