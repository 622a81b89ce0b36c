"""SGLang's approximate radix tree (its router's cache-aware policy), over chained block keys.

The router inserts every prompt it sends into one tree shared by all instances ("tenants"):
each node is a run of keys and records, per instance that was sent it, the time of its last
access (here a counter: one tick per recorded prompt). When an instance's share of the tree
grows beyond its capacity, its least recently accessed *leaves* (nodes no deeper node of
that instance hangs from) are dropped, whole, one after another, until it fits; a parent
left without a child of that instance becomes a leaf in turn. What an instance holds thus
stays a set of whole leading runs, so a prompt matches it by a walk of the tree.

Differences from SGLang, named: the tree is over block keys (SGLang's string tree is over
characters, its token tree over token ids), sizes count blocks, and eviction runs whenever a
record pushes an instance over its capacity (SGLang runs it on a timer,
``eviction_interval``), so runs do not depend on wall-clock timing.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import count, repeat

import numpy as np

from baton.core.prefix_tree import RunNode, shared_length, split, walk


class LruPrefixTree:
    """Prompts sent to instances, with per-instance sizes (blocks) and leaf-LRU eviction."""

    def __init__(self) -> None:
        self._root = RunNode([], {}, {})
        self._tick = 0
        self._sizes: dict[int, int] = {}
        self._leaves: dict[int, list[tuple[int, int, RunNode]]] = {}  # instance -> heap of (tick, seq, node)
        self._seq = count()  # breaks ties between heap entries without comparing nodes

    def size(self, instance_id: int) -> int:
        """Blocks of the tree the instance holds."""
        return self._sizes.get(instance_id, 0)

    def sizes(self, ids: Sequence[int]) -> np.ndarray:
        """``size`` of every instance of ``ids``."""
        return np.fromiter(map(self._sizes.get, ids, repeat(0)), dtype=np.int64, count=len(ids))

    def record(self, instance_id: int, keys: Sequence[int], capacity_blocks: int) -> None:
        """The prompt (its chained keys) was sent to the instance: every node on its path
        is accessed now; then the instance's oldest leaves go until it holds at most
        ``capacity_blocks``."""
        if not keys:
            return
        self._tick += 1
        tick, node, pos, n = self._tick, self._root, 0, len(keys)
        grown = 0
        while pos < n:
            child = node.children.get(keys[pos])
            if child is None:
                child = node.children[keys[pos]] = RunNode(list(keys[pos:]), {}, {}, node)
            else:
                t = shared_length(child.run, keys, pos)
                if t < len(child.run):
                    self._split(child, t)
            if instance_id not in child.stamps:
                grown += len(child.run)
            child.stamps[instance_id] = tick
            node, pos = child, pos + len(child.run)
        self._push(instance_id, node)
        self._sizes[instance_id] = size = self._sizes.get(instance_id, 0) + grown
        if size > capacity_blocks:
            self._evict(instance_id, capacity_blocks)

    def matches(self, keys: Sequence[int]) -> dict[int, int]:
        """Instance -> leading ``keys`` it holds (instances holding none are absent)."""
        out: dict[int, int] = {}
        for node, matched in walk(self._root, keys):
            out.update(dict.fromkeys(node.stamps, matched))
        return out

    def _split(self, node: RunNode, t: int) -> None:
        """Cut ``node`` after ``t`` keys; the lower part keeps its stamps and children and
        becomes a leaf of the instances for which the node was one."""
        lower = split(node, t)
        for iid, tick in lower.stamps.items():
            if self._is_leaf(iid, tick, lower):
                self._push(iid, lower)

    def _push(self, instance_id: int, node: RunNode) -> None:
        heap = self._leaves.setdefault(instance_id, [])
        heapq.heappush(heap, (node.stamps[instance_id], next(self._seq), node))
        if len(heap) > 2 * self._sizes.get(instance_id, 0) + 1024:  # mostly stale: keep the live entries
            heap[:] = [e for e in heap if self._is_leaf(instance_id, e[0], e[2])]
            heapq.heapify(heap)

    @staticmethod
    def _is_leaf(instance_id: int, tick: int, node: RunNode) -> bool:
        """Whether a heap entry is live: the node is attached, was last accessed by the
        instance at ``tick``, and no deeper node of the instance hangs from it."""
        return (node.parent is not None and node.stamps.get(instance_id) == tick
                and not any(instance_id in c.stamps for c in node.children.values()))

    def _evict(self, instance_id: int, capacity_blocks: int) -> None:
        heap = self._leaves[instance_id]
        while self._sizes[instance_id] > capacity_blocks and heap:
            tick, _, node = heapq.heappop(heap)
            if not self._is_leaf(instance_id, tick, node):
                continue  # detached, accessed since, or no longer a leaf of the instance
            del node.stamps[instance_id]
            self._sizes[instance_id] -= len(node.run)
            parent = node.parent
            if not node.stamps:  # nobody holds it: neither does anyone its (empty) subtree
                del parent.children[node.run[0]]
                node.parent = None
            if instance_id in parent.stamps and self._is_leaf(instance_id, parent.stamps[instance_id], parent):
                self._push(instance_id, parent)  # (the root, without a parent, never is one)
