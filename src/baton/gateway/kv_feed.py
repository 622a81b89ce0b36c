"""The gateway's subscription to the engines' KV events (vLLM's ``--kv-events-config``
publisher, or the emulator's), feeding ``kv_index.KvEventIndex``.

One ZMQ SUB socket per engine, connected to the address its config names (``kv_events``:
the engine's publisher binds, and any local process can subscribe to the token ids of
its prompts too), or bound to it (``kv_events_listen``: the gateway binds one named
interface and the engine connects, as vLLM's publisher does to an address without a
wildcard: no one else reads the feed, and no process can take the port of an engine that
restarts); the socket is the engine's identity, so a batch is applied to that engine's
entries only. A bound socket also takes other peers' connections: the index checks what
they claim against the prompts the gateway sent (``kv_index``, ``kv_events_verify``). Each reader takes a
``[topic, sequence, payload]`` message, charges the engine's token bucket, checks the topic
and frame shapes, decodes the msgpack batch (either encoding) and applies it. Whatever a
peer sends, the reader goes on: a message it cannot use is dropped and counted by reason
(``on_drop``: rate, malformed, topic), and because a dropped batch leaves the index behind
the engine, that engine's entries are cleared (a resync: its next stores rebuild them). A
reconnection clears them too: what the engine stored while the gateway was away is unknown
(vLLM's replay socket could fill it in; the gateway does not ask it). libzmq refuses a
frame over ``max_message_bytes`` before Python allocates it; where libzmq then gives up on
the connection, the feed connects again (``zmq_feed.ZmqFeed``, shared with the
hidden-state feed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from baton.core.errors import ConfigError
from baton.gateway.hidden import TokenBucket
from baton.gateway.kv_index import KvEventIndex
from baton.gateway.zmq_feed import ZmqFeed
from baton.protocol.kv_events import decode_batch

log = logging.getLogger("baton.gateway")
DROP_REASONS = ("rate", "malformed", "topic", "too_large")


@dataclass(slots=True, frozen=True)
class KvSource:
    """One engine's KV-event publisher: its instance id, name (for logs), ZMQ address, the
    topic its messages carry ("" accepts any), and whether the gateway binds the address
    (the engine connects) or connects to the engine's."""

    instance: int
    name: str
    address: str
    topic: str = ""
    bind: bool = False


@dataclass(slots=True, frozen=True)
class KvFeedLimits:
    """Per engine socket: ``rate_per_s`` batches a second on average (bursts of one
    second's worth; vLLM sends one batch per engine step), batches of at most
    ``max_message_bytes``."""

    rate_per_s: float = 2000.0
    max_message_bytes: int = 2 * 1024 * 1024


class KvEventFeed(ZmqFeed):
    """Subscribes to every source; runs until cancelled (``run``), then ``close``."""

    @staticmethod
    def check_available() -> None:
        try:
            import msgpack  # noqa: F401
            import zmq.asyncio  # noqa: F401
        except ImportError as e:
            raise ConfigError("engines[].kv_events needs pyzmq and msgpack: pip install 'baton[kv-events]'") from e

    def __init__(self, sources: list[KvSource], index: KvEventIndex, on_drop: Callable[[str], None],
                 limits: KvFeedLimits = KvFeedLimits()) -> None:
        self.check_available()
        import zmq

        super().__init__(zmq, sources)
        self.index, self.on_drop, self.limits, self.rate_per_s = index, on_drop, limits, limits.rate_per_s
        for src in sources:
            sock = self.context.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
            self._add(sock, src.address, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED, src.bind)
        self.dropped: dict[str, int] = {}
        self.applied = 0

    def _connection(self, index: int, up: bool) -> None:
        src = self.sources[index]
        self.index.engines[src.instance].connected = up
        if up:
            log.info("KV events of %s connected", src.name)
            if not src.bind:  # bound, any peer's connection would clear it: a restarted engine's batches
                # start again at sequence 0, and the gap clears its entries then
                self.index.resync(src.instance, "connected")  # what it stored meanwhile is unknown

    def _recv_error(self, index: int, err: Exception) -> None:
        self._drop(self.sources[index], "malformed", str(err))

    def _handle(self, index: int, frames: list[bytes], bucket: TokenBucket) -> None:
        self.handle(self.sources[index], frames, bucket)

    def handle(self, src: KvSource, frames: list[bytes], bucket: TokenBucket | None = None) -> None:
        """Apply one message from ``src``'s socket, or drop it (and resync that engine)."""
        if bucket is not None and not bucket.take():
            return self._drop(src, "rate", f"over {self.limits.rate_per_s:g} batches/s")
        if len(frames) != 3 or len(frames[1]) != 8:
            return self._drop(src, "malformed", f"expected [topic, 8-byte sequence, payload], got {len(frames)} frames")
        if src.topic and frames[0] != src.topic.encode():
            return self._drop(src, "topic", f"topic {frames[0][:64]!r}")
        if len(frames[2]) > self.limits.max_message_bytes:  # before any decoding: its size alone says no
            return self._drop(src, "too_large", f"{len(frames[2])} bytes, over kv_events_max_bytes")
        try:
            batch = decode_batch(frames[2])
            self.index.apply(src.instance, int.from_bytes(frames[1], "big"), batch, time.time())
        except Exception as err:  # noqa: BLE001 - nothing an engine sends may end its reader
            return self._drop(src, "malformed", str(err)[:200])
        self.applied += 1

    def _drop(self, src: KvSource, reason: str, detail: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        self.on_drop(reason)
        self.index.resync(src.instance, reason)
        if self.dropped[reason] == 1:
            log.warning("KV events from %s dropped (%s: %s); the engine's index is rebuilt from its next "
                        "events; further drops are only counted (baton_kv_events_dropped_total)",
                        src.name, reason, detail)
