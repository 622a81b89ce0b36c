import numpy as np
import pytest

from baton.core.request import Request
from baton.workload import workload_stats


def test_stats_of_a_known_workload():
    reqs = [Request(i, arrival_s=0.5 * i, prompt_tokens=100 * (i + 1), output_tokens=7) for i in range(11)]
    s = workload_stats(reqs)
    assert s["requests"] == 11 and s["duration_s"] == pytest.approx(5.0)
    assert s["mean_rate_rps"] == pytest.approx(2.0) and s["interarrival_cv"] == pytest.approx(0.0, abs=1e-9)
    assert s["p50_prompt_tokens"] == 600 and s["max_prompt_tokens"] == 1100
    assert s["mean_output_tokens"] == 7 and s["total_output_tokens"] == 77


def test_bursty_arrivals_have_high_cv():
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.gamma(1 / 9, 9, size=2000))
    s = workload_stats([Request(i, float(t), 10, 10) for i, t in enumerate(times)])
    assert s["interarrival_cv"] == pytest.approx(3.0, rel=0.15)


def test_describe_names_count_span_rate_and_lengths():
    from baton.workload.stats import describe

    reqs = [Request(i, i * 0.5, 100 + i, 10) for i in range(11)]
    assert describe(reqs) == ("11 requests over 5.0 s (2.00 req/s); prompt mean/p50/p99 105/105/110 tokens, "
                              "output 10/10/10")


@pytest.mark.parametrize("gap_s,n,hint", [
    (0.0001, 200, "seconds read as milliseconds"),   # 10,000 req/s
    (2000.0, 200, "milliseconds read as seconds"),   # one every 33 minutes for 4.6 days
    (0.5, 200, None),
    (0.0001, 50, None),                              # too few requests to judge
])
def test_implausible_rates_name_the_likely_unit_mistake(gap_s, n, hint):
    from baton.workload.stats import implausible_rate

    warning = implausible_rate([Request(i, i * gap_s, 100, 10) for i in range(n)])
    assert (warning is None) if hint is None else (hint in warning)
