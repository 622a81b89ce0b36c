"""One relay worker of ``baton serve --workers N``: accepts client connections on the
gateway's port (SO_REUSEPORT: the kernel spreads connections over the relays), reads and
validates bodies, and relays each request's legs itself (``flow.Flow``); placement and
every other policy step go to the control process (``relay_control``). Everything else
(``/metrics``, ``/health``, ``/admin/*``, ``/v1/models``, ``/version``) is control's: a
relay passes those requests through to control's private HTTP port."""

from __future__ import annotations

import asyncio
import logging
import os

import aiohttp
from aiohttp import web

from baton.gateway import ipc
from baton.gateway.config import GatewayConfig
from baton.gateway.engines import Engines
from baton.gateway.front import Front
from baton.gateway.middleware import FROM_CONTROL
from baton.gateway.relay_control import Link, RelayCluster, RemoteControl
from baton.perf import presets
from baton.protocol.errors import error_body

log = logging.getLogger("baton.gateway")

ID_BITS = 40  # a relay's request ids: its start number above these bits (unique across restarts)
_HOP_HEADERS = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length",
                          "upgrade", "proxy-connection", "te", "trailer"})


class RelayEngines(Engines):
    """A relay's engines. Control owns what the engines say of themselves (model names and
    context lengths reach the relays in its snapshots), so a leg's 404 asks control to ask
    the engine again; the relay forgets the old name meanwhile, as one process does."""

    def __init__(self, config: GatewayConfig, cluster: RelayCluster, perf, link: Link) -> None:
        super().__init__(config, cluster, perf)
        self.link = link

    def rediscover(self, iid: int) -> None:
        self.names.forget(iid)
        self.link.op("rd", iid)


class Relay(Front):
    """A relay worker (see the module docstring). ``slot``: its place among the workers;
    ``generation``: how many relays the supervisor started before it (ids and identity)."""

    def __init__(self, config: GatewayConfig, slot: int, generation: int, control_address: str,
                 control_url: str) -> None:
        perf = presets.build(config.preset)
        self.slot, self.generation, self.control_url = slot, generation, control_url
        link = Link(control_address, f"relay-{slot}-{generation}".encode(), config.relay_report_interval_s,
                    self._on_message, self._hello)
        cluster = RelayCluster(link, generation << ID_BITS, perf.kv_capacity_tokens // config.block_size,
                               config.block_size, config.scrape_interval_s)
        engines = RelayEngines(config, cluster, perf, link)
        engines.reseed(generation)
        for spec in config.engines:
            engines.add(spec)
        super().__init__(config, cluster, engines, RemoteControl(config, cluster, link), needs_prefix_keys=False)
        self.link = link
        self._control_session: aiohttp.ClientSession | None = None
        self._pushing: asyncio.Task | None = None

    def app(self) -> web.Application:
        app = self.base_app(log)
        app.router.add_route("*", "/{tail:.*}", self.to_control)
        return app

    async def _start(self, _app: web.Application) -> None:
        self.engines.open_session()
        self._control_session = aiohttp.ClientSession(auto_decompress=False,
                                                      timeout=aiohttp.ClientTimeout(total=30, sock_connect=2))
        await self.link.start()
        await self.link.until_answered()  # the port opens to clients once requests can be placed
        self._pushing = asyncio.create_task(self._push_counts())

    async def _push_counts(self) -> None:
        """This relay's counts to control every ``ipc.COUNTS_S``, unasked: a relay that dies
        loses at most that much of them (control keeps what it last had)."""
        while True:
            await asyncio.sleep(ipc.COUNTS_S)
            if self.link.up:
                self.link.send(["metrics", -1, self.metrics.counts()])

    async def _stop(self, _app: web.Application) -> None:
        if self._pushing is not None:
            self._pushing.cancel()
        await self.link.close()
        await self.engines.close_session()
        if self._control_session is not None:
            await self._control_session.close()
        self.close_parsers()

    # --- control's messages ------------------------------------------------------------------
    def _hello(self) -> list:
        return [self.slot, self.generation, os.getpid(), self.control.records()]

    def _on_message(self, message: list) -> None:
        kind = message[0]
        if kind == "snap":
            self.cluster.apply_snapshot(message[:4] + message[5:7], self.engines.add)
            self.key_prompts(message[4])
            names = self.engines.names  # model names and context lengths control's scrapes found
            for iid, name, context_tokens in message[7]:
                if name is not None:
                    names.by_engine[iid] = name
                if context_tokens is not None:
                    names.context_tokens[iid] = context_tokens
        elif kind == "migrate":
            self.control.migrate(message[1], message[2])
        elif kind == "pull":
            self.link.send(["metrics", message[1], self.metrics.counts()])

    # --- everything but the two OpenAI endpoints: control's ------------------------------------
    async def to_control(self, request: web.Request) -> web.StreamResponse:
        """Pass a request through to control's HTTP port (admin, metrics, health, models)."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers[ipc.RELAYED_FOR] = request.remote or ""  # control's admin API judges logins by the client's address
        body = await request.read() if request.can_read_body else None
        assert self._control_session is not None
        try:
            async with self._control_session.request(request.method, self.control_url + request.path_qs,
                                                     headers=headers, data=body, allow_redirects=False) as resp:
                payload = await resp.read()
                out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP_HEADERS}
                answer = web.Response(status=resp.status, body=payload, headers=out)
                answer[FROM_CONTROL] = True  # control counted it (baton_responses_total)
                return answer
        except (aiohttp.ClientError, TimeoutError) as err:
            log.warning("relay %d: control did not answer %s %s: %s", self.slot, request.method, request.path, err)
            return web.json_response(error_body("the gateway's control process is not answering; retry",
                                                "server_error", None, "control_unavailable"), status=503)
