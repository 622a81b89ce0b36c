"""The emulator's KV events: vLLM's ZMQ publisher, fed by the prefix cache.

The engine's ``PrefixCache`` reports blocks it caches and evicts (``CacheListener``); each
engine iteration's events go out as one batch, ``[topic, sequence, msgpack batch]`` on a PUB
socket (``protocol/kv_events.py``), as vLLM's ``ZmqEventPublisher`` sends them. Block
hashes are the emulator's block keys (chained over token ids), token ids those of the
blocks (the emulator's output ids are their positions).
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from typing import Any

from baton.core.errors import ConfigError
from baton.protocol.kv_events import KvEvent, KvEventBatch, KvEventsConfig, encode_batch


class KvEventPublisher:
    """A ``CacheListener`` that publishes what it hears, one batch per ``flush``."""

    def __init__(self, config: KvEventsConfig, block_size: int) -> None:
        try:
            import msgpack  # noqa: F401  # encode_batch needs it: say so now, not at the first event
            import zmq
        except ImportError:
            raise ConfigError("--kv-events-config needs pyzmq and msgpack: pip install -e '.[kv-events]'") from None
        self.block_size, self.topic = block_size, config.topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        try:
            if "*" in config.endpoint or config.endpoint.startswith(("ipc://", "inproc://")):
                self._pub.bind(config.endpoint)
            else:
                self._pub.connect(config.endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise ConfigError(f"--kv-events-config: endpoint {config.endpoint!r}: {exc}") from None
        self._seq = 0
        self._pending: list[KvEvent] = []

    def stored(self, req_id: Any, first_index: int, keys: Seq[int]) -> None:
        seq, bs = req_id, self.block_size  # engine_loop names the request by its Sequence
        ids = seq.token_ids()
        parent = seq.block_keys(bs)[first_index - 1] if first_index else None
        tokens = tuple(ids[first_index * bs:(first_index + len(keys)) * bs])
        self._pending.append(KvEvent("BlockStored", tuple(keys), parent, tokens, bs))

    def removed(self, keys: Seq[int]) -> None:
        self._pending.append(KvEvent("BlockRemoved", tuple(keys)))

    def flush(self) -> None:
        """Send the events heard since the last flush as one batch (nothing if none)."""
        if not self._pending:
            return
        batch = KvEventBatch(time.time(), self._pending, 0)
        self._pending = []
        self._pub.send_multipart((self.topic, self._seq.to_bytes(8, "big"), encode_batch(batch)))
        self._seq += 1

    def close(self) -> None:
        self._pub.close(0)
        self._ctx.term()
