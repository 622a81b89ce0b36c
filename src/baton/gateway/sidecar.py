"""``baton sidecar``: prefill/decode disaggregation behind an endpoint picker, as llm-d does
it. It runs beside one decode engine and takes that engine's traffic. The picker sends a
PD request here (its decode instance) and names the prefill instance in
``x-prefiller-host-port`` (llm-d's header) or ``x-gateway-prefill-endpoints`` (GIE's); the
sidecar checks that name against an allowlist (the prefill-capable engines of the same
config the picker reads, since roles may flip: a header is never a way to reach an
arbitrary address), sends the
prefill leg there with ``kv_transfer_params`` (vLLM's NixlConnector protocol, the gateway's
own leg code: ``handoff.prefill_body`` and ``upstream.post_json``), then the client's
request plus the returned params to its engine, and relays that answer as the engine
writes it (streamed or not). A failed prefill leg is decoded locally: the engine computes
the prompt itself. Without a prefill header the request goes to the engine as it came.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson
from aiohttp import web

from baton.core.errors import ConfigError
from baton.core.instance import Role
from baton.gateway import handoff
from baton.gateway.config import EngineSpec, GatewayConfig
from baton.gateway.urls import endpoint_address
from baton.gateway.discovery import PodDiscovery
from baton.gateway.live import LiveCluster
from baton.gateway.framing import upstream_connector
from baton.gateway.bodies import decode_body
from baton.gateway.middleware import json_errors
from baton.gateway.upstream import UpstreamError, endpoint, post_json
from baton.protocol.errors import ApiError
from baton.protocol.requests import CHAT, COMPLETIONS

log = logging.getLogger("baton.sidecar")
PREFILLER = "x-prefiller-host-port"
PREFILL_ENDPOINTS = "x-gateway-prefill-endpoints"


class Sidecar:
    """The sidecar of engine ``engine`` (a name in ``config.engines``; with ``discovery``, the
    pod's name, its engine at ``engine_url``: the allowlist then follows the pool's pods)."""

    def __init__(self, config: GatewayConfig, engine: str, engine_url: str | None = None) -> None:
        if config.pd_protocol != "nixl":
            raise ConfigError("baton sidecar: pd_protocol sglang is not supported yet (nixl only)")
        spec = next((e for e in config.engines if e.name == engine), None)
        if spec is None and config.discovery is not None:  # a pod beside its engine
            PodDiscovery.check_available()
            port = config.discovery.port
            spec = EngineSpec(engine_url or f"http://127.0.0.1:{port}", Role.DECODE, engine,
                              config.discovery.engine_type)
        if spec is None:
            raise ConfigError(f"--engine: no engine named {engine!r} in the config "
                              f"(engines: {', '.join(e.name for e in config.engines)})")
        if not spec.role.decodes:
            raise ConfigError(f"--engine: {engine} is a {spec.role.value} engine; a sidecar runs beside one that decodes")
        self.config, self.engine = config, spec
        # every other engine of the cluster: roles flip (Arrow), addresses outside never pass
        self.allowed = {endpoint_address(e.url): e for e in config.engines if e is not spec}
        self.session: aiohttp.ClientSession | None = None
        self.timeout = aiohttp.ClientTimeout(total=config.upstream_timeout_s, sock_connect=config.connect_timeout_s)
        self.pods = None if config.discovery is None else PodDiscovery(config.discovery, Allowlist(self))
        self._watch: asyncio.Task | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[json_errors])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/health", self.health)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        # no pool cap (a stream holds its connection), and never a connection an engine wrote past
        self.session = aiohttp.ClientSession(connector=upstream_connector(limit=0, ttl_dns_cache=300),
                                             auto_decompress=False)
        if self.pods is not None:
            self._watch = asyncio.create_task(self.pods.run())

    async def _stop(self, _app: web.Application) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self.session is not None:
            await self.session.close()

    @staticmethod
    def headers(spec: EngineSpec) -> dict[str, str]:
        out = {"Content-Type": "application/json"}
        if spec.api_key:
            out["Authorization"] = f"Bearer {spec.api_key}"
        return out

    def prefiller(self, request: web.Request) -> EngineSpec | None:
        """The allowed prefill engine the picker named (None: no PD); 403 for any other."""
        named = request.headers.get(PREFILLER) or request.headers.get(PREFILL_ENDPOINTS, "").split(",")[0].strip()
        if not named:
            return None
        spec = self.allowed.get(named)
        if spec is None:
            raise ApiError(403, f"prefill endpoint {named!r} is not one of this cluster's engines",
                           err_type="invalid_request_error", code="prefiller_not_allowed")
        return spec

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.serve(request, COMPLETIONS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.serve(request, CHAT)

    async def serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        prefill = self.prefiller(request)
        try:
            parsed, _ = decode_body(kind, await request.read())
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, f"request body exceeds {self.config.max_body_bytes} bytes", code="request_too_large")
        params = None
        if prefill is not None:
            try:
                answer = await post_json(self.session, prefill.url + endpoint(kind), handoff.prefill_body(parsed),
                                         self.headers(prefill), self.timeout)
                params = answer.get("kv_transfer_params")
            except UpstreamError as err:  # the engine here computes the prompt itself
                log.warning("prefill on %s failed (%s); decoding locally", prefill.name, err)
        body = orjson.dumps(handoff.relayed_decode_body(parsed, params))
        return await self._relay(request, kind, body)

    async def _relay(self, request: web.Request, kind: str, body: bytes) -> web.StreamResponse:
        """The engine's answer to the client as the engine writes it. An engine that fails
        before answering is a 502; one that breaks off a started answer ends the client's
        connection (a truncated answer, never a second response inside the first)."""
        url = self.engine.url + endpoint(kind)
        resp: web.StreamResponse | None = None
        try:
            async with self.session.post(url, data=body, headers=self.headers(self.engine), timeout=self.timeout) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    "Content-Type": up.headers.get("Content-Type", "application/json")})
                await resp.prepare(request)
                async for data in up.content.iter_any():
                    await resp.write(data)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            if resp is None:
                raise ApiError(502, f"decode engine {self.engine.name}: {type(exc).__name__}: {exc}",
                               err_type="server_error", code="backend_error") from None
            log.warning("decode engine %s broke off an answer: %s", self.engine.name, exc)
            if request.transport is not None:
                request.transport.close()
            return resp

    async def health(self, _request: web.Request) -> web.Response:
        try:
            async with self.session.get(self.engine.url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as up:
                return web.json_response({"engine": self.engine.name, "status": up.status}, status=up.status)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return web.json_response({"engine": self.engine.name, "status": "unreachable"}, status=503)


class Allowlist:
    """The prefill engines a sidecar lets a picker name, kept equal to the pool's pods by
    ``gateway.discovery`` (the fleet it keeps; every pod but the sidecar's own)."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar
        self.cluster = LiveCluster(lambda: 0.0, 1, 16)

    async def add(self, spec: EngineSpec) -> int:
        iid = self.cluster.add_engine(spec)
        if spec.name != self.sidecar.engine.name:
            self.sidecar.allowed[endpoint_address(spec.url)] = spec
        return iid

    def remove(self, iid: int) -> int:
        self.cluster.remove_engine(iid)
        self.sidecar.allowed.pop(endpoint_address(self.cluster.engines[iid].spec.url), None)
        return 0

    def set_role(self, iid: int, role: Role, by: str) -> None:
        self.cluster.set_role(iid, role)


def serve_sidecar(config: GatewayConfig, engine: str, host: str, port: int, engine_url: str | None = None) -> None:
    """``baton sidecar`` until interrupted."""
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sidecar = Sidecar(config, engine, engine_url)
    log.info("baton sidecar of %s on http://%s:%d; prefill engines allowed: %s", engine, host, port,
             ", ".join(sorted(sidecar.allowed)) or "none")
    web.run_app(sidecar.app(), host=host, port=port, print=None, access_log=None, handler_cancellation=True)
