"""The engine types the gateway speaks to, and the metric names it scrapes for each."""

from __future__ import annotations

from collections.abc import Mapping

ENGINE_TYPES = ("vllm", "sglang")

# Scraped names per engine type: running, waiting, KV usage (0..1), preemptions (counter).
DEFAULT_METRIC_NAMES: Mapping[str, dict[str, str | None]] = {
    "vllm": {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
             "kv_usage": "vllm:kv_cache_usage_perc", "preemptions": "vllm:num_preemptions_total"},
    "sglang": {"running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs",
               "kv_usage": "sglang:token_usage", "preemptions": None},
}
