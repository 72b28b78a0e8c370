#!/usr/bin/env bash
# NVIDIA genai-perf against the reference Triton model, in its mode for TensorRT-LLM models on
# Triton (kserve endpoint, tensorrtllm backend, gRPC streaming), at each concurrency of CONCURRENCY.
# Not run in CI: genai-perf and perf_analyzer are about 1 GB. See docs/serving_with_triton.md.
#
#   REPO=tiny/triton benchmarks/scripts/genai_perf.sh
#   -> $ARTIFACTS/c<N>/ (genai-perf's profile_export*.json/csv per concurrency)
#
# Environment: REPO (a repository from `dynspec triton`, required), TOKENIZER (default: the target
# folder of the repository's engine dir), CONCURRENCY (default "1 4 16"), INPUT_TOKENS (64),
# OUTPUT_TOKENS (32), REQUESTS (64 per concurrency), ARTIFACTS (genai_perf_artifacts),
# HTTP_PORT/GRPC_PORT/METRICS_PORT (8000/8001/8002), PYTHON (python).
set -euo pipefail
: "${REPO:?set REPO to a model repository written by dynspec triton}"
PY=${PYTHON:-python}
CONCURRENCY=${CONCURRENCY:-"1 4 16"}
INPUT_TOKENS=${INPUT_TOKENS:-64}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-32}
REQUESTS=${REQUESTS:-64}
ARTIFACTS=${ARTIFACTS:-genai_perf_artifacts}
HTTP_PORT=${HTTP_PORT:-8000} GRPC_PORT=${GRPC_PORT:-8001} METRICS_PORT=${METRICS_PORT:-8002}

for tool in genai-perf perf_analyzer; do
  command -v "$tool" >/dev/null || { echo "error: $tool not on PATH (see docs/serving_with_triton.md, genai-perf)" >&2; exit 2; }
done
TOKENIZER=${TOKENIZER:-$("$PY" - "$REPO" <<'EOF'
import json, sys
from dynspec.config import EngineConfig
print(EngineConfig.load(json.load(open(f"{sys.argv[1]}/dynspec_repo.json"))["engine_dir"]).target_dir)
EOF
)}

LOG=$(mktemp)
"$PY" -m dynspec.triton_repo.server "$REPO" --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" \
  --metrics-port "$METRICS_PORT" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -f "$LOG"' EXIT
until grep -q "tritonserver ready" "$LOG"; do
  kill -0 $SERVER 2>/dev/null || { tail -20 "$LOG" >&2; echo "error: the server did not start" >&2; exit 1; }
  sleep 1
done

for c in $CONCURRENCY; do
  # --output-tokens-mean-deterministic sends min_length = max_tokens: a request whose greedy
  # output reaches end_id earlier is refused (the reference cannot suppress end_id).
  genai-perf profile -m dynspec --endpoint-type kserve --backend tensorrtllm --streaming \
    --url "localhost:$GRPC_PORT" --server-metrics-url "http://localhost:$METRICS_PORT/metrics" \
    --tokenizer "$TOKENIZER" --synthetic-input-tokens-mean "$INPUT_TOKENS" --synthetic-input-tokens-stddev 0 \
    --output-tokens-mean "$OUTPUT_TOKENS" --output-tokens-stddev 0 --output-tokens-mean-deterministic \
    --concurrency "$c" --request-count "$REQUESTS" --warmup-request-count 4 \
    --artifact-dir "$ARTIFACTS/c$c"
done
