"""The gateway's Prometheus metrics, in a registry of its own (no process globals)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from baton.gateway.hidden import DROP_REASONS

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
                      5.12, 10.24, 20.48, 40.96)


@dataclass(frozen=True, slots=True)
class SloEdges:
    """The configured SLOs (seconds) that become bucket edges of the latency histograms, so
    that the share of requests within an SLO is read exactly off ``le="<slo>"``."""

    ttft_s: tuple[float, ...] = ()
    tpot_s: tuple[float, ...] = ()

    @classmethod
    def of(cls, config) -> "SloEdges":
        """The gateway's own SLOs and every objective's (``classes.objectives``)."""
        objectives = config.classes.objectives.values()
        ttft = [config.ttft_slo_s] + [o.ttft_slo_ms / 1e3 for o in objectives if o.ttft_slo_ms]
        tpot = [config.tpot_slo_s] + [o.tpot_slo_ms / 1e3 for o in objectives if o.tpot_slo_ms]
        return cls(tuple(t for t in ttft if t), tuple(t for t in tpot if t))


def latency_buckets(edges_s: tuple[float, ...]) -> tuple[float, ...]:
    """The shared latency buckets with ``edges_s`` (SLOs) added as edges of their own."""
    return tuple(sorted(set(_LATENCY_BUCKETS_S) | {round(e, 9) for e in edges_s}))


@dataclass(slots=True)
class TokenTimes:
    """When a request's first and latest tokens were relayed (gateway clock, seconds)."""

    first_s: float | None = None
    last_s: float | None = None


