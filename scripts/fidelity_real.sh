#!/usr/bin/env bash
# `make fidelity-real`: Baton against Vidur (--quick) and against one real vLLM CPU
# instance (benchmarks/fidelity_real.py). Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
STEP=fidelity-real source scripts/vllm_env.sh
BATON_VLLM_PYTHON="$VENV/bin/python" BATON_VLLM_MODEL="$MODEL" \
  .venv/bin/python benchmarks/fidelity.py --quick --real --cases 70b-light,70b-light-4r "$@"
echo "fidelity-real: took $(( $(date +%s) - start )) s"
