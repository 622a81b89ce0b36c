"""The gateway's Prometheus metrics, in a registry of its own (no process globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
                      5.12, 10.24, 20.48, 40.96)


class GatewayMetrics:
    """Requests, TTFT/TPOT/TBT histograms per decision path (``colocated``, ``pd``,
    ``pd-early``, ``deflected``), migrations, role flips, deflections, backend errors."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("baton_requests", "Client requests by decision path and outcome",
                                ["path", "outcome"], registry=r)
        self.ttft = Histogram("baton_ttft_seconds", "Time to first token", ["path"],
                              buckets=_LATENCY_BUCKETS_S, registry=r)
        self.tpot = Histogram("baton_tpot_seconds", "Mean time per output token after the first",
                              ["path"], buckets=_LATENCY_BUCKETS_S, registry=r)
        self.tbt = Histogram("baton_tbt_seconds", "Gap between consecutive relayed tokens", ["path"],
                             buckets=_LATENCY_BUCKETS_S, registry=r)
        self.migrations = Counter("baton_migrations", "Continuation migrations by result", ["result"],
                                  registry=r)
        self.flips = Counter("baton_role_flips", "Instance role changes", ["role"], registry=r)
        self.deflections = Counter("baton_deflections", "Prefills deflected onto decode-capable instances",
                                   registry=r)
        self.backend_errors = Counter("baton_backend_errors", "Failed legs by instance and kind",
                                      ["instance", "kind"], registry=r)
        self.recoveries = Counter("baton_recoveries", "Requests continued elsewhere after an engine fault",
                                  registry=r)
        self.dropped_fields = Counter("baton_dropped_fields", "Client body fields not forwarded to engines "
                                      "(transport fields by name, anything else as 'other')", ["field"],
                                      registry=r)
        self.rejected = Counter("baton_rejected", "Requests refused before reaching an engine", ["reason"],
                                registry=r)
        self.inflight = Gauge("baton_inflight_requests", "Requests in flight", registry=r)
        self.scrapes = Counter("baton_scrapes", "Engine metric scrapes by result", ["instance", "result"],
                               registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
