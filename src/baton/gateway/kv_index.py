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

With ``verify`` (the gateway's default, ``kv_events_verify``) a store is indexed only where
the engine could have made it: a block of a prompt the gateway sent to that engine
(``expect``, told of every leg before it goes), or one of the blocks continuing the last
such block, as many as the request's ``max_tokens`` (and the prompt's last partial block)
can fill. A peer that forges events on an engine's feed can then claim only what the
gateway itself sent there: it cannot draw another prompt's requests onto that engine.
Stores that fail the check are dropped and counted (``unverified``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    unverified: int = 0    # stored blocks dropped: no prompt sent there could have made them
    # gateway key -> blocks that may still follow it (0 inside a prompt), least recently sent first
    expected: OrderedDict = field(default_factory=OrderedDict)


class KvEventIndex:
    """Engine caches as their KV events describe them; ``matches`` serves the policies."""

    def __init__(self, verify: bool = False) -> None:
        self.index = PrefixIndex()
        self.engines: dict[int, EngineKvState] = {}
        self.verify = verify

    def expect(self, instance_id: int, keys: Sequence[int], max_tokens: int) -> None:
        """A prompt with block keys ``keys`` is about to be sent to the engine, to generate
        up to ``max_tokens``: its blocks, and as many more after its last as the output
        can fill, are blocks the engine may store. Kept for the most recently sent
        prompts, twice the engine's capacity in blocks."""
        st = self.engines.get(instance_id)
        if st is None or not keys:
            return
        exp = st.expected
        for k in keys[:-1]:
            if k not in exp:
                exp[k] = 0
            exp.move_to_end(k)
        last = keys[-1]
        # the output, and the prompt's partial last block, fill at most this many blocks
        exp[last] = max(exp.get(last, 0), -(-max_tokens // st.block_size) + 1)
        exp.move_to_end(last)
        while len(exp) > 2 * st.capacity_blocks:
            exp.popitem(last=False)

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
        if self.verify:
            keys = self._verified(st, parent, keys)
        st.keys.update(zip(event.block_hashes, keys))
        self.index.add(instance_id, keys)

    @staticmethod
    def _verified(st: EngineKvState, parent: int, keys: list[int]) -> list[int]:
        """The leading ``keys`` the engine could have stored (see the module docstring);
        the rest are counted as unverified (a block after a refused one is refused too:
        its parent is not indexed)."""
        exp, room = st.expected, st.expected.get(parent, 0) if parent else 0
        for n, k in enumerate(keys):
            if k in exp:
                room = exp[k]
            elif room > 0:  # a block of the output continuing a prompt sent there
                room -= 1
                exp[k] = room
            else:
                st.unverified += len(keys) - n
                return keys[:n]
        return keys

    def state(self) -> dict[int, dict]:
        """Per engine: indexed blocks and feed health (for ``/admin/kv``)."""
        return {iid: {"indexed_blocks": self.index.size(iid), "capacity_blocks": st.capacity_blocks,
                      "batches": st.batches, "events": st.events, "last_seq": st.last_seq, "gaps": st.gaps,
                      "resyncs": st.resyncs, "orphans": st.orphans, "lag_s": st.lag_s, "connected": st.connected,
                      "last_resync": st.last_resync, "unverified": st.unverified}
                for iid, st in self.engines.items()}
