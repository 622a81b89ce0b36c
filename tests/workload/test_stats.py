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


@pytest.mark.parametrize("gap_s,n,capacity,hint", [
    (0.0001, 200, None, "seconds read as milliseconds"),   # 10,000 req/s
    (0.00104, 200, None, "half of its gaps under 1.04 ms"),  # 1 req/s read as ms: 962 req/s (first hour, item 5)
    (0.01, 200, 10.0, "more than 3x the most this cluster could serve"),  # 100 req/s on a 10 req/s cluster
    (0.01, 200, 50.0, None),                                # 2x: heavy, not misread
    (0.01, 200, None, None),                                # 100 req/s, no cluster to judge by
    (2000.0, 200, None, "milliseconds read as seconds"),   # one every 33 minutes for 4.6 days
    (250.0, 100, None, "milliseconds read as seconds"),    # 0.004 req/s over 7 hours
    (61.0, 30, None, "whole-number timestamps"),            # integer ms read as s, a short slice
    (61.5, 30, None, None),                                 # fractional: a sparse trace in seconds
    (0.5, 200, None, None),
    (0.0001, 15, None, None),                              # too few requests to judge
])
def test_implausible_rates_name_the_likely_unit_mistake(gap_s, n, capacity, hint):
    from baton.workload.stats import implausible_rate

    warning = implausible_rate([Request(i, i * gap_s, 100, 10) for i in range(n)], capacity)
    assert (warning is None) if hint is None else (hint in warning)


@pytest.mark.parametrize("name", ["azure_code_2023.csv", "azure_conv_2023.csv", "mooncake_conversation.jsonl"])
def test_the_public_traces_read_in_their_own_units_raise_no_unit_warning(name):
    from pathlib import Path

    from baton.workload import load_trace
    from baton.workload.stats import implausible_rate
    path = Path(__file__).resolve().parents[3] / "shared" / "traces" / name
    if not path.is_file():
        pytest.skip(f"{path} not present")
    assert implausible_rate(load_trace(path)) is None
