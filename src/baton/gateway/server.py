"""The gateway's HTTP server: the app, its endpoints, body reading and the lifecycle
(start and stop of the upstream session, the policy's tick loops, the scrape loops and
the hidden-state feed). Scheduling lives in ``control.Control``, addressing engines in
``engines.Engines``, one request's state machine in ``flow.Flow``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from baton import __version__
from baton.gateway import admin
from baton.gateway.bodies import BodyLimits, BodyReads, decode_body
from baton.gateway.client import ClientOut
from baton.gateway.config import GatewayConfig
from baton.gateway.control import Control
from baton.gateway.engines import Engines
from baton.gateway.flow import Flow
from baton.gateway.guards import json_bodies_only
from baton.gateway.hidden_feed import FeedLimits, HiddenSource, HiddenStateFeed
from baton.gateway.kv_feed import KvEventFeed, KvFeedLimits, KvSource
from baton.gateway.kv_index import KvEventIndex
from baton.gateway.live import LiveCluster
from baton.gateway.metrics import GatewayMetrics
from baton.gateway.middleware import client_keys, counted, json_errors, mark_error
from baton.gateway.ratelog import RateLimitedLog
from baton.gateway.scrape import Scraper
from baton.core.errors import BatonError, ConfigError
from baton.core.prefix import token_block_keys
from baton.core.request import RequestState
from baton.perf import presets
from baton.policies import scheduler_for
from baton.profiling.qoe import extras_for
from baton.protocol.errors import ApiError
from baton.protocol.requests import TRANSPORT_FIELDS, CHAT, COMPLETIONS, ParsedRequest

log = logging.getLogger("baton.gateway")

# Decoding and validating a token-id body costs 40-80 ns per byte here (a 1.9 MB body
# 75-150 ms). Up to 64 KiB (a few ms) it runs inline; larger bodies go to one parse
# thread, so the event loop runs between them instead of behind every body that arrived
# at once. The validation is Python code, which yields the GIL to the loop every 5 ms;
# orjson's decode holds it (about half the time), so each decode still pauses the loop
# for up to 20 ns per byte: max_body_bytes bounds that pause (about 40 ms at 2 MiB).
INLINE_PARSE_BYTES = 64 * 1024
PARSE_THREADS = 1  # the GIL serialises the work anyway; more threads only contend with the loop


def estimate_prompt_tokens(kind: str, body: dict[str, Any]) -> tuple[int, list[int] | None]:
    """Prompt length before any engine has tokenised it: exact for token-id prompts,
    else about four characters per token (corrected when the engine reports usage)."""
    if kind == COMPLETIONS and isinstance(body["prompt"], list):
        return len(body["prompt"]), list(body["prompt"])
    if kind == COMPLETIONS:
        return max(1, len(body["prompt"]) // 4), None
    chars = sum(content_chars(m.get("content")) for m in body["messages"])
    return max(1, chars // 4 + 4 * len(body["messages"])), None


MEDIA_PART_CHARS = 64  # an image, audio, video or file part: its token cost is the model's, not known here


def content_chars(content: Any) -> int:
    """Characters of a chat message's content: a string, or every text (and refusal) part
    of the parts form the OpenAI SDKs send (validated before: ``protocol.requests``); a
    media part counts ``MEDIA_PART_CHARS``. (Counting 64 for any parts list booked a
    200k-word prompt as about 20 tokens: deadlines of seconds, and no max_prompt_tokens.)"""
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list):
        return 0
    return sum(len(part.get("text") or part.get("refusal") or "") if part.get("type") in ("text", "refusal")
               else MEDIA_PART_CHARS for part in content)


class Gateway:
    """One ``baton serve`` process: wires the cluster, the engines, the control state and
    the HTTP app together."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        if any(e.kv_events for e in config.engines):
            KvEventFeed.check_available()
        if any(e.hidden_states for e in config.engines):
            # a missing pyzmq is a config error, not a start-up crash
            HiddenStateFeed.check_available(curve=any(e.hidden_states_key for e in config.engines))
        perf = presets.build(config.preset)
        self._t0 = time.monotonic()  # the clock starts again when the server starts
        self.cluster = LiveCluster(lambda: time.monotonic() - self._t0, perf.kv_capacity_tokens // config.block_size,
                                   config.block_size, config.scrape_interval_s)
        self.engines = Engines(config, self.cluster, perf)
        for spec in config.engines:
            self.engines.add(spec)
        scheduler = scheduler_for(config.policy, perf, config.seed, config.ttft_slo_s, config.tpot_slo_s,
                                  extras_for(config.policy, config.preset))
        roles = [spec.role.value for spec in config.engines]
        scheduler.check_cluster(roles.count("prefill"), roles.count("decode"), roles.count("mixed"))
        self.control = Control(config, self.cluster, scheduler, GatewayMetrics(), self.engines.tags)
        self.scraper = Scraper(self.control, self.engines)
        c = config
        self.bodies = BodyReads(BodyLimits(c.max_body_bytes, c.body_timeout_s, c.max_body_reads,
                                           c.max_body_reads_per_client, c.slow_body_after_s, c.min_body_bytes_per_s),
                                lambda reason: self.metrics.rejected.labels(reason).inc())
        self.hidden: HiddenStateFeed | None = None
        self.kv_index, self.kv_feed, self.tokenizer = self._kv_index(), None, self._tokenizer()
        self._tasks: list[asyncio.Task] = []
        self._parsers = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="baton-parse")  # large bodies

    @property
    def scheduler(self):
        return self.control.scheduler

    @property
    def metrics(self) -> GatewayMetrics:
        return self.control.metrics

    # --- app -----------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes,
                              middlewares=[counted(self.metrics, RateLimitedLog(log, "refused requests")),
                                           json_errors, json_bodies_only, client_keys(self.config.api_keys)])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.prometheus)
        admin.add_routes(app, self.control, self.engines, self.scraper, self.kv_index)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
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

    async def _stop(self, _app: web.Application) -> None:
        tasks = [*self._tasks, *self.scraper.tasks.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.engines.close_session()
        if self.hidden is not None:
            self.hidden.close()
        if self.kv_feed is not None:
            self.kv_feed.close()
        self._parsers.shutdown(wait=False, cancel_futures=True)

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
        index = KvEventIndex()
        for iid, eng in self.cluster.engines.items():
            if eng.spec.kv_events:
                index.add_engine(iid, self.cluster.instances[iid].kv_blocks_total, self.config.block_size)
        if index.engines:
            self.cluster.view.prefix_source = index
            self.metrics.watch_kv(index, {i: e.spec.name for i, e in self.cluster.engines.items()})
        return index

    def _tokenizer(self):
        """The tokenizer text prompts are keyed with (``tokenizer``), for prefix-aware policies."""
        if self.config.tokenizer is None:
            return None
        from baton.workload.tokens import HFTokenizer
        try:
            return HFTokenizer(self.config.tokenizer)
        except BatonError as err:
            raise ConfigError(f"tokenizer: {err}") from None

    def _start_kv_feed(self) -> None:
        """Subscribe to the engines' KV events (``gateway.kv_feed``), if any publish."""
        sources = [KvSource(iid, e.spec.name, e.spec.kv_events, e.spec.kv_events_topic)
                   for iid, e in self.cluster.engines.items() if e.spec.kv_events]
        if not sources:
            return
        dropped = self.metrics.kv_dropped
        self.kv_feed = KvEventFeed(sources, self.kv_index, lambda r: dropped.labels(r).inc(),
                                   KvFeedLimits(self.config.kv_events_rate_per_s, self.config.kv_events_max_bytes))
        self._tasks.append(asyncio.create_task(self.kv_feed.run()))

    def prompt_keys(self, kind: str, body: dict[str, Any], ids: list[int] | None) -> tuple[int, ...]:
        """The prompt's block keys for prefix-aware policies: from its token ids, or from a
        text prompt with the configured tokenizer; none for chat (no chat template here)."""
        if ids is None and kind == COMPLETIONS and self.tokenizer is not None:
            ids = self.tokenizer.ids(body["prompt"], special=True)
        return tuple(token_block_keys(ids, self.config.block_size)) if ids else ()

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

    async def prometheus(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, COMPLETIONS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    async def _read(self, request: web.Request, kind: str):
        """Read, parse and validate a body. Only requests whose body has arrived count
        towards ``max_inflight``; bodies still arriving are judged by their rate
        (``gateway.bodies``)."""
        if len(self.control.flows) >= self.config.max_inflight:
            raise self.overload()
        raw = await self.bodies.read(request, request.remote or "")
        if len(raw) <= INLINE_PARSE_BYTES:
            return self.parse(kind, raw)
        return await asyncio.get_running_loop().run_in_executor(self._parsers, self.parse, kind, raw)

    def parse(self, kind: str, raw: bytes) -> ParsedRequest:
        """A body as a validated request (ApiError otherwise); the fields not forwarded are
        counted. ``baton serve`` and ``baton epp`` read bodies with it."""
        parsed, dropped = decode_body(kind, raw)
        for name in dropped:
            self.metrics.dropped_fields.labels(name if name in TRANSPORT_FIELDS else "other").inc()
        model = parsed.body.get("model")
        if not self.engines.names.accepts(model):
            raise ApiError(404, f"The model `{model}` does not exist.", err_type="NotFoundError",
                           param="model", code="model_not_found")
        return parsed

    def new_state(self, kind: str, parsed: ParsedRequest) -> tuple[RequestState, list[int] | None]:
        """A parsed request's state in the cluster (its prompt estimated, its block keys when
        the policy reads them) and its prompt ids when it sent ids; ApiError 400 when the
        prompt is longer than ``max_prompt_tokens``."""
        tokens, ids = estimate_prompt_tokens(kind, parsed.body)
        if tokens > self.config.max_prompt_tokens:
            raise ApiError(400, f"prompt of about {tokens} tokens exceeds max_prompt_tokens "
                                f"({self.config.max_prompt_tokens})", param="prompt")
        state = self.cluster.new_request(tokens, parsed.max_tokens or 0)
        if self.scheduler.needs_prefix_keys:
            state.block_keys = self.prompt_keys(kind, parsed.body, ids)
        return state, ids

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        xid = request.headers.get("X-Request-Id") or self.engines.ids.next()
        try:
            parsed = await self._read(request, kind)
            if len(self.control.flows) >= self.config.max_inflight:
                raise self.overload()
            state, ids = self.new_state(kind, parsed)
        except ApiError as err:
            return await self._refuse(request, err, xid)
        oid = self.engines.ids.next()  # our own id: the client's X-Request-Id never reaches an engine
        model = parsed.body.get("model") or self.engines.names.default()
        out = ClientOut(request, parsed, model, f"cmpl-{oid}" if kind == COMPLETIONS else f"chatcmpl-{oid}")
        out.headers["X-Request-Id"] = xid
        flow = Flow(self.control, self.engines, parsed, out, state, xid, ids)
        self.control.admit(flow)
        return await flow.run()

    @staticmethod
    async def _refuse(request: web.Request, err: ApiError, xid: str) -> web.StreamResponse:
        resp = mark_error(web.json_response(err.body(), status=err.status, headers={"X-Request-Id": xid}), err)
        if err.status == 408:  # answer, then drop the connection: the rest of the body is not awaited
            resp.force_close()
            await resp.prepare(request)
            await resp.write_eof()
            if request.transport is not None:
                request.transport.close()
        return resp

    def overload(self) -> ApiError:
        """The 429 for a request over ``max_inflight`` (counted as a refusal)."""
        self.metrics.rejected.labels("overload").inc()
        return ApiError(429, f"gateway at capacity ({self.config.max_inflight} requests in flight); "
                             "retry later", err_type="rate_limit_exceeded", code="429")
