"""What the gateway's ZMQ subscriptions share (the hidden-state feed and the KV-event feed):
one SUB socket per engine with a connection monitor, a reader per socket that never stops
on what a peer sends and yields to the event loop under a flood, and a fresh connection
where libzmq gives up (after a protocol failure or a frame over MAXMSGSIZE it stops trying,
and a peer must not be able to cut an engine's feed off for good).

Subclasses build the sockets (``_add``), handle a message (``_handle``), a receive error
(``_recv_error``) and a connection change (``_connection``)."""

from __future__ import annotations

import asyncio
from typing import Any

from baton.core.errors import ConfigError
from baton.gateway.hidden import TokenBucket

BATCH = 64  # messages a reader handles before it lets the event loop run (about 1-3 ms of work)
BATCH_BYTES = 256 * 1024  # or bytes: a few large messages are as much work as many small ones
RECONNECT_S = 0.5  # seconds before connecting again where libzmq gave up


class ZmqFeed:
    """Sockets, monitors, readers and reconnection; see the module docstring."""

    rate_per_s: float = 5000.0  # messages a second per socket, bursts of one second's worth

    def __init__(self, zmq: Any, sources: list) -> None:
        import zmq.asyncio

        self.zmq, self.sources = zmq, sources
        self.context = zmq.asyncio.Context()
        self.sockets: list = []
        self.monitors: list = []
        self.connected: dict[int, bool] = {}
        self._reconnecting: set[int] = set()
        self._bound: set[int] = set()  # sockets that bind (their peers connect, and reconnect, to them)

    def _add(self, sock, address: str, events: int, bind: bool = False) -> None:
        """Watch and connect (or bind) one source's socket (in source order)."""
        # a PUB socket drops what it sends before a subscriber is connected: the monitor
        # tells when each engine's socket is
        self.monitors.append(sock.get_monitor_socket(events))
        if bind:
            try:
                sock.bind(address)
            except self.zmq.ZMQError as err:
                raise ConfigError(f"cannot bind the feed address {address}: {err}") from None
            self._bound.add(len(self.sockets))
        else:
            sock.connect(address)
        self.connected[len(self.sockets)] = False
        self.sockets.append(sock)

    async def run(self) -> None:
        """Receive until cancelled."""
        await asyncio.gather(*(self._read(i, s) for i, s in enumerate(self.sockets)),
                             *(self._watch(i, m) for i, m in enumerate(self.monitors)))

    async def _watch(self, index: int, monitor) -> None:
        from zmq.utils.monitor import parse_monitor_message

        zmq = self.zmq
        while True:
            try:
                event = parse_monitor_message(await monitor.recv_multipart())["event"]
            except (zmq.ZMQError, ValueError, KeyError):
                continue
            up = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            self._event(index, event)
            if event not in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL) \
                    and index not in self._reconnecting and index not in self._bound:
                self._reconnecting.add(index)
                asyncio.get_running_loop().call_later(RECONNECT_S, self._reconnect, index)
            if self.connected[index] != up:
                self.connected[index] = up
                self._connection(index, up)

    def _reconnect(self, index: int) -> None:
        """Connect again unless the socket is connected (libzmq retried by itself)."""
        self._reconnecting.discard(index)
        if self.connected[index]:
            return
        sock, address = self.sockets[index], self.sources[index].address
        try:
            sock.disconnect(address)
        except self.zmq.ZMQError:
            pass  # libzmq already forgot the endpoint
        sock.connect(address)

    async def _read(self, index: int, sock) -> None:
        bucket = TokenBucket(self.rate_per_s, max(1.0, self.rate_per_s))
        handled = taken = 0
        while True:
            try:
                frames = await sock.recv_multipart()
            except self.zmq.ZMQError as err:  # e.g. a frame over MAXMSGSIZE mid-read: keep reading
                self._recv_error(index, err)
                await asyncio.sleep(0.01)
                continue
            self._handle(index, frames, bucket)
            handled, taken = handled + 1, taken + sum(map(len, frames))
            if handled % BATCH == 0 or taken >= BATCH_BYTES:
                taken = 0
                # recv_multipart returns at once while messages are queued: without this
                # a flood would keep the loop from everything else (/health included)
                await asyncio.sleep(0)

    def _handle(self, index: int, frames: list[bytes], bucket: TokenBucket) -> None:
        raise NotImplementedError

    def _recv_error(self, index: int, err: Exception) -> None:
        raise NotImplementedError

    def _event(self, index: int, event: int) -> None:
        """A monitor event (every one, before the connection bookkeeping)."""

    def _connection(self, index: int, up: bool) -> None:
        """The socket's connection came up or went down."""

    def close(self) -> None:
        for sock in self.sockets:
            sock.disable_monitor()
            sock.close(0)
        for mon in self.monitors:
            mon.close(0)
        self.context.term()
