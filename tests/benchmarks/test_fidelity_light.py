"""The real-engine light case's default rate: where the trace's prefills, each as long as
the profile times it alone, keep the engine ``LIGHT_PREFILL_SHARE`` busy. Checked on a
synthetic profile (rows timed by a known model, written as ``baton profile`` writes them)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.profiling.test_grid import synthetic_rows, write

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fidelity_real import LIGHT_PREFILL_SHARE, alone_ttft_s, simulated, trace  # noqa: E402

KV_TOKENS = 200_000


def test_the_alone_ttft_is_each_prompt_simulated_by_itself(tmp_path):
    profile = write(tmp_path, synthetic_rows(noise=0.0))
    requests = trace(12, 1.0)
    each = [simulated([r], profile, KV_TOKENS)[r.req_id][0] for r in requests]
    assert alone_ttft_s(requests, profile, KV_TOKENS) == pytest.approx(float(np.mean(each)), rel=1e-9)


def test_the_default_light_rate_keeps_prompts_from_queueing_where_a_fixed_fast_rate_does_not(tmp_path):
    """At the default share, prompts wait little behind each other; at ten times that rate
    the same trace's TTFT is a queue (the mechanism that made 1 req/s no light case)."""
    profile = write(tmp_path, synthetic_rows(noise=0.0))
    alone = alone_ttft_s(trace(60, 1.0), profile, KV_TOKENS)
    light = LIGHT_PREFILL_SHARE / alone
    ttft = lambda rate: float(np.mean([t for t, _, _ in simulated(trace(60, rate), profile,  # noqa: E731
                                                                     KV_TOKENS).values()]))
    assert ttft(light) < 1.5 * alone
    assert ttft(10 * light) > 1.5 * ttft(light)
