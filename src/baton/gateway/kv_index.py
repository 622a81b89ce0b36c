"""What the engines' KV events say they hold: one index for all engines, keyed the way the
gateway keys prompts (``core.prefix.token_block_keys``), so that the prefix-aware policies
match a prompt against it (a ``PrefixSource``).

A BlockStored event carries engine hashes, the parent's engine hash and the blocks' token
ids; each block is indexed under the chain of its parent's key and its tokens, so the
engine's hash function and seed never matter (llm-d maps engine hashes the same way). Per
engine the map from engine hash to key answers the parent lookups and the BlockRemoved
events. The index trusts nothing it cannot check: a sequence gap (lost batches), a store
whose parent it never saw, or more blocks than the engine's capacity clear that engine's
entries (a resync: later stores rebuild them), and are counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from baton.core.prefix import token_block_keys
from baton.core.prefix_index import PrefixIndex
from baton.protocol.kv_events import KvEventBatch


@dataclass(slots=True)
class EngineKvState:
    """One engine's side of the index: its engine hashes and how its feed is going."""

    capacity_blocks: int
    block_size: int
    keys: dict  # engine hash -> gateway key
    last_seq: int | None = None
    batches: int = 0
    events: int = 0
    gaps: int = 0          # batches lost (sequence numbers skipped)
    resyncs: int = 0       # times its entries were cleared
    orphans: int = 0       # stores whose parent the index never saw
    lag_s: float = 0.0     # arrival time minus the batch's timestamp, last batch
    connected: bool = False  # the feed's socket to the engine is up (set by the feed)
    last_resync: str | None = None  # why its entries were last cleared


class KvEventIndex:
    """Engine caches as their KV events describe them; ``matches`` serves the policies."""

    def __init__(self) -> None:
        self.index = PrefixIndex()
        self.engines: dict[int, EngineKvState] = {}

    def add_engine(self, instance_id: int, capacity_blocks: int, block_size: int) -> None:
        self.engines[instance_id] = EngineKvState(capacity_blocks, block_size, {})

    def matches(self, keys: Sequence[int]) -> dict[int, int]:
        return self.index.matches(keys)

    def blocks(self, instance_id: int) -> int:
        return self.index.size(instance_id)

    def resync(self, instance_id: int, why: str) -> None:
        """Forget what an engine holds (its later events rebuild it)."""
        st = self.engines[instance_id]
        if st.keys:  # its own entries only: a resync costs what that engine holds, not the whole index
            self.index.remove(instance_id, list(set(st.keys.values())))
            st.keys.clear()
        st.resyncs, st.last_resync = st.resyncs + 1, why

    def apply(self, instance_id: int, seq: int, batch: KvEventBatch, now_unix_s: float) -> None:
        """One batch from the engine's own socket, sequence number ``seq``."""
        st = self.engines[instance_id]
        if st.last_seq is not None and seq != st.last_seq + 1:
            st.gaps += max(1, seq - st.last_seq - 1)
            self.resync(instance_id, "gap")
        st.last_seq, st.batches = seq, st.batches + 1
        st.lag_s = max(0.0, now_unix_s - batch.ts)
        for event in batch.events:
            st.events += 1
            if event.kind == "BlockStored":
                self._stored(instance_id, st, event)
            elif event.kind == "BlockRemoved":
                gone = [st.keys.pop(h) for h in event.block_hashes if h in st.keys]
                self.index.remove(instance_id, gone)
            else:  # AllBlocksCleared
                self.resync(instance_id, "cleared")
        if self.index.size(instance_id) > st.capacity_blocks:
            self.resync(instance_id, "over capacity")  # removals were lost: the index cannot be trusted

    def _stored(self, instance_id: int, st: EngineKvState, event) -> None:
        bs = event.block_size or st.block_size
        if event.parent_block_hash is None:
            parent = 0
        elif event.parent_block_hash in st.keys:
            parent = st.keys[event.parent_block_hash]
        else:
            st.orphans += 1
            return
        if len(event.token_ids) < bs * len(event.block_hashes) or bs != st.block_size:
            raise ValueError(f"BlockStored: {len(event.block_hashes)} blocks of {bs} tokens with "
                             f"{len(event.token_ids)} token ids (gateway block size {st.block_size})")
        keys = token_block_keys(event.token_ids[:bs * len(event.block_hashes)], bs, parent)
        st.keys.update(zip(event.block_hashes, keys))
        self.index.add(instance_id, keys)

    def state(self) -> dict[int, dict]:
        """Per engine: indexed blocks and feed health (for ``/admin/kv``)."""
        return {iid: {"indexed_blocks": self.index.size(iid), "capacity_blocks": st.capacity_blocks,
                      "batches": st.batches, "events": st.events, "last_seq": st.last_seq, "gaps": st.gaps,
                      "resyncs": st.resyncs, "orphans": st.orphans, "lag_s": st.lag_s, "connected": st.connected,
                      "last_resync": st.last_resync}
                for iid, st in self.engines.items()}
