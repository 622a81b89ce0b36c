"""vLLM's per-request latency histograms for the emulator's ``/metrics``.

Names, buckets and meanings follow vLLM v1 (``vllm/v1/metrics/loggers.py``), measured
engine-side from when the request reached the engine:

- ``vllm:time_to_first_token_seconds``: arrival to first token;
- ``vllm:inter_token_latency_seconds``: each gap between consecutive tokens;
- ``vllm:e2e_request_latency_seconds``: arrival to finish;
- ``vllm:request_queue_time_seconds``: arrival to first scheduled (WAITING);
- ``vllm:request_prefill_time_seconds``: first scheduled to first token (PREFILL);
- ``vllm:request_decode_time_seconds``: first token to last token (DECODE).

``baton profile`` reads the prefill histogram to time prefill iterations engine-side.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class RequestTimings:
    """The histograms, registered in ``registry`` with the engine's model label."""

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        labels = ("model_name", "engine")

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=registry, buckets=buckets).labels(model, "0")
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token (s)", _TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency (s)", _ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end request latency (s)",
                        _REQUEST_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Time in WAITING (s)", _REQUEST_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds", "Time in PREFILL (s)", _REQUEST_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "Time in DECODE (s)", _REQUEST_BUCKETS)

    def token(self, arrived_s: float, scheduled_s: float, last_s: float | None, now_s: float) -> None:
        """A token was emitted at ``now_s``; ``last_s`` is the previous token's time."""
        if last_s is None:
            self.ttft.observe(now_s - arrived_s)
            self.queue.observe(scheduled_s - arrived_s)
            self.prefill.observe(now_s - scheduled_s)
        else:
            self.itl.observe(now_s - last_s)

    def finished(self, arrived_s: float, first_s: float, last_s: float) -> None:
        """A request finished normally (not aborted, not a held prefill)."""
        self.e2e.observe(last_s - arrived_s)
        self.decode.observe(last_s - first_s)