class GatewayMetrics:
    """Requests, TTFT/TPOT/TBT histograms per decision path (``colocated``, ``pd``,
    ``pd-early``, ``deflected``), migrations, role flips, deflections, backend errors."""

    def __init__(self, slo: SloEdges = SloEdges()) -> None:
        r = self.registry = CollectorRegistry()
        self.slo = slo
        ttft_buckets, tpot_buckets = latency_buckets(slo.ttft_s), latency_buckets(slo.tpot_s)
        self.requests = Counter("baton_requests", "Client requests by decision path and outcome",
                                ["path", "outcome"], registry=r)
        self.ttft = Histogram("baton_ttft_seconds", "Time to first token", ["path"],
                              buckets=ttft_buckets, registry=r)
        self.tpot = Histogram("baton_tpot_seconds", "Mean time per output token after the first",
                              ["path"], buckets=tpot_buckets, registry=r)
        self.tbt = Histogram("baton_tbt_seconds", "Gap between consecutive relayed tokens", ["path"],
                             buckets=tpot_buckets, registry=r)
        self.migrations = Counter("baton_migrations", "Continuation migrations by result", ["result"],
                                  registry=r)
        self.flips = Counter("baton_role_flips", "Instance role changes", ["role"], registry=r)
        self.hidden_states = Counter("baton_hidden_states", "Engine hidden states handed to the policy "
                                     "(learned length prediction)", registry=r)
        self.hidden_dropped = Counter("baton_hidden_states_dropped", "Engine hidden states not believed, by "
                                      "reason (gateway.hidden.DROP_REASONS)", ["reason"], registry=r)
        for reason in DROP_REASONS:
            self.hidden_dropped.labels(reason)
        self.kv_dropped = Counter("baton_kv_events_dropped", "KV-event messages not applied, by reason "
                                  "(rate, malformed, topic)", ["reason"], registry=r)
        self.hidden_sources = Gauge("baton_hidden_state_sources_connected",
                                    "Engine hidden-state sockets the gateway is subscribed to", registry=r)
        self.deflections = Counter("baton_deflections", "Prefills deflected onto decode-capable instances",
                                   registry=r)
        self.backend_errors = Counter("baton_backend_errors", "Failed legs by engine and kind",
                                      ["engine", "kind"], registry=r)
        self.recoveries = Counter("baton_recoveries", "Requests continued elsewhere after an engine fault",
                                  registry=r)
        self.dropped_fields = Counter("baton_dropped_fields", "Client body fields not forwarded to engines "
                                      "(transport fields by name, anything else as 'other')", ["field"],
                                      registry=r)
        self.rejected = Counter("baton_rejected", "Requests refused before reaching an engine", ["reason"],
                                registry=r)
        self.inflight = Gauge("baton_inflight_requests", "Requests in flight", registry=r)
        self.scrapes = Counter("baton_scrapes", "Engine metric scrapes by result", ["engine", "result"],
                               registry=r)
        self.ticks = Counter("baton_policy_ticks", "Policy ticks that ran, by stage index", ["stage"], registry=r)
        self.tick_errors = Counter("baton_policy_tick_errors", "Policy ticks that raised, by stage index",
                                   ["stage"], registry=r)
        self.stale = Counter("baton_stale_decisions", "Decisions about requests that ended before they "
                             "were carried out, dropped, by kind", ["kind"], registry=r)
        self.ejections = Counter("baton_outlier_ejections", "Engines taken out by outlier ejection, by "
                                 "engine and detector", ["engine", "reason"], registry=r)
        self.quarantined = Counter("baton_quarantined_requests", "Requests answered 422 because they failed "
                                   "on two engines that serve other requests well", registry=r)
        self.retries = Counter("baton_leg_retries", "Legs sent again to another instance after they failed, "
                               "by leg (decode legs also count in baton_recoveries when that worked)", ["leg"],
                               registry=r)
        self.responses = Counter("baton_responses", "HTTP responses by status code and OpenAI error type "
                                 "('' for successes); a stream that fails after it started counts its error "
                                 "type with status 200", ["status", "error_type"], registry=r)
        self._children: dict = {}
        self.engine_ttft = Histogram("baton_engine_ttft_seconds", "Time to first token by the engine "
                                     "that produced it", ["engine"], buckets=ttft_buckets, registry=r)

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, looked up once: ``labels()`` takes a lock and
        validates every call, and the relay observes per request and per read."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def tokens_relayed(self, times: "TokenTimes", now_s: float, path: str, engine: str | None,
                       arrival_s: float) -> None:
        """TTFT at a request's first relayed token, then one TBT sample per upstream read
        that carried tokens (several chunks in one read are one gap, not a burst of zeros)."""
        if times.first_s is None:
            times.first_s = now_s
            self.child(self.ttft, path).observe(now_s - arrival_s)
            if engine is not None:
                self.child(self.engine_ttft, engine).observe(now_s - arrival_s)
        elif times.last_s is not None:
            self.child(self.tbt, path).observe(now_s - times.last_s)
        times.last_s = now_s

    def finished(self, times: "TokenTimes", path: str, tokens: int) -> None:
        """TPOT of a request answered whole: mean gap after its first token."""
        if tokens > 1 and times.first_s is not None and times.last_s is not None:
            self.child(self.tpot, path).observe((times.last_s - times.first_s) / (tokens - 1))

    def watch(self, cluster, hold=None) -> None:
        """Export per-engine gauges read from ``cluster`` (a ``LiveCluster``) and ``hold``
        (the held prefills) at each scrape."""
        self.registry.register(_EngineGauges(cluster, hold))

    def watch_kv(self, index, names) -> None:
        """Export the KV-event index's state per engine (``names``: instance id -> name)."""
        self.registry.register(_KvGauges(index, names))

    def watch_policy(self, scheduler) -> None:
        """Export the policy's own figures (``Scheduler.report``) at each scrape."""
        self.registry.register(_PolicyReport(scheduler))

    def counts(self) -> list[list]:
        """This registry's counters and histograms as ``[family, sample, labels, value]``
        (what a relay worker reports to control's /metrics)."""
        return [[fam.name, s.name, s.labels, s.value] for fam in self.registry.collect()
                if fam.type in ("counter", "histogram") for s in fam.samples if not s.name.endswith("_created")]

    def render(self, extra: list[list] | None = None) -> bytes:
        """The exposition text; ``extra``: other processes' ``counts``, added in."""
        return generate_latest(_Added(self.registry, extra or []))


class _Added:
    """A registry's families with other processes' counts added to the same series (and
    their series this process has not seen appended), without prometheus_client's
    ``_created`` series (a creation time per series that no dashboard reads; switching them
    off in the library is a process-wide switch)."""

    def __init__(self, registry, extra: list[list]) -> None:
        self.registry = registry
        self.add: dict[tuple, float] = {}
        self.by_family: dict[str, list[tuple]] = {}
        for family, name, labels, value in extra:
            key = (name, tuple(sorted(labels.items())))
            if key not in self.add:
                self.by_family.setdefault(family, []).append(key)
            self.add[key] = self.add.get(key, 0.0) + value

    def collect(self):
        from prometheus_client.samples import Sample
        for fam in self.registry.collect():
            if not self.add:
                fam.samples = [s for s in fam.samples if not s.name.endswith("_created")]
                yield fam
                continue
            seen, samples = set(), []
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                key = (s.name, tuple(sorted(s.labels.items())))
                if key in self.add:
                    s, _ = s._replace(value=s.value + self.add[key]), seen.add(key)
                samples.append(s)
            samples += [Sample(k[0], dict(k[1]), self.add[k]) for k in self.by_family.get(fam.name, ()) if k not in seen]
            fam.samples = samples
            yield fam


