"""The gateway's HTTP server: the app, its endpoints and the lifecycle
(start and stop of the upstream session, the policy's tick loops, the scrape loops and
the hidden-state feed). Scheduling lives in ``control.Control``, addressing engines in
``engines.Engines``, one request's state machine in ``flow.Flow``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from aiohttp import web

from baton import __version__
from baton.gateway import admin
from baton.gateway.auth import token_matches
from baton.gateway.config import GatewayConfig
from baton.gateway.control import Control
from baton.gateway.discovery import PodDiscovery
from baton.gateway.engines import Engines
from baton.gateway.fleet import Fleet
from baton.gateway.front import Front
from baton.gateway.hub import ControlHub
from baton.gateway.hidden_feed import FeedLimits, HiddenSource, HiddenStateFeed
from baton.gateway.kv_feed import KvEventFeed, KvFeedLimits, KvSource
from baton.gateway.kv_index import KvEventIndex
from baton.gateway.live import LiveCluster
from baton.gateway.metrics import GatewayMetrics, SloEdges
from baton.gateway.scrape import Scraper
from baton.perf import presets
from baton.policies import scheduler_for
from baton.protocol.errors import ApiError
from baton.profiling.qoe import extras_for

log = logging.getLogger("baton.gateway")
FRESH_RENDERS_PER_S = 20  # /metrics renders afresh at most this often; a flood of scrapes gets the last one


class Gateway(Front):
    """One ``baton serve`` process: wires the cluster, the engines, the control state and
    the HTTP app together (with relay workers: the control process, ``gateway.workers``)."""

    def __init__(self, config: GatewayConfig, hub_address: str | None = None) -> None:
        if any(e.kv_feed for e in config.engines):
            KvEventFeed.check_available()
        if any(e.hidden_states for e in config.engines):
            # a missing pyzmq is a config error, not a start-up crash
            HiddenStateFeed.check_available(curve=any(e.hidden_states_key for e in config.engines))
        perf = presets.build(config.preset)
        self._t0 = time.monotonic()  # the clock starts again when the server starts
        cluster = LiveCluster(lambda: time.monotonic() - self._t0, perf.kv_capacity_tokens // config.block_size,
                              config.block_size, config.scrape_interval_s, config.link_gbps)
        engines = Engines(config, cluster, perf)
        for spec in config.engines:
            engines.add(spec)
        scheduler = scheduler_for(config.policy, perf, config.seed, config.ttft_slo_s, config.tpot_slo_s,
                                  extras_for(config.policy, config.preset))
        roles = [spec.role.value for spec in config.engines]
        if roles or config.discovery is None:  # discovered engines come and go: not checked at start
            scheduler.check_cluster(roles.count("prefill"), roles.count("decode"), roles.count("mixed"))
        if config.discovery is not None:
            PodDiscovery.check_available()
        control = Control(config, cluster, scheduler, GatewayMetrics(SloEdges.of(config)), engines.tags)
        super().__init__(config, cluster, engines, control, scheduler.needs_prefix_keys)
        if (warning := self.keying_warning(scheduler.name)) is not None:
            log.warning(warning)
        self.scraper = Scraper(self.control, self.engines)
        self.hidden: HiddenStateFeed | None = None
        self.kv_index, self.kv_feed = self._kv_index(), None
        self._tasks: list[asyncio.Task] = []
        self.discovery: PodDiscovery | None = None
        self.hub: ControlHub | None = None if hub_address is None else ControlHub(self.control, hub_address,
                                                                                     self.engines.names,
                                                                                     self.engines.rediscover)
        self._rendered = b""  # the last Prometheus text
        self._renders: deque[float] = deque()  # when the fresh renders of the last second were made (monotonic s)

    @property
    def scheduler(self):
        return self.control.scheduler

    # --- app -----------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = self.base_app(log)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.prometheus)
        admin.add_routes(app, self.control, self.engines, self.scraper, self.kv_index, self.hub)
        return app

    async def _start(self, _app: web.Application) -> None:
        self._t0 = time.monotonic()  # building the scheduler (a QoE fit) took time: t = 0 is now
        self.engines.open_session()
        self.control.start()
        for iid in self.cluster.engines:
            self.scraper.start(iid)
        if self.config.outliers.enabled:
            self._tasks.append(asyncio.create_task(self._outlier_loop()))
        for stage_index, interval in self.scheduler.tickers:
            self._tasks.append(asyncio.create_task(self._tick_loop(stage_index, interval)))
        self._start_hidden_feed()
        self._start_kv_feed()
        if self.hub is not None:
            await self.hub.start()
        if self.config.discovery is not None:
            self.discovery = PodDiscovery(self.config.discovery, Fleet(self.control, self.engines, self.scraper))
            self._tasks.append(asyncio.create_task(self.discovery.run()))

    async def _stop(self, _app: web.Application) -> None:
        tasks = [*self._tasks, *self.scraper.tasks.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.hub is not None:
            await self.hub.close()
        await self.engines.close_session()
        if self.hidden is not None:
            self.hidden.close()
        if self.kv_feed is not None:
            self.kv_feed.close()
        self.close_parsers()

    async def _tick_loop(self, stage_index: int, interval_s: float) -> None:
        """Ticks at fixed multiples of the interval from the start, as in the simulator
        (sleeping a whole interval after each tick would drift by the ticks' own time)."""
        due = self.cluster.clock()
        while True:
            due += interval_s
            await asyncio.sleep(max(0.0, due - self.cluster.clock()))
            self.control.tick(stage_index)

    async def _outlier_loop(self) -> None:
        """The outlier detector's intervals (ejections end, statistical detectors run)."""
        while True:
            await asyncio.sleep(self.config.outliers.interval_s)
            self.control.sweep_outliers()

    def _start_hidden_feed(self) -> None:
        """Subscribe to the engines' hidden states (``gateway.hidden_feed``), if any publish."""
        sources = [HiddenSource(iid, e.spec.name, e.spec.hidden_states, e.spec.hidden_states_key)
                   for iid, e in self.cluster.engines.items() if e.spec.hidden_states]
        if not sources:
            return
        c, dropped = self.config, self.metrics.hidden_dropped
        self.hidden = HiddenStateFeed(sources, self.control.hidden_state, lambda r: dropped.labels(r).inc(),
                                      self.metrics.hidden_sources.set,
                                      FeedLimits(c.hidden_states_rate_per_s, c.hidden_states_max_dim),
                                      c.hidden_states_client_key)
        self._tasks.append(asyncio.create_task(self.hidden.run()))

    def _kv_index(self) -> KvEventIndex:
        """The index the engines' KV events fill; the policies' prefix source when any
        engine publishes them."""
        index = KvEventIndex(verify=self.config.kv_events_verify)
        for iid, eng in self.cluster.engines.items():
            if eng.spec.kv_feed:
                index.add_engine(iid, self.cluster.instances[iid].kv_blocks_total, self.config.block_size)
        if index.engines:
            self.cluster.view.prefix_source = index
            if index.verify:
                self.cluster.on_leg = lambda iid, st: index.expect(iid, st.block_keys, st.request.output_tokens)
            self.metrics.watch_kv(index, {i: e.spec.name for i, e in self.cluster.engines.items()})
        return index

    def _start_kv_feed(self) -> None:
        """Subscribe to the engines' KV events (``gateway.kv_feed``), if any publish."""
        sources = [KvSource(iid, e.spec.name, e.spec.kv_feed, e.spec.kv_events_topic, bool(e.spec.kv_events_listen))
                   for iid, e in self.cluster.engines.items() if e.spec.kv_feed]
        if not sources:
            return
        dropped = self.metrics.kv_dropped
        self.kv_feed = KvEventFeed(sources, self.kv_index, lambda r: dropped.labels(r).inc(),
                                   KvFeedLimits(self.config.kv_events_rate_per_s, self.config.kv_events_max_bytes))
        self._tasks.append(asyncio.create_task(self.kv_feed.run()))

    # --- endpoints -----------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        """200 when some healthy instance prefills and some decodes; else 503 with the
        reason and what each engine that takes no work last said."""
        live = [i for i in self.cluster.instances.values() if i.healthy]
        prefills, decodes = any(i.role.prefills for i in live), any(i.role.decodes for i in live)
        if prefills and decodes:
            return web.json_response({"status": "ok", "healthy_instances": len(live)})
        reason = "no engine is healthy" if not live else \
            "no healthy instance prefills" if not prefills else "no healthy instance decodes"
        down = {e.spec.name: "ejected (its legs kept failing)" if e.ejected else e.last_failure or "not answered yet"
                for iid, e in self.cluster.engines.items() if not e.removed and not self.cluster.instances[iid].healthy}
        return web.json_response({"status": "degraded", "reason": reason, "healthy_instances": len(live),
                                  "unhealthy": down}, status=503)

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": __version__, "policy": self.scheduler.name})

    async def models(self, _request: web.Request) -> web.Response:
        healthy = [iid for iid, inst in self.cluster.instances.items() if inst.healthy]
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "baton"}
            for name in self.engines.names.listed(healthy)]})

    async def prometheus(self, request: web.Request) -> web.Response:
        """The Prometheus text; with client API keys, only for the metrics or admin token."""
        c = self.config
        tokens = tuple(t for t in (c.metrics_token, c.admin_token) if t)
        if c.api_keys and not token_matches(request.headers.get("Authorization"), tokens):
            err = ApiError(401, "/metrics needs the metrics token (metrics_token) or the admin token",
                           err_type="authentication_error")
            return web.json_response(err.body(), status=401, headers={"WWW-Authenticate": "Bearer"})
        return web.Response(body=await self._render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _render(self) -> bytes:
        """The Prometheus text, fresh for up to ``FRESH_RENDERS_PER_S`` scrapes a second and
        the last one beyond that: every render walks every series (and, with relay workers,
        asks each relay for its own), so a flood of scrapes would cost the event loop that
        much each. (A fixed reuse interval instead would hand a stale text to a scraper that
        reads, acts, and reads again within it.)"""
        now = time.monotonic()
        while self._renders and now - self._renders[0] > 1.0:
            self._renders.popleft()
        if not self._rendered or len(self._renders) < FRESH_RENDERS_PER_S:
            self._renders.append(now)
            extra = await self.hub.relay_samples() if self.hub is not None else None
            self._rendered = self.metrics.render(extra)
        return self._rendered
