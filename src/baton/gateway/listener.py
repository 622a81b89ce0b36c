"""Serving the gateway's aiohttp apps with a request-head deadline of its own.

aiohttp times a fresh connection's wait for its first head and a kept-alive connection's
idle time with one timer (``keepalive_timeout``). It must be long (``keepalive_timeout_s``,
75 s as nginx's keep-alive) or clients that reuse idle connections race the close; but then
a slowloris that sends a few bytes of a head holds its connection for 75 s, and a few
connections a second exhaust the descriptors. So each connection is wrapped
(``HeadGuard``, around aiohttp's own protocol, which does all the HTTP): from the first byte
of a head, the whole head must arrive within ``head_timeout_s`` (10 s, nginx's
``client_header_timeout`` is 60) or the connection is closed, and an address may hold at most
``max_partial_heads_per_client`` connections part-way through a head at once (a further one is
closed at once). An idle kept-alive connection, with no byte of a next head, keeps the long
timer. A request's head is complete when aiohttp hands it to the app (``head_middleware``);
the next head is awaited once the response is done. A pipelined client's next head that
arrives while the previous response is still being written is not timed (the keep-alive
timer still bounds it).

Only public interfaces: ``web.AppRunner``'s ``server`` is the protocol factory aiohttp
itself passes to ``loop.create_server``, and ``request.transport`` names the connection.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from baton.gateway.config import GatewayConfig


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """``head_timeout_s``: seconds from a head's first byte to its end; ``max_per_client``:
    connections of one address part-way through a head at once."""

    head_timeout_s: float = 10.0
    max_per_client: int = 8


class HeadClock:
    """Per server: the connections part-way through a head, by address, and the guard of
    each connection's transport (the middleware's way to its connection)."""

    def __init__(self, limits: HeadLimits) -> None:
        self.limits = limits
        self.partial: dict[str, int] = {}
        self.guards: dict[Any, HeadGuard] = {}

    def head_started(self, address: str) -> bool:
        """One more partial head from ``address``; False when it is over the cap."""
        n = self.partial.get(address, 0) + 1
        if n > self.limits.max_per_client:
            return False
        self.partial[address] = n
        return True

    def head_over(self, address: str) -> None:
        n = self.partial.get(address, 0) - 1
        if n > 0:
            self.partial[address] = n
        else:
            self.partial.pop(address, None)


class HeadGuard(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the head deadline and the partial-head
    cap in front of it (see the module docstring). ``state``: "idle" (waiting for the
    first byte of a head), "head" (part of a head arrived: timed and counted), "request"
    (the head is complete: the body, the handler and the response are timed elsewhere)."""

    def __init__(self, inner: asyncio.Protocol, clock: HeadClock) -> None:
        self.inner, self.clock = inner, clock
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.state = "idle"
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.address = peer[0] if isinstance(peer, tuple) and peer else str(peer or "")
        self.clock.guards[transport] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.state == "idle" and data:
            if b"\r\n\r\n" in data:  # a whole head in its first packet, as clients send it
                self.state = "request"
            elif not self.clock.head_started(self.address):
                self.transport.close()  # type: ignore[union-attr]
                return
            else:
                self.state = "head"
                self.timer = asyncio.get_running_loop().call_later(self.clock.limits.head_timeout_s, self._expired)
        elif self.state == "head" and b"\r\n\r\n" in data:
            self.head_done()  # (a terminator split across packets waits for the middleware)
        self.inner.data_received(data)

    def _expired(self) -> None:
        self.timer = None
        self.clock.head_over(self.address)
        if self.state == "head" and self.transport is not None:
            self.transport.close()

    def head_done(self) -> None:
        """The head is complete (its terminator arrived, or aiohttp handed it to the app)."""
        self.state = "request"
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.clock.head_over(self.address)

    def response_done(self) -> None:
        """The response went out: the connection waits for its next head."""
        self.state = "idle"

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.clock.head_over(self.address)
        self.clock.guards.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


HEAD_CLOCK = web.AppKey("baton_head_clock", HeadClock)


@web.middleware
async def head_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Tell the connection's guard that its head is complete, and when its response is
    done (a no-op where the app is served without guards, as in aiohttp's test server)."""
    clock = request.app.get(HEAD_CLOCK)
    guard = clock.guards.get(request.transport) if clock is not None else None
    if guard is None:
        return await handler(request)
    guard.head_done()
    try:
        return await handler(request)
    finally:
        guard.response_done()


def listener_settings(config: GatewayConfig) -> dict:
    """``serve_app``'s settings from a gateway config (the head deadline apart from the
    keep-alive idle time, the access log)."""
    return {"limits": HeadLimits(config.head_timeout_s, config.max_partial_heads_per_client),
            "keepalive_timeout_s": config.keepalive_timeout_s,
            "access_log": logging.getLogger("baton.access") if config.access_log else None}


# Python's default first-generation threshold (700 new objects) ran a collection every 15 or
# so 8-token requests here, 0.2 ms each and 0.5 ms for the second generation, about 8% of the
# gateway's CPU and a pause in the tail of every client's latency; a request's objects are
# freed by reference counting long before a collection could find them. At 20,000 a
# collection runs every few thousand requests (about 3 ms).
GEN0_THRESHOLD_OBJECTS = 20_000


def settle_collector() -> None:
    """Once the app has started: what start-up built (modules, the policy, the config)
    frozen out of the collector's reach, so the rare full collection walks only what
    serving made; then the higher first-generation threshold."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD_OBJECTS, *gc.get_threshold()[1:])


def serve_app(app: web.Application, host: str, port: int, limits: HeadLimits, keepalive_timeout_s: float,
              access_log: Any = None, reuse_port: bool = False) -> None:
    """Serve ``app`` until SIGINT or SIGTERM (uvloop when installed), every connection
    guarded; shut down as ``web.run_app`` does (open requests get aiohttp's grace time)."""
    try:
        import uvloop
        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    clock = HeadClock(limits)
    app[HEAD_CLOCK] = clock
    try:
        loop.run_until_complete(_serve(app, clock, host, port, keepalive_timeout_s, access_log, reuse_port))
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _serve(app: web.Application, clock: HeadClock, host: str, port: int, keepalive_timeout_s: float,
                 access_log: Any, reuse_port: bool) -> None:
    loop = asyncio.get_running_loop()
    runner = web.AppRunner(app, handler_cancellation=True, keepalive_timeout=keepalive_timeout_s,
                           access_log=access_log)
    await runner.setup()
    settle_collector()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = None
    try:
        server = await loop.create_server(lambda: HeadGuard(runner.server(), clock), host, port,  # type: ignore[misc]
                                          reuse_address=True, reuse_port=reuse_port or None, backlog=1024,
                                          family=socket.AF_UNSPEC)
        await stop.wait()
    finally:
        if server is not None:
            server.close()
        await runner.cleanup()
