# Sourced by the h200x2 calls after h200_lib.sh with TP (1 or 2) and TP_LIMIT (s): the regime-A
# profile (batch 1..512, K 0..5, context 896, cache 920: 512 rows of 1480 would not fit at TP=1) at TP=$TP and its tuned
# schedule; the crossover (first b whose tuned K is 0) is read off the tune report by h200x2_summary.
#   -> $RES/h200x2_A_tp$TP{_profile.json,_schedule.txt,_tune.json}
name="$RES/h200x2_A_tp$TP"
launch=(); [ "$TP" -gt 1 ] && launch=("${MPI[@]}")
visible=(); [ "$TP" = 1 ] && visible=(env CUDA_VISIBLE_DEVICES=0)
stage "profile-A-tp$TP" "$TP_LIMIT" "${visible[@]}" "${launch[@]}" "${PY:-python3}" -m dynspec.cli profile \
  --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16 --no-progress --tp "$TP" \
  --batch-sizes 1,2,4,8,16,32,64,128,256,512 --draft-lens 0,1,2,3,4,5 --context-len 896 --max-seq-len 920 \
  --warmup 2 --repeats 6 ${PROFILE_EXTRA:-} --out "$name"_profile.json
[ -f "$name"_profile.json ] && stage "tune-A-tp$TP" 30 "${PY:-python3}" -m dynspec.cli tune \
  --profile "$name"_profile.json --acceptance 0.7 --min-gain 1.0 --out "$name"_schedule.txt --report "$name"_tune.json
