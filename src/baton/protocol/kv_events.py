"""vLLM's KV cache events on the wire (``vllm/distributed/kv_events.py``), both directions.

A ZMQ PUB socket sends multipart messages ``[topic, sequence, payload]``: the sequence an
8-byte big-endian counter, the payload one msgpack-encoded ``KVEventBatch``. Recent vLLM
encodes structs as maps (``{"ts", "events": [...], "data_parallel_rank"}``, each event a map
tagged ``"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared"``); earlier versions
encoded them as arrays (``[ts, [events], rank]``, each event ``[tag, field, ...]`` in
declaration order). ``decode_batch`` reads both; ``encode_batch`` writes the map form.
Block hashes are integers (or bytes, passed through).

The events config is vLLM's ``--kv-events-config`` JSON: ``enable_kv_cache_events``,
``publisher`` (``zmq``), ``endpoint`` (``tcp://*:5557`` binds, ``tcp://host:port``
connects), ``topic``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

from baton.core.errors import ConfigError

# field order of the array encoding (vLLM's struct declaration order)
_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                           "lora_name", "extra_keys", "group_idx"),
           "BlockRemoved": ("block_hashes", "medium", "group_idx"),
           "AllBlocksCleared": ()}


@dataclass(frozen=True, slots=True)
class KvEvent:
    """One event: ``kind`` (BlockStored, BlockRemoved, AllBlocksCleared), the block hashes
    it concerns and, for stores, the parent hash, token ids and block size."""

    kind: str
    block_hashes: tuple = ()
    parent_block_hash: Any = None
    token_ids: tuple[int, ...] = ()
    block_size: int | None = None


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """vLLM's ``--kv-events-config``."""

    enabled: bool = False
    endpoint: str = "tcp://*:5557"
    topic: str = ""

    @classmethod
    def from_json(cls, text: str) -> "KvEventsConfig":
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--kv-events-config: not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError("--kv-events-config: expected a JSON object")
        publisher = raw.get("publisher", "zmq")
        if publisher not in ("zmq", "null"):
            raise ConfigError(f"--kv-events-config: publisher: expected zmq or null, got {publisher!r}")
        for key, kind in (("endpoint", str), ("topic", str), ("enable_kv_cache_events", bool)):
            if key in raw and not isinstance(raw[key], kind):
                raise ConfigError(f"--kv-events-config: {key}: expected {kind.__name__}, got {raw[key]!r}")
        return cls(bool(raw.get("enable_kv_cache_events", False)) and publisher == "zmq",
                   raw.get("endpoint", "tcp://*:5557"), raw.get("topic", ""))


@dataclass(slots=True)
class KvEventBatch:
    """A batch of events stamped ``ts`` (seconds since the epoch)."""

    ts: float
    events: list[KvEvent] = field(default_factory=list)
    data_parallel_rank: int | None = None


def encode_batch(batch: KvEventBatch) -> bytes:
    """The batch as vLLM's current msgpack map encoding."""
    import msgpack

    events = []
    for e in batch.events:
        item: dict[str, Any] = {"type": e.kind}
        if e.kind != "AllBlocksCleared":
            item["block_hashes"] = list(e.block_hashes)
        if e.kind == "BlockStored":
            item.update(parent_block_hash=e.parent_block_hash, token_ids=list(e.token_ids),
                        block_size=e.block_size, lora_id=None, medium="GPU", lora_name=None)
        elif e.kind == "BlockRemoved":
            item["medium"] = "GPU"
        events.append(item)
    out: dict[str, Any] = {"ts": batch.ts, "events": events}
    if batch.data_parallel_rank is not None:
        out["data_parallel_rank"] = batch.data_parallel_rank
    return msgpack.packb(out)


def _event(raw: Any) -> KvEvent:
    if isinstance(raw, dict):
        kind, fields = raw.get("type"), raw
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        kind = raw[0]
        fields = dict(zip(_FIELDS.get(kind, ()), raw[1:]))
    else:
        raise ValueError(f"not a KV event: {str(raw)[:80]}")
    if kind not in _FIELDS:
        raise ValueError(f"unknown KV event type {kind!r}")
    return KvEvent(kind, tuple(fields.get("block_hashes") or ()), fields.get("parent_block_hash"),
                   tuple(fields.get("token_ids") or ()), fields.get("block_size"))


def decode_batch(payload: bytes) -> KvEventBatch:
    """A msgpack ``KVEventBatch`` in either encoding; ValueError names what is wrong."""
    import msgpack

    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ValueError(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, (list, tuple)) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    else:
        raise ValueError("not a KV event batch")
    if not isinstance(ts, (int, float)) or not isinstance(events, (list, tuple)):
        raise ValueError("a KV event batch needs a number ts and a list of events")
    return KvEventBatch(float(ts), [_event(e) for e in events], rank)


@dataclass(slots=True)
class BlockIndex:
    """Which block hashes one engine holds cached, as its KV events say (what llm-d's
    precise prefix scorer keeps per pod). ``missed`` counts sequence gaps (lost batches)."""

    blocks: set = field(default_factory=set)
    last_seq: int | None = None
    missed: int = 0

    def apply(self, seq: int, batch: KvEventBatch) -> None:
        if self.last_seq is not None and seq > self.last_seq + 1:
            self.missed += seq - self.last_seq - 1
        self.last_seq = seq
        for e in batch.events:
            if e.kind == "BlockStored":
                self.blocks.update(e.block_hashes)
            elif e.kind == "BlockRemoved":
                self.blocks.difference_update(e.block_hashes)
            else:
                self.blocks.clear()

    def prefix_hits(self, keys: Sequence[Any]) -> int:
        """How many leading ``keys`` the engine holds."""
        n = 0
        for k in keys:
            if k not in self.blocks:
                break
            n += 1
        return n