class _EngineGauges:
    """Per-engine state as the gateway sees it, computed when /metrics is read."""

    def __init__(self, cluster, hold=None) -> None:
        self.cluster, self.hold = cluster, hold

    def collect(self):
        c = self.cluster
        now = c.now()
        fams = {key: GaugeMetricFamily(f"baton_engine_{key}", doc, labels=["engine", "role"]) for key, doc in (
            ("inflight_requests", "Requests the gateway has on the instance (queued, transferring, decoding)"),
            ("kv_usage", "KV usage as the gateway estimates it (0-1)"),
            ("scraped_kv_usage", "KV usage the engine last reported (0-1)"),
            ("scraped_running", "Running requests the engine last reported"),
            ("scraped_waiting", "Waiting requests the engine last reported"),
            ("scrape_age_seconds", "Seconds since the engine's metrics were last read"),
            ("healthy", "1 if the instance takes new work"),
            ("ejected", "1 while outlier ejection keeps the instance out"),
            ("held_prefills", "PD prefills the gateway holds while the engine reports waiting requests"))}
        for iid, eng in c.engines.items():
            if eng.removed:
                continue
            inst, s = c.instances[iid], eng.sample
            labels = [eng.spec.name, inst.role.value]
            fams["inflight_requests"].add_metric(labels, inst.num_requests)
            fams["kv_usage"].add_metric(labels, inst.kv_usage_at(now))
            fams["healthy"].add_metric(labels, 1.0 if inst.healthy else 0.0)
            fams["ejected"].add_metric(labels, 1.0 if eng.ejected else 0.0)
            fams["held_prefills"].add_metric(labels, self.hold.held(iid) if self.hold is not None else 0)
            if s is not None:
                fams["scrape_age_seconds"].add_metric(labels, max(0.0, c.clock() - s.at_s))
                for key, value in (("scraped_kv_usage", s.kv_usage), ("scraped_running", s.running),
                                   ("scraped_waiting", s.waiting)):
                    if value is not None:
                        fams[key].add_metric(labels, value)
        yield from fams.values()


class _KvGauges:
    """What the engines' KV events built: indexed blocks, batches, gaps and lag per engine."""

    def __init__(self, index, names) -> None:
        self.index, self.names = index, names

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        blocks = GaugeMetricFamily("baton_kv_indexed_blocks", "Blocks the KV events say the engine holds",
                                   labels=["engine"])
        lag = GaugeMetricFamily("baton_kv_event_lag_seconds", "Arrival minus timestamp of the last batch",
                                labels=["engine"])
        batches = CounterMetricFamily("baton_kv_event_batches", "KV-event batches applied", labels=["engine"])
        gaps = CounterMetricFamily("baton_kv_event_gaps", "KV-event batches lost (sequence gaps)", labels=["engine"])
        resyncs = CounterMetricFamily("baton_kv_index_resyncs", "Times an engine's index entries were cleared",
                                      labels=["engine"])
        for iid, st in self.index.state().items():
            name = [self.names.get(iid, str(iid))]
            blocks.add_metric(name, st["indexed_blocks"])
            lag.add_metric(name, st["lag_s"])
            batches.add_metric(name, st["batches"])
            gaps.add_metric(name, st["gaps"])
            resyncs.add_metric(name, st["resyncs"])
        yield from (blocks, lag, batches, gaps, resyncs)


# per-placement figures stay out of /metrics: read after each of one's own requests, a
# running mean of matched prefix blocks tells whether another tenant's prefix is cached
PER_PLACEMENT = ("_matched_blocks_mean",)


class _PolicyReport:
    """``baton_policy_report{key}``: what the policy's stages report about their own working
    (not the per-placement figures: ``PER_PLACEMENT``; run summaries still have them)."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler

    def collect(self):
        fam = GaugeMetricFamily("baton_policy_report", "Figures the policy reports about itself", labels=["key"])
        for key, value in sorted(self.scheduler.report().items()):
            if not key.endswith(PER_PLACEMENT):
                fam.add_metric([key], value)
        yield fam
