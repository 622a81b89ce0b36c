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

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from baton.core.errors import ConfigError
from baton.gateway.hidden import MAX_DIM, Drop, TokenBucket, parse
from baton.gateway.zmq_feed import ZmqFeed

log = logging.getLogger("baton.gateway")

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


class HiddenStateFeed(ZmqFeed):
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

        super().__init__(zmq, sources)
        self.deliver, self.on_drop, self.on_connected, self.limits = deliver, on_drop, on_connected, limits
        self.rate_per_s = limits.rate_per_s
        self._client_keys = self._client_keypair(client_secret_key) if any(s.public_key for s in sources) else None
        plain = [s.name for s in sources if not s.public_key]
        if plain:
            log.warning("hidden-state feed of %s is unauthenticated (no hidden_states_key): anyone who can "
                        "bind its address can steer the policy", ", ".join(plain))
        for src in sources:
            self._add(self._socket(src), src.address, self._events())
        self.dropped: dict[str, int] = {}  # by reason, for logs and tests (the metric is on_drop's)
        self.delivered = 0

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

    def _event(self, index: int, event: int) -> None:
        zmq, src = self.zmq, self.sources[index]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            log.info("hidden-state feed of %s connected", src.name)
        elif event != zmq.EVENT_DISCONNECTED:  # a failed handshake: a peer without the engine's key
            self._drop(index, Drop("auth", f"handshake with {src.address} failed"))

    def _connection(self, index: int, up: bool) -> None:
        if self.on_connected:
            self.on_connected(sum(self.connected.values()))

    def _recv_error(self, index: int, err: Exception) -> None:
        self._drop(index, Drop("malformed", str(err)))

    def _handle(self, index: int, frames: list[bytes], bucket: TokenBucket) -> None:
        src = self.sources[index]
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
