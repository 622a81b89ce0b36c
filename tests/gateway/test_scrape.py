"""Parsing engine metrics text."""

import pytest

from baton.gateway.engine_types import DEFAULT_METRIC_NAMES
from baton.gateway.scrape import parse_metrics

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 11.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
"""


def test_vllm_names_sum_over_label_sets():
    s = parse_metrics(VLLM, DEFAULT_METRIC_NAMES["vllm"], at_s=4.0)
    assert (s.at_s, s.running, s.waiting, s.kv_usage, s.preemptions) == (4.0, 5.0, 7.0, 0.25, 11.0)


def test_missing_metrics_are_none_and_custom_names_work():
    s = parse_metrics("my_q 4\n", {"running": None, "waiting": "my_q", "kv_usage": "nope", "preemptions": None}, 1.0)
    assert (s.running, s.waiting, s.kv_usage, s.preemptions) == (None, 4.0, None, None)


def test_malformed_text_raises_value_error():
    with pytest.raises(ValueError):
        parse_metrics("vllm:num_requests_running{engine=\"0\" 3\n", DEFAULT_METRIC_NAMES["vllm"], 0.0)
