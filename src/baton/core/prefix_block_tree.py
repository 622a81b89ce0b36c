"""A per-block LRU of the blocks a router sent each instance (the Gateway API Inference
Extension's approximate prefix indexer), kept as runs of a radix tree over chained keys.

The semantics are block by block: each instance has an LRU of block keys, at most its
capacity; recording a prompt touches its keys (those the instance holds first, in prompt
order, then the new ones, in prompt order) and then drops the least recently touched keys
beyond the capacity, one by one, so a prompt's *first* blocks go first and an instance can
hold a prompt's later blocks without its first ones (a hole, which ends its match there).

The representation is by runs. One tree is shared by all instances; each node is a run of
chained keys and records, per instance holding any of it, its *group*: the keys it holds
are the run's keys from an offset on (the evicted ones are always a leading part of the
group), touched together at one place in the instance's LRU order. That place is an order
key ``(record tick, phase, depth)``: the prompt recorded at a tick touched its held groups
(phase 0) before its new ones (phase 1), each in prompt order (the depth of the run's
first key). Every group's keys are contiguous in its instance's LRU in run order, so the
LRU is the groups sorted by order key, and a heap per instance gives the oldest group.
Matching a prompt is a walk of its path with a running AND of the bitsets of instances
holding each node's whole run, as ``PrefixIndex`` does per key: its cost is set by the
branch points of the path, not by its blocks. ``tests/core/test_prefix_block_tree.py``
checks it against the per-block LRU it represents.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import count

from baton.core.prefix_index import _bits
from baton.core.prefix_tree import hang_below, shared_length, walk

Order = tuple[int, int, int]  # (record tick, phase: 0 held / 1 new, depth of the group's first key)


class BlockNode:
    """A run of chained keys; per instance its group (order key, how many leading keys of
    the run it no longer holds); the bitset of instances holding the whole run; children by
    first key; the parent (None once detached)."""

    __slots__ = ("run", "stamps", "children", "parent", "full")

    def __init__(self, run: list[int], parent: BlockNode | None) -> None:
        self.run, self.parent = run, parent
        self.stamps: dict[int, tuple[Order, int]] = {}
        self.children: dict[int, BlockNode] = {}
        self.full = 0


class BlockLruTree:
    """Prompts sent to instances, as per-instance LRUs of block keys with a capacity each."""

    def __init__(self) -> None:
        self._root = BlockNode([], None)
        self._tick = 0
        self._sizes: dict[int, int] = {}
        self._heaps: dict[int, list[tuple[int, int, int, int, BlockNode]]] = {}  # order, seq, node
        self._seq = count()  # breaks ties between heap entries without comparing nodes

    def size(self, instance_id: int) -> int:
        """Blocks the instance holds."""
        return self._sizes.get(instance_id, 0)

    def record(self, instance_id: int, keys: Sequence[int], capacity_blocks: int) -> None:
        """The prompt (its chained keys) was sent to the instance: its keys become the most
        recent (held ones first), then the oldest go until at most ``capacity_blocks`` stay."""
        self._tick += 1
        path = self._path(instance_id, keys)
        held = [(n, d) for n, d in path if instance_id in n.stamps]
        new = [(n, d) for n, d in path if instance_id not in n.stamps]
        for phase, nodes in ((0, held), (1, new)):
            for node, depth in nodes:
                self._set(instance_id, node, (self._tick, phase, depth), 0)
        size = self._sizes[instance_id] = self._sizes.get(instance_id, 0) + sum(len(n.run) for n, _ in new)
        if size > capacity_blocks:
            self._evict(instance_id, capacity_blocks)

    def matches(self, keys: Sequence[int]) -> dict[int, int]:
        """Instance -> leading ``keys`` it holds (instances holding none are absent)."""
        out: dict[int, int] = {}
        alive, last = -1, 0
        for node, matched in walk(self._root, keys):
            kept = alive & node.full
            if last:  # those that held every key so far but not this run's first
                for i in _bits(alive & ~kept):
                    out[i] = last
            if not kept:
                return out
            alive, last = kept, matched
        if last:
            for i in _bits(alive):
                out[i] = last
        return out

    def _path(self, instance_id: int, keys: Sequence[int]) -> list[tuple[BlockNode, int]]:
        """The nodes covering ``keys`` (created and split so that they cover whole runs, and
        so that the instance holds each either whole or not at all), with their depths."""
        path, node, pos, n = [], self._root, 0, len(keys)
        while pos < n:
            child = node.children.get(keys[pos])
            if child is None:
                child = node.children[keys[pos]] = BlockNode(list(keys[pos:]), node)
            else:
                t = shared_length(child.run, keys, pos)
                if t < len(child.run):
                    self._split(child, pos, t)
                state = child.stamps.get(instance_id)
                if state is not None and state[1]:  # a hole: the evicted head is new again
                    path.append((child, pos))
                    pos += state[1]
                    child = self._split(child, pos - state[1], state[1])
            path.append((child, pos))
            node, pos = child, pos + len(child.run)
        return path

    def _split(self, node: BlockNode, depth: int, t: int) -> BlockNode:
        """Cut ``node`` (its first key at ``depth``) after ``t`` keys; each instance's group
        is cut with it (the lower part's at depth + t, so it stays right after the upper
        part in the LRU). Returns the lower part."""
        lower = hang_below(node, t, BlockNode(node.run[t:], node))
        for iid, ((tick, phase, _), offset) in list(node.stamps.items()):
            if offset >= t:  # the instance holds none of the upper part
                del node.stamps[iid]
            self._set(iid, lower, (tick, phase, depth + t), max(0, offset - t))
        return lower

    def _set(self, instance_id: int, node: BlockNode, order: Order, offset: int) -> None:
        """The instance's group on ``node``: keys from ``offset`` on, at ``order``."""
        node.stamps[instance_id] = (order, offset)
        bit = 1 << instance_id
        node.full = node.full | bit if offset == 0 else node.full & ~bit
        heap = self._heaps.setdefault(instance_id, [])
        heapq.heappush(heap, (*order, next(self._seq), node))
        if len(heap) > 2 * self._sizes.get(instance_id, 0) + 1024:  # mostly stale: keep the live entries
            heap[:] = [e for e in heap if self._live(instance_id, e)]
            heapq.heapify(heap)

    @staticmethod
    def _live(instance_id: int, entry: tuple) -> bool:
        """Whether a heap entry is the instance's current group on an attached node."""
        node = entry[4]
        state = node.stamps.get(instance_id)
        return node.parent is not None and state is not None and state[0] == entry[:3]

    def _evict(self, instance_id: int, capacity_blocks: int) -> None:
        heap = self._heaps[instance_id]
        while self._sizes[instance_id] > capacity_blocks and heap:
            entry = heapq.heappop(heap)
            if not self._live(instance_id, entry):
                continue
            node = entry[4]
            order, offset = node.stamps[instance_id]
            gone = min(len(node.run) - offset, self._sizes[instance_id] - capacity_blocks)
            self._sizes[instance_id] -= gone
            if offset + gone < len(node.run):  # its group's first keys go; the rest stays oldest
                self._set(instance_id, node, order, offset + gone)
                continue
            del node.stamps[instance_id]
            node.full &= ~(1 << instance_id)
            self._prune(node)

    def _prune(self, node: BlockNode) -> None:
        """Detach ``node`` and its ancestors while they are held by none and have no child."""
        while node.parent is not None and not node.stamps and not node.children:
            parent = node.parent
            del parent.children[node.run[0]]
            node.parent = None
            node = parent
