"""Figures by request class on ``/metrics`` (``gateway.classes``): requests by band, tenant
and outcome, how many met their own SLOs, TTFT by band, requests shed and held by flow
control. Label values are bounded (``classes.Labels``): configured bands and tenants, a few
more as first seen, then ``other``.

A request meets its SLOs when its TTFT is within its own TTFT SLO (else the gateway's
``ttft_slo_s``) and its mean time per output token after the first within its TPOT SLO
(else ``tpot_slo_s``); a target that is not set anywhere is not judged. Only a request
answered whole (outcome ``ok``) can meet them, so ``slo_met / requests`` is the class's
attainment, refusals and failures included, as the simulator reports it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from baton.core.request import RequestState
from baton.gateway.classes import Classes
from baton.gateway.metrics import TokenTimes, latency_buckets


class ClassMetrics:
    """The by-class families of one gateway process's registry."""

    def __init__(self, registry: CollectorRegistry, classes: Classes, ttft_slo_s: float | None,
                 tpot_slo_s: float | None, ttft_edges_s: tuple[float, ...] = ()) -> None:
        self.classes, self.ttft_slo_s, self.tpot_slo_s = classes, ttft_slo_s, tpot_slo_s
        r = registry
        self.requests = Counter("baton_class_requests", "Requests by priority band, tenant and outcome",
                                ["band", "tenant", "outcome"], registry=r)
        self.slo_met = Counter("baton_class_slo_met", "Requests answered within their own TTFT and TPOT SLOs, "
                               "by band and tenant", ["band", "tenant"], registry=r)
        self.ttft = Histogram("baton_class_ttft_seconds", "Time to first token by priority band", ["band"],
                              buckets=latency_buckets(ttft_edges_s), registry=r)
        self.shed = Counter("baton_class_shed", "Requests shed by flow control (429), by band and tenant",
                            ["band", "tenant"], registry=r)
        self._children: dict[tuple, object] = {}  # labels() takes a lock and validates: once per series

    def _child(self, metric, *labels: str):
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def labels(self, st: RequestState) -> tuple[str, str]:
        return self.classes.bands(st.request.priority), self.classes.tenants(st.request.tenant)

    def ended(self, st: RequestState, times: TokenTimes, outcome: str, output_tokens: int) -> None:
        """A request's end: its outcome, TTFT and whether it met its SLOs."""
        band, tenant = self.labels(st)
        self._child(self.requests, band, tenant, outcome).inc()
        if times.first_s is None:
            return
        ttft_s = times.first_s - st.request.arrival_s
        self._child(self.ttft, band).observe(ttft_s)
        if outcome == "ok" and self._met(st, times, ttft_s, output_tokens):
            self._child(self.slo_met, band, tenant).inc()

    def _met(self, st: RequestState, times: TokenTimes, ttft_s: float, output_tokens: int) -> bool:
        r = st.request
        ttft_slo, tpot_slo = r.ttft_slo_s or self.ttft_slo_s, r.tpot_slo_s or self.tpot_slo_s
        if ttft_slo is not None and ttft_s > ttft_slo:
            return False
        if tpot_slo is None or output_tokens < 2 or times.last_s is None:
            return True
        return (times.last_s - times.first_s) / (output_tokens - 1) <= tpot_slo

    def shed_one(self, st: RequestState) -> None:
        self._child(self.shed, *self.labels(st)).inc()


class HeldGauge:
    """``baton_flow_held{band}``: requests flow control holds now (read at each scrape)."""

    def __init__(self, gate, classes: Classes) -> None:
        self.gate, self.classes = gate, classes

    def collect(self):
        fam = GaugeMetricFamily("baton_flow_held", "Requests held by flow control, by priority band",
                                labels=["band"])
        by_label: dict[str, int] = {}
        for band, held in sorted(self.gate.control.held_by_band().items()):
            label = self.classes.bands(band)
            by_label[label] = by_label.get(label, 0) + held
        for label, held in by_label.items():
            fam.add_metric([label], held)
        yield fam
