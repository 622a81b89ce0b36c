"""The gateway: an aiohttp server that runs a Baton scheduler live.

It builds the same ``ClusterView`` the simulator builds (``LiveCluster``), asks the same
scheduler for placements, runs the scheduler's periodic ticks in the server loop and
executes their decisions: migrations (as continuations), role changes and watches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

import aiohttp
import aiohttp.http_exceptions
import numpy as np
from aiohttp import web

from baton.core.decisions import ArrivalPlan, ChangeRole, Decision, Deflect, Migrate, Watch
from baton.core.events import Completed, DecodeProgress, HiddenState, Observation
from baton.core.instance import Role
from baton.core.request import RequestState
from baton.gateway import admin
from baton.gateway.client import ClientOut
from baton.gateway.config import GatewayConfig
from baton.gateway.flow import Flow
from baton.gateway.hidden import HiddenStateFeed
from baton.gateway.holding import PrefillHold
from baton.gateway.ids import IdSource
from baton.gateway.live import LiveCluster
from baton.gateway.metrics import GatewayMetrics
from baton.gateway.models import ModelNames
from baton.gateway.scrape import Scraper
from baton.gateway.upstream import UpstreamError
from baton.perf import presets
from baton.policies import PolicyContext, build_scheduler
from baton.protocol.errors import ApiError
from baton.protocol.requests import TRANSPORT_FIELDS, split_fields, CHAT, COMPLETIONS, parse_json, parse_request

log = logging.getLogger("baton.gateway")


def estimate_prompt_tokens(kind: str, body: dict[str, Any]) -> tuple[int, list[int] | None]:
    """Prompt length before any engine has tokenised it: exact for token-id prompts,
    else about four characters per token (corrected when the engine reports usage)."""
    if kind == COMPLETIONS and isinstance(body["prompt"], list):
        return len(body["prompt"]), list(body["prompt"])
    if kind == COMPLETIONS:
        return max(1, len(body["prompt"]) // 4), None
    chars = sum(len(m.get("content") or "") if isinstance(m.get("content"), str) else 64
                for m in body["messages"])
    return max(1, chars // 4 + 4 * len(body["messages"])), None


@web.middleware
async def json_errors(request: web.Request, handler):
    """Every error a client can get is an OpenAI-style JSON body: aiohttp's own (unknown
    route, wrong method, body too large), an undecodable body (bad Content-Encoding), and
    anything unforeseen."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err = ApiError(exc.status, exc.reason or "error", err_type="invalid_request_error"
                       if exc.status < 500 else "server_error")
    except (web.RequestPayloadError, aiohttp.http_exceptions.HttpProcessingError) as exc:  # e.g. broken gzip
        err = ApiError(400, f"request body cannot be read: {exc}")
    except ApiError as exc:
        err = exc
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:  # noqa: BLE001
        log.exception("unhandled error on %s", request.path)
        err = ApiError(500, "internal gateway error", err_type="server_error")
    return web.json_response(err.body(), status=err.status)


