"""A radix tree over chained block keys: which instances were sent which prompts, kept
per prompt rather than per block.

Keys are chained (``core/prefix.py``: a key names its whole prefix), so two prompts share
their first ``t`` keys exactly when their ``t``-th keys are equal, and the shared length of
a prompt and a run of keys is found by comparing last keys and bisecting, not by walking
every key. Each node holds a run of keys and, per instance, a stamp (a float: the latest
time until which the instance is believed to hold the node's whole run). A prompt recorded
on an instance stamps every node on its path; since a prompt covering a node covers every
node above it, an instance's stamp can only fall going down a path, and a node whose
stamps are all stale has a whole subtree of stale stamps.

Recording and matching a prompt cost a walk over its path (one step per branch point,
with a bisection inside a run), not one dictionary operation per block: this is what lets
the predict-on-route entries of the prefix-aware routers stay under the decision-cost
budget (``benchmarks/cache_aware.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence


class RunNode:
    """A run of chained keys, the stamp of each instance holding all of it, its children
    by their first key, and its parent (None once detached from the tree)."""

    __slots__ = ("run", "stamps", "children", "parent")

    def __init__(self, run: list[int], stamps: dict[int, float], children: dict[int, RunNode],
                 parent: RunNode | None = None) -> None:
        self.run, self.stamps, self.children, self.parent = run, stamps, children, parent


def shared_length(run: list[int], keys: Sequence[int], pos: int) -> int:
    """How many leading keys of ``run`` equal ``keys[pos:]`` (the first is known equal):
    chained keys make equality at an offset imply equality before it, so bisect."""
    n = min(len(run), len(keys) - pos)
    if run[n - 1] == keys[pos + n - 1]:
        return n
    lo, hi = 1, n - 1  # run[lo - 1] equal, run[hi] not: the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if run[mid - 1] == keys[pos + mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def split(node: RunNode, t: int) -> RunNode:
    """Cut ``node`` after ``t`` keys; returns the lower part, which keeps the node's stamps
    and children (a prompt covering the node covered both parts)."""
    return hang_below(node, t, RunNode(node.run[t:], dict(node.stamps), {}, node))


def hang_below(node, t: int, lower):
    """The tree moves of cutting ``node`` after ``t`` keys, for any of the trees' node kinds
    (``run``, ``children``, ``parent``): ``lower`` (a fresh node holding ``node.run[t:]``)
    takes over the node's children and becomes its only child. Returns ``lower``."""
    lower.children, lower.parent = node.children, node
    for c in lower.children.values():
        c.parent = lower
    node.run, node.children = node.run[:t], {lower.run[0]: lower}
    return lower


def walk(root: RunNode, keys: Sequence[int]) -> Iterator[tuple[RunNode, int]]:
    """The nodes on a prompt's path from ``root``, each with how many leading ``keys`` the
    path has matched by its end (the last may match only part of its run)."""
    node, pos, n = root, 0, len(keys)
    while pos < n:
        child = node.children.get(keys[pos])
        if child is None:
            return
        t = shared_length(child.run, keys, pos)
        yield child, pos + t
        if t < len(child.run):
            return
        node, pos = child, pos + t


class StampedPrefixTree:
    """Prompts (as chained block keys) recorded on instances with a stamp each; a match
    reports, per instance, the leading blocks of a prompt it holds with a stamp above a
    bound. ``expire`` forgets stamps at or below a bound (lazily: only those of prompts
    recorded with such stamps)."""

    def __init__(self) -> None:
        self._root = RunNode([], {}, {})
        self._recorded: deque[tuple[float, int, tuple[int, ...]]] = deque()  # (stamp, instance, keys)

    def __len__(self) -> int:
        """Prompts recorded and not yet expired."""
        return len(self._recorded)

    def record(self, instance_id: int, keys: Sequence[int], stamp: float) -> None:
        """The instance holds ``keys`` (a prompt's chained keys) until ``stamp``; stamps
        must not decrease from one call to the next (they are times)."""
        if not keys:
            return
        keys = keys if isinstance(keys, tuple) else tuple(keys)
        self._recorded.append((stamp, instance_id, keys))
        node, pos, n = self._root, 0, len(keys)
        while pos < n:
            child = node.children.get(keys[pos])
            if child is None:
                node.children[keys[pos]] = RunNode(list(keys[pos:]), {instance_id: stamp}, {}, node)
                return
            t = shared_length(child.run, keys, pos)
            if t < len(child.run):  # the prompt leaves (or ends inside) the run
                split(child, t)
            child.stamps[instance_id] = stamp
            node, pos = child, pos + t

    def matches(self, keys: Sequence[int], above: float) -> dict[int, int]:
        """Instance -> leading ``keys`` it holds with a stamp above ``above`` (instances
        holding none are absent)."""
        out: dict[int, int] = {}
        for node, matched in walk(self._root, keys):
            for iid, stamp in node.stamps.items():
                if stamp > above:
                    out[iid] = matched
        return out

    def expire(self, upto: float) -> None:
        """Forget the stamps at or below ``upto`` of the prompts recorded with such stamps,
        and the nodes left with none."""
        recorded = self._recorded
        while recorded and recorded[0][0] <= upto:
            _, iid, keys = recorded.popleft()
            self._forget(iid, keys, upto)

    def _forget(self, instance_id: int, keys: tuple[int, ...], upto: float) -> None:
        node, pos, n = self._root, 0, len(keys)
        while pos < n:
            child = node.children.get(keys[pos])
            if child is None:
                return
            if child.stamps.get(instance_id, upto + 1.0) <= upto:
                del child.stamps[instance_id]
            if not child.stamps:  # every stamp below was stale too: drop the subtree
                del node.children[keys[pos]]
                child.parent = None
                return
            node, pos = child, pos + len(child.run)  # a recorded prompt covers whole runs
