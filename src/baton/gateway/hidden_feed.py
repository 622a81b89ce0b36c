"""The gateway's subscription to the engines' hidden states (see ``gateway.hidden`` for
the wire format and what a state must pass to be believed).

One ZMQ SUB socket per engine, a CURVE client pinned to that engine's public key when the
config names one. Each socket's reader takes a message, charges the engine's token bucket,
parses it and hands ``(instance, tag, n_gen, vector)`` to ``deliver``, which returns None
(taken) or a drop reason. Every drop is counted by reason (``on_drop``); nothing a peer
sends ends a reader. A connection monitor per socket keeps ``on_connected`` (the number
of engine sockets connected) truthful and counts failed handshakes as ``auth`` drops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from baton.core.errors import ConfigError
from baton.gateway.hidden import MAX_DIM, Drop, TokenBucket, parse

log = logging.getLogger("baton.gateway")
BATCH = 64  # messages a reader handles before it lets the event loop run (about 1-3 ms of work)
RECONNECT_S = 0.5  # seconds before connecting again where libzmq gave up (it retries only some failures)

Deliver = Callable[[int, str, int, np.ndarray], "str | None"]


@dataclass(slots=True, frozen=True)
class HiddenSource:
    """One engine's feed: its instance id, name (for logs), ZMQ address and CURVE public
    key (Z85; None: unauthenticated)."""

    instance: int
    name: str
    address: str
    public_key: str | None = None


@dataclass(slots=True, frozen=True)
class FeedLimits:
    """Per engine socket: ``rate_per_s`` messages a second on average (bursts of one
    second's worth), vectors of at most ``max_dim`` float32 values."""

    rate_per_s: float = 5000.0
    max_dim: int = MAX_DIM


class HiddenStateFeed:
    """Subscribes to every source; runs until cancelled (``run``), then ``close``."""

    @staticmethod
    def check_available(curve: bool = False) -> None:
        """ConfigError unless pyzmq can be imported (with CURVE support if ``curve``)."""
        try:
            import zmq
            import zmq.asyncio  # noqa: F401
        except ImportError as e:
            raise ConfigError("engines[].hidden_states needs pyzmq: pip install 'baton[learned]'") from e
        if curve and not zmq.has("curve"):
            raise ConfigError("engines[].hidden_states_key: this pyzmq/libzmq has no CURVE support")

    def __init__(self, sources: list[HiddenSource], deliver: Deliver, on_drop: Callable[[str], None],
                 on_connected: Callable[[int], None] | None = None, limits: FeedLimits = FeedLimits(),
                 client_secret_key: str | None = None) -> None:
        self.check_available(curve=any(s.public_key for s in sources))
        import zmq
        import zmq.asyncio

        self.zmq, self.deliver, self.on_drop, self.on_connected = zmq, deliver, on_drop, on_connected
        self.sources, self.limits = sources, limits
        self.context = zmq.asyncio.Context()
        self._client_keys = self._client_keypair(client_secret_key) if any(s.public_key for s in sources) else None
        plain = [s.name for s in sources if not s.public_key]
        if plain:
            log.warning("hidden-state feed of %s is unauthenticated (no hidden_states_key): anyone who can "
                        "bind its address can steer the policy", ", ".join(plain))
        self.sockets, self.monitors = [], []
        for src in sources:
            sock = self._socket(src)
            # a PUB socket drops what it sends before a subscriber is connected: the
            # monitor tells when each engine's socket is (``connected``, a gauge)
            self.monitors.append(sock.get_monitor_socket(self._events()))
            sock.connect(src.address)
            self.sockets.append(sock)
        self.connected: dict[int, bool] = {i: False for i in range(len(sources))}
        self.dropped: dict[str, int] = {}  # by reason, for logs and tests (the metric is on_drop's)
        self.delivered = 0
        self._reconnecting: set[int] = set()

    def _events(self) -> int:
        """The connection events the monitors report."""
        z = self.zmq
        return (z.EVENT_HANDSHAKE_SUCCEEDED | z.EVENT_DISCONNECTED | z.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                | z.EVENT_HANDSHAKE_FAILED_PROTOCOL | z.EVENT_HANDSHAKE_FAILED_AUTH)

    def _client_keypair(self, secret: str | None) -> tuple[bytes, bytes]:
        """(public, secret) of the gateway's CURVE client: from the config (engines that
        admit only known gateways need a stable one), else made for this run."""
        if secret is None:
            return self.zmq.curve_keypair()
        return self.zmq.curve_public(secret.encode()), secret.encode()

    def _socket(self, src: HiddenSource):
        zmq = self.zmq
        sock = self.context.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.LINGER, 0)
        # libzmq disconnects a peer that sends a larger frame, before Python allocates it;
        # the margin covers CURVE's per-frame overhead
        sock.setsockopt(zmq.MAXMSGSIZE, 4 * self.limits.max_dim + 1024)
        if src.public_key and self._client_keys is not None:
            sock.curve_serverkey = src.public_key.encode()
            sock.curve_publickey, sock.curve_secretkey = self._client_keys
        return sock

    async def run(self) -> None:
        """Receive until cancelled."""
        await asyncio.gather(*(self._read(i, s) for i, s in enumerate(self.sockets)),
                             *(self._watch(i, m) for i, m in enumerate(self.monitors)))

    async def _watch(self, index: int, monitor) -> None:
        from zmq.utils.monitor import parse_monitor_message

        zmq, src = self.zmq, self.sources[index]
        while True:
            try:
                event = parse_monitor_message(await monitor.recv_multipart())["event"]
            except (zmq.ZMQError, ValueError, KeyError):
                continue
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                log.info("hidden-state feed of %s connected", src.name)
            elif event != zmq.EVENT_DISCONNECTED:  # a failed handshake: a peer without the engine's key
                self._drop(index, Drop("auth", f"handshake with {src.address} failed"))
            if event not in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL) \
                    and index not in self._reconnecting:
                # after a protocol or ZAP failure, or a frame over MAXMSGSIZE, libzmq stops
                # trying: a peer must not be able to cut an engine's feed off for good
                self._reconnecting.add(index)
                asyncio.get_running_loop().call_later(RECONNECT_S, self._reconnect, index)
            if self.connected[index] != (event == zmq.EVENT_HANDSHAKE_SUCCEEDED):
                self.connected[index] = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
                if self.on_connected:
                    self.on_connected(sum(self.connected.values()))

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
        src = self.sources[index]
        bucket = TokenBucket(self.limits.rate_per_s, max(1.0, self.limits.rate_per_s))
        handled = 0
        while True:
            try:
                frames = await sock.recv_multipart()
            except self.zmq.ZMQError as err:  # e.g. a frame over MAXMSGSIZE mid-read: keep reading
                self._drop(index, Drop("malformed", str(err)))
                await asyncio.sleep(0.01)
                continue
            self._handle(index, src, frames, bucket)
            handled += 1
            if handled % BATCH == 0:
                # recv_multipart returns at once while messages are queued: without this
                # a flood would keep the loop from everything else (/health included)
                await asyncio.sleep(0)

    def _handle(self, index: int, src: HiddenSource, frames: list[bytes], bucket: TokenBucket) -> None:
        try:
            if not bucket.take():  # first: the cheapest check sheds a flood
                raise Drop("rate", f"over {self.limits.rate_per_s:g} messages/s")
            tag, n_gen, vec = parse(frames, self.limits.max_dim)
            reason = self.deliver(src.instance, tag, n_gen, vec)
            if reason is not None:
                raise Drop(reason)
            self.delivered += 1
        except Drop as drop:
            self._drop(index, drop)
        except Exception as err:  # noqa: BLE001 - nothing an engine sends may end its reader
            self._drop(index, Drop("rejected", repr(err)))

    def _drop(self, index: int, drop: Drop) -> None:
        self.dropped[drop.reason] = self.dropped.get(drop.reason, 0) + 1
        self.on_drop(drop.reason)
        if self.dropped[drop.reason] == 1:  # the first of each reason says why; more would flood the log
            log.warning("hidden state from %s dropped (%s); further drops are only counted "
                        "(baton_hidden_states_dropped_total)", self.sources[index].name, drop)

    def close(self) -> None:
        for sock in self.sockets:
            sock.disable_monitor()
            sock.close(0)
        for mon in self.monitors:
            mon.close(0)
        self.context.term()
