# Sourced by h200_call1.sh / h200_call2.sh after setting CALL (1 or 2), and by h200x2_call*.sh
# after setting CALL and TAG: one environment, stages under one deadline, $OUT/$TAG.tar.gz
# re-packed after each stage. NVLink multicast stays off (the machines' rule: KINDS.md).
set -uo pipefail
export OUT=${OUT:-/tmp/dynspec_out} WORK=${WORK:-/tmp/dynspec_h200} NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TAG=${TAG:-h200_call$CALL}
export ENGINE_DIR=${ENGINE_DIR:-$WORK/engine} RES=${RES:-$WORK/results$CALL}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEADLINE=${DEADLINE:-530}
LOG=$RES/$TAG.log
mkdir -p "$OUT" "$RES"
PY=${PYTHON:-python3}
# two ranks on one host (the x2 calls), the machines' multicast switches passed on to every rank
MPI=(mpirun -n 2 --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST
     -x NVSHMEM_DISABLE_NVLS -x PYTHONUNBUFFERED)
failed=()
left() { echo $(( DEADLINE - SECONDS > 5 ? DEADLINE - SECONDS : 5 )); }
pack() { tar -czf "$OUT/$TAG.tar.gz" -C "$RES" . 2>/dev/null; }
stage() {   # stage NAME LIMIT_S CMD...: run with a limit (never past the deadline), log, re-pack
  local name=$1 limit=$2; shift 2
  (( limit > $(left) )) && limit=$(left)
  echo "== $name (limit ${limit}s, t=${SECONDS}s)" | tee -a "$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name rc=$rc (t=${SECONDS}s)" | tee -a "$LOG"
  (( rc == 0 )) || failed+=("$name")
  pack
}
start() {   # start GPU_TESTS_DEFAULT TESTS_LIMIT_S: provenance, prepare, and the GPU tests when GPU_TESTS=1
  # the commit and how far the copied tree is from it (a device copy's .git can be stale)
  echo "HEAD $(git -C "$here" rev-parse HEAD 2>/dev/null) + $(git -C "$here" status --porcelain 2>/dev/null | wc -l) changed paths" >>"$LOG"
  # the GPU's clocks, power and temperature at the start: decode's small kernels move with them (calls 31 and 36)
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu     --format=csv >>"$LOG" 2>&1
  stage prepare "${TIME_PREPARE:-200}" bash "$here/h200_prepare.sh"
  [ "${GPU_TESTS:-$1}" = 1 ] && stage gpu-tests "${TIME_TESTS:-$2}" "${PYTHON:-python3}" -m pytest -q -m gpu \
    ${GPU_TEST_PATHS:-tests/test_gpu.py} -p no:cacheprovider
  return 0
}
FIRST_TESTS="tests/test_gpu.py::test_whole_k0_graphs_leave_the_piecewise_state
tests/test_gpu.py::test_whole_mixed_graphs_equal_transformers
tests/test_gpu.py::test_chunks_over_several_query_blocks_equal_transformers
tests/test_gpu.py::test_graphs_equal_eager_and_greedy"
first_stages() {   # the first call of a lease (31, 36, 41): prepare, the GPU tests FIRST_TESTS (by default
  # those of the whole-forward and decode graphs), mixed steps b=1 and b=64 + a 128-token chunk at 1024
  # context (unless MIXED_STEP=0), decode_vs_gemm_floor x3; FLOOR_AB=1: a --no-fused-rope floor after
  # the first two (fused, unfused, fused, unfused, fused)
  GPU_TEST_PATHS=$FIRST_TESTS start 1 "${TIME_TESTS:-150}"
  [ "${MIXED_STEP:-1}" = 1 ] && stage mixed-step 80 "$PY" -m dynspec.benchmarks.mixed_step --engine-dir "$ENGINE_DIR" \
    --device cuda --points 1:0:128,64:0:128 --context-len 1024 --out "$RES/h200_c${CALL}_mixed_step.json"
  local i
  for i in 1 2 3; do
    stage "floor$i" 45 "$PY" "${FLOOR[@]}" --out "$RES/h200_c${CALL}_floor${i}_profile.json"
    [ "${FLOOR_AB:-0}" = 1 ] && (( i < 3 )) && stage "floor${i}-unfused" 45 "$PY" "${FLOOR[@]}" --no-fused-rope \
      --out "$RES/h200_c${CALL}_floor${i}_unfused_profile.json"
  done
  return 0
}
finish() {  # the log's tail; exit 1 naming the failed stages
  tail -n 40 "$LOG"
  [ ${#failed[@]} = 0 ] || { echo "failed stages: ${failed[*]}" | tee -a "$LOG"; pack; exit 1; }
}
# the b=1 decode / GEMM floor profile at 1024 context, and the baseline-only sweep of the varied- and
# fixed-length runs (add --concurrency, --waves, the lengths and --out)
FLOOR=(-m dynspec.cli profile --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16 --no-progress
       --batch-sizes 1 --draft-lens 0 --context-len 1024 --max-seq-len 1032 --warmup 2 --repeats 6 --floor)
BASELINE_SWEEP=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda
                --dtype bfloat16 --modes baseline --trials 3 --min-requests 2 --no-progress
                --acceptance bernoulli:0.5 --max-seq-len 424)
# the regime sweeps (baseline / static / dynamic, varied lengths, 3 trials; add --dynamic-schedule,
# --concurrency and --out): regime B p=0.5, static K=7; regime A p=0.7, static K=3
SWEEP3=(-m dynspec.benchmarks.sweep --engine reference --engine-dir "$ENGINE_DIR" --device cuda --dtype bfloat16
        --modes baseline,static,dynamic --waves 1 --trials 3 --min-requests 2 --warmup-requests 2 --no-progress)
REGIME_B_SWEEP=("${SWEEP3[@]}" --static-k 7 --acceptance bernoulli:0.5 --input-len 64:192 --output-len 32:224
                --max-seq-len 424)
REGIME_A_SWEEP=("${SWEEP3[@]}" --static-k 3
                --acceptance bernoulli:0.7 --input-len 512:1024 --output-len 64:448 --max-seq-len 1480)
