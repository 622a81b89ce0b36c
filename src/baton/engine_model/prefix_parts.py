"""The pieces ``prefix_cache.PrefixCache`` is built from: its counters, its listener (vLLM's
KV events), the radix tree's node (a run of chained keys in one state) and the free queue's
two kinds of entry, and two helpers over runs of block indices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

GHOST = -1  # a node's ``ref`` when its keys are not cached (a path to cached runs below)


@dataclass(slots=True)
class CacheStats:
    """vLLM's prefix-cache counters: prompt tokens looked up and found (``queries`` and
    ``hits``, as ``vllm:prefix_cache_queries`` / ``_hits``), and requests looked up."""

    requests: int = 0
    queries: int = 0
    hits: int = 0


class CacheListener(Protocol):
    """Told when blocks become cached and when cached blocks are evicted (vLLM's KV events:
    BlockStored, BlockRemoved)."""

    def stored(self, req_id: Any, first_index: int, keys: Sequence[int]) -> None: ...

    def removed(self, keys: Sequence[int]) -> None: ...

    def flush(self) -> None: ...


class Node:
    """A run of chained keys in one state: ``ref`` > 0 held by that many requests, 0 free
    (in ``entry``), ``GHOST`` not cached; ``owner`` the request that registered it while
    it alone holds it (so its next blocks may extend the run)."""

    __slots__ = ("run", "parent", "children", "ref", "entry", "owner")

    def __init__(self, run: list[int], parent: Node | None, ref: int) -> None:
        self.run, self.parent, self.ref = run, parent, ref
        self.children: dict[int, Node] = {}
        self.entry: FreeRun | None = None
        self.owner: Any = None


class FreeRun:
    """A free-queue entry: ``count`` keys of a chain, from the end of ``bottom`` upwards."""

    __slots__ = ("bottom", "count")

    def __init__(self, bottom: Node, count: int) -> None:
        self.bottom, self.count = bottom, count


class AnonRun:
    """A free-queue entry of ``count`` blocks that hold no key."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


def contiguous(nodes: list[tuple[Node, int]]) -> list[list[tuple[Node, int]]]:
    """Nodes (with their first index) in chain order, grouped where each starts where the
    last ended."""
    groups: list[list[tuple[Node, int]]] = []
    end = -1
    for node, pos in nodes:
        if pos == end:
            groups[-1].append((node, pos))
        else:
            groups.append([(node, pos)])
        end = pos + len(node.run)
    return groups


def add_run(runs: list[list[int]], lo: int, hi: int) -> None:
    """Add the index range [lo, hi) to ``runs`` (``[first, count]`` in order), merged with
    the last where they touch."""
    if hi <= lo:
        return
    if runs and runs[-1][0] + runs[-1][1] == lo:
        runs[-1][1] += hi - lo
    else:
        runs.append([lo, hi - lo])
