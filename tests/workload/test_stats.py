import numpy as np
import pytest

from baton.core.request import Request
from baton.workload import workload_stats


def test_stats_of_a_known_workload():
    reqs = [Request(i, arrival_s=0.5 * i, prompt_tokens=100 * (i + 1), output_tokens=7) for i in range(11)]
    s = workload_stats(reqs)
    assert s["requests"] == 11 and s["duration_s"] == pytest.approx(5.0)
    assert s["mean_rate_rps"] == pytest.approx(2.0) and s["interarrival_cv"] == pytest.approx(0.0, abs=1e-9)
    assert s["prompt_p50_tokens"] == 600 and s["prompt_max_tokens"] == 1100
    assert s["output_mean_tokens"] == 7 and s["total_output_tokens"] == 77


def test_bursty_arrivals_have_high_cv():
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.gamma(1 / 9, 9, size=2000))
    s = workload_stats([Request(i, float(t), 10, 10) for i, t in enumerate(times)])
    assert s["interarrival_cv"] == pytest.approx(3.0, rel=0.15)
