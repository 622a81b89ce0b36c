"""benchmarks/kairos_routing.py: a small run prints its figures as one JSON line."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_run_times_kairos_against_least_loaded_and_a_tick():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kairos_routing.py"), "--decode", "8",
                           "--decisions", "20"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["decode_instances"] == 8 and figures["tick_queued_prefills"] > 0
    assert figures["p99_us"] >= figures["median_us"] > 0 and figures["least_loaded_median_us"] > 0