class Gateway:
    """State and behaviour of one ``baton serve`` process."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        if any(e.hidden_states for e in config.engines):
            HiddenStateFeed.check_available()  # a missing pyzmq is a config error, not a start-up crash
        self.perf = perf = presets.build(config.preset)
        t0 = time.monotonic()
        self.cluster = LiveCluster(lambda: time.monotonic() - t0, perf.kv_capacity_tokens // config.block_size,
                                   config.block_size, config.scrape_interval_s)
        self.names = ModelNames(config.model)
        for spec in config.engines:
            self.add_engine(spec)
        self.rng = np.random.default_rng(config.seed)
        context = PolicyContext(np.random.default_rng(config.seed), perf, ttft_slo_s=config.ttft_slo_s,
                                tpot_slo_s=config.tpot_slo_s)
        self.scheduler = build_scheduler(config.policy, context)
        if self.scheduler.needs_qoe:  # CascadeInfer's cost model for this preset
            from baton.profiling.qoe import qoe_for_preset
            context.extras["qoe"] = qoe_for_preset(config.preset)
        self.metrics = GatewayMetrics()
        self.ids = IdSource()
        self.hold = PrefillHold(self.cluster, self.scheduler.replans_prefills, config.prefill_inflight_limit)
        self.metrics.watch(self.cluster, self.hold)
        self.metrics.inflight.set_function(lambda: len(self.flows))
        self.metrics.watch_policy(self.scheduler)
        self.flows: dict[int, Flow] = {}
        self.watches: dict[int, tuple[int, int]] = {}
        self.decisions: deque[tuple[str, int, int]] = deque(maxlen=config.decisions_log_size)  # placement log (admin API)
        self.session: aiohttp.ClientSession | None = None
        self.upstream_timeout = aiohttp.ClientTimeout(total=config.upstream_timeout_s,
                                                      sock_connect=config.connect_timeout_s)
        self._tasks: list[asyncio.Task] = []
        self.scraper = Scraper(self)
        self.reading = 0  # connections whose request body is still being read
        self.hidden: HiddenStateFeed | None = None
        self._first_token_s: dict[int, float] = {}  # by context bucket; at most max_prompt_tokens / 64

    # --- app -----------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[json_errors])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        admin.add_routes(app, self)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        self.cluster.now()
        for stage_index, decision in self.scheduler.start(self.cluster.view):
            self.execute(decision, stage_index)
        for iid in self.cluster.engines:
            self.scraper.start(iid)
        for stage_index, interval in self.scheduler.tickers:
            self._tasks.append(asyncio.create_task(self._tick_loop(stage_index, interval)))
        addresses = [e.spec.hidden_states for e in self.cluster.engines.values() if e.spec.hidden_states]
        if addresses:
            self.hidden = HiddenStateFeed(addresses, self._hidden_state, self.cluster.now,
                                          self.metrics.hidden_sources.set)
            self._tasks.append(asyncio.create_task(self.hidden.run()))

    async def _stop(self, _app: web.Application) -> None:
        tasks = [*self._tasks, *self.scraper.tasks.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()
        if self.hidden is not None:
            self.hidden.close()

    def _hidden_state(self, state: HiddenState) -> bool:
        """A hidden state from an engine: to the policy if the request is still served here."""
        if state.req_id not in self.flows:
            return False
        self.observe(state)
        self.metrics.hidden_states.inc()
        return True

    # --- endpoints -----------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        live = [i for i in self.cluster.instances.values() if i.healthy]
        ok = any(i.role.prefills for i in live) and any(i.role.decodes for i in live)
        return web.json_response({"status": "ok" if ok else "degraded", "healthy_instances": len(live)},
                                 status=200 if ok else 503)

    def add_engine(self, spec) -> int:
        """Register an engine (config or admin API); its model name, if configured, is served."""
        iid = self.cluster.add_engine(spec)
        if spec.model:
            self.names.by_engine[iid] = spec.model
        return iid

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "baton"} for name in self.names.served()]})

    async def prometheus(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, COMPLETIONS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    async def _read(self, request: web.Request, kind: str):
        """Read, parse and validate a body. Connections still sending one count towards
        ``max_inflight`` and have ``body_timeout_s`` to finish."""
        if len(self.flows) + self.reading >= self.config.max_inflight:
            raise self._overload()
        self.reading += 1
        try:
            raw = await asyncio.wait_for(request.read(), self.config.body_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, f"request body exceeds {self.config.max_body_bytes} bytes") from None
        except asyncio.TimeoutError:
            raise ApiError(408, f"request body not received within {self.config.body_timeout_s} s",
                           code="request_timeout") from None
        finally:
            self.reading -= 1
        parsed = parse_request(kind, parse_json(raw))
        parsed.body, dropped = split_fields(parsed.body)
        for name in dropped:
            self.metrics.dropped_fields.labels(name if name in TRANSPORT_FIELDS else "other").inc()
        model = parsed.body.get("model")
        if not self.names.accepts(model):
            raise ApiError(404, f"The model `{model}` does not exist.", err_type="NotFoundError",
                           param="model", code="model_not_found")
        return parsed

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        xid = request.headers.get("X-Request-Id") or self.ids.next()
        try:
            parsed = await self._read(request, kind)
            if len(self.flows) >= self.config.max_inflight:
                raise self._overload()
            tokens, ids = estimate_prompt_tokens(kind, parsed.body)
            if tokens > self.config.max_prompt_tokens:
                raise ApiError(400, f"prompt of about {tokens} tokens exceeds max_prompt_tokens "
                                    f"({self.config.max_prompt_tokens})", param="prompt")
        except ApiError as err:
            resp = web.json_response(err.body(), status=err.status, headers={"X-Request-Id": xid})
            if err.status == 408:  # answer, then drop the connection: the rest of the body is not awaited
                resp.force_close()
                await resp.prepare(request)
                await resp.write_eof()
                if request.transport is not None:
                    request.transport.close()
            return resp
        state = self.cluster.new_request(tokens, parsed.max_tokens or 0)
        oid = self.ids.next()  # our own id: the client's X-Request-Id never reaches an engine
        model = parsed.body.get("model") or self.names.default()
        out = ClientOut(request, parsed, model, f"cmpl-{oid}" if kind == COMPLETIONS else f"chatcmpl-{oid}")
        out.headers["X-Request-Id"] = xid
        flow = Flow(self, parsed, out, state, xid, ids)
        self.flows[state.req_id] = flow
        return await flow.run()

    def _overload(self) -> ApiError:
        self.metrics.rejected.labels("overload").inc()
        return ApiError(429, f"gateway at capacity ({self.config.max_inflight} requests in flight); "
                             "retry later", err_type="rate_limit_exceeded", code="429")

    # --- deadlines -----------------------------------------------------------------------
    def first_token_timeout_s(self, context_tokens: int) -> float:
        """How long a leg may take to its first token: a whole prefill may come first.
        The prefill is costed for the context rounded up to a multiple of 64 tokens and
        remembered (the perf model is too slow to call per request)."""
        bucket = -(-max(context_tokens, 1) // 64) * 64
        found = self._first_token_s.get(bucket)
        if found is None:
            c = self.config
            found = self._first_token_s[bucket] = c.first_token_timeout_factor * self.perf.prefill_time_s(bucket) \
                + c.first_token_timeout_base_s
        return found

    def token_timeout_s(self, iid: int) -> float:
        """How long a streaming leg may go without a token before its engine counts as hung."""
        c = self.config
        return max(c.token_timeout_min_s, c.token_timeout_factor * self.cluster.instances[iid].recent_token_interval_s)

    # --- policy calls --------------------------------------------------------------------
    def plan(self, state: RequestState) -> ArrivalPlan:
        """The scheduler's placement; ApiError 503 when nothing can take the request."""
        self.cluster.now()
        plan = self.scheduler.plan_arrival(self.cluster.view, state)
        for change in plan.role_changes:
            self.change_role(change.instance_id, change.role, "policy")
        if plan.rejected:
            self.metrics.rejected.labels(plan.reject_reason or "policy").inc()
            raise ApiError(503, f"request rejected by policy: {plan.reject_reason}", err_type="server_error")
        if plan.prefill_instance is None or not self.cluster.instances[plan.prefill_instance].healthy:
            self.metrics.rejected.labels("no_instance").inc()
            raise ApiError(503, "no healthy instance can take the request", err_type="server_error")
        self.decisions.append(("prefill", state.req_id, plan.prefill_instance))
        if plan.watch_context_tokens is not None and plan.watch_stage is not None:
            self.watches[state.req_id] = (plan.watch_stage, plan.watch_context_tokens)
        if plan.decode_instance is not None:
            self.decisions.append(("decode", state.req_id, plan.decode_instance))
        return plan

    def choose_decode(self, state: RequestState, exclude: frozenset[int] = frozenset()) -> int:
        """The policy's decode instance; if it is unhealthy or one this request already
        saw fail (``exclude``), the least-loaded other healthy one."""
        self.cluster.now()
        decided = self.scheduler.decode_choice(self.cluster.view, state)
        for change in decided.role_changes if decided else ():
            self.change_role(change.instance_id, change.role, "policy")
        choice = None if decided is None else decided.instance
        if choice is None or not self.cluster.instances[choice].healthy or choice in exclude:
            ids = [i for i in self.cluster.view.decode_ids if i not in exclude]
            if not ids:
                raise ApiError(503, "no healthy decode instance", err_type="server_error")
            choice = min(ids, key=self.cluster.view.token_load)
        self.decisions.append(("decode", state.req_id, choice))
        return choice

    def fallback_prefill(self, state: RequestState, exclude: frozenset[int] = frozenset()) -> int:
        """Another prefill instance after a failed prefill leg (least queued prefill work)."""
        ids = [i for i in self.cluster.view.prefill_ids if i not in exclude]
        if not ids:
            raise ApiError(503, "no healthy prefill instance", err_type="server_error")
        choice = min(ids, key=lambda i: self.cluster.instances[i].prefill_queue_tokens)
        self.cluster.rebind_prefill(state, choice)
        return choice

    def observe(self, observation: Observation) -> None:
        if self.scheduler.observes:
            self.cluster.now()
            self.scheduler.observe(self.cluster.view, observation)

    def wants_ids(self, iid: int) -> bool:
        """vLLM returns token ids on request (needed for continuation); SGLang does not."""
        return self.cluster.engines[iid].spec.engine_type == "vllm"

    # --- decisions -----------------------------------------------------------------------
    def execute(self, decision: Decision, stage_index: int) -> None:
        if isinstance(decision, Migrate):
            flow = self.flows.get(decision.req_id)
            if flow is not None:
                flow.state.migrating = True
                flow.request_migration(decision.target_instance)
        elif isinstance(decision, ChangeRole):
            self.change_role(decision.instance_id, decision.role, "policy")
        elif isinstance(decision, Watch):
            self.watches[decision.req_id] = (stage_index, decision.context_tokens)
        elif isinstance(decision, Deflect) and self.hold.deflect(decision):
            self.decisions.append(("deflect", decision.req_id, decision.instance))

    def change_role(self, iid: int, role: Role, by: str) -> None:
        """Flip an instance's role (a policy's ``ChangeRole`` or the admin API)."""
        before = self.cluster.instances[iid].role
        if self.cluster.set_role(iid, role):
            self.metrics.flips.labels(role.value).inc()
            log.info("instance %s: role %s -> %s (by %s)", self.cluster.engines[iid].spec.name,
                     before.value, role.value, by)

    def check_watch(self, state: RequestState) -> None:
        watch = self.watches.get(state.req_id)
        if watch is None or state.request.prompt_tokens + state.generated_tokens < watch[1]:
            return
        del self.watches[state.req_id]
        self.cluster.now()
        ctx = state.request.prompt_tokens + state.generated_tokens
        for d in self.scheduler.on_threshold(watch[0], self.cluster.view, state.req_id, ctx):
            self.execute(d, watch[0])

    async def _tick_loop(self, stage_index: int, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self._report_progress()
            self.cluster.now()
            try:
                decisions = self.scheduler.tick(stage_index, self.cluster.view)
            except Exception:  # a policy bug must not stop its ticks for good
                log.exception("policy %s: tick of stage %d failed", self.scheduler.name, stage_index)
                continue
            for d in decisions:
                self.execute(d, stage_index)

    def _report_progress(self) -> None:
        now = self.cluster.now()
        for iid, eng in self.cluster.engines.items():
            inst = self.cluster.instances[iid]
            if eng.tokens_since_report and inst.decodes.n:
                iterations = max(1, eng.tokens_since_report // inst.decodes.n)
                self.observe(DecodeProgress(iid, iterations, inst.recent_iteration_s, now))
            eng.tokens_since_report = 0

    # --- request bookkeeping -----------------------------------------------------------
    def token_timing(self, flow: Flow) -> None:
        """TTFT at the first relayed token, then one TBT sample per upstream read that
        carried tokens (several chunks in one read are one gap, not a burst of zeros)."""
        now, m = self.cluster.clock(), self.metrics
        if flow.first_token_s is None:
            flow.first_token_s = now
            m.child(m.ttft, flow.path).observe(now - flow.state.request.arrival_s)
            if flow.leg is not None:
                m.child(m.engine_ttft, self.cluster.engines[flow.leg.instance_id].spec.name).observe(
                    now - flow.state.request.arrival_s)
        elif flow.last_token_s is not None:
            m.child(m.tbt, flow.path).observe(now - flow.last_token_s)
        flow.last_token_s = now

    def flow_ended(self, flow: Flow, outcome: str) -> None:
        st = flow.state
        self.flows.pop(st.req_id, None)
        self.watches.pop(st.req_id, None)
        m = self.metrics
        m.child(m.requests, flow.path, outcome).inc()
        if outcome == "ok":
            self.observe(Completed(st.req_id, flow.out.tokens, self.cluster.clock()))
            if flow.out.tokens > 1 and flow.first_token_s is not None and flow.last_token_s is not None:
                tpot_s = (flow.last_token_s - flow.first_token_s) / (flow.out.tokens - 1)
                m.child(m.tpot, flow.path).observe(tpot_s)

    def backend_error(self, iid: int, err: BaseException) -> None:
        """Count a failed leg. Only engine faults (no answer, a broken or malformed answer,
        a 5xx without an error body) count towards health, and only
        ``unhealthy_after_failures`` in a row (with failed scrapes) take an engine out: a
        request the engine refuses with an error body fails alone."""
        up = err if isinstance(err, UpstreamError) else None
        kind = "connect" if up and up.connect else "timeout" if up and up.timed_out else (
            "malformed" if up and up.malformed else "http" if up and up.status else "stream")
        self.metrics.backend_errors.labels(self.cluster.engines[iid].spec.name, kind).inc()
        log.warning("engine %s: %s error: %s", self.cluster.engines[iid].spec.name, kind, err)
        if up is None or up.engine_fault:
            self.note_failure(iid)

    def note_failure(self, iid: int) -> None:
        eng = self.cluster.engines[iid]
        eng.failures += 1
        if eng.failures >= self.config.unhealthy_after_failures and self.cluster.set_health(iid, False):
            log.warning("engine %s is unhealthy after %d failures in a row; no new work goes to it",
                        eng.spec.name, eng.failures)
