"""Which instances hold which prefix blocks: the index a prefix-aware router matches a
prompt's block keys against (llm-d's KV-block index: block key -> the pods holding it).

Keys are chained (a key names its whole prefix: ``core/prefix.py``), so an instance's match
for a prompt is the run of the prompt's leading keys it holds. ``matches`` walks the keys
once for all instances together, intersecting the holder sets, and stops when no instance
is left: its cost grows with the longest match, not with the number of instances.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_NOBODY: frozenset[int] = frozenset()


class PrefixIndex:
    """Block key -> instances holding it, with a count per instance."""

    def __init__(self) -> None:
        self.owners: dict[int, set[int]] = {}
        self.counts: dict[int, int] = {}  # instance -> keys it holds

    def add(self, instance_id: int, keys: Iterable[int]) -> None:
        owners, added = self.owners, 0
        for k in keys:
            holders = owners.get(k)
            if holders is None:
                owners[k] = {instance_id}
                added += 1
            elif instance_id not in holders:
                holders.add(instance_id)
                added += 1
        self.counts[instance_id] = self.counts.get(instance_id, 0) + added

    def remove(self, instance_id: int, keys: Iterable[int]) -> None:
        owners, removed = self.owners, 0
        for k in keys:
            holders = owners.get(k)
            if holders is not None and instance_id in holders:
                holders.discard(instance_id)
                removed += 1
                if not holders:
                    del owners[k]
        self.counts[instance_id] = self.counts.get(instance_id, 0) - removed

    def clear(self, instance_id: int) -> None:
        """Forget everything an instance holds (its engine cleared its cache, or its
        events can no longer be trusted)."""
        for k in [k for k, holders in self.owners.items() if instance_id in holders]:
            self.remove(instance_id, (k,))
        self.counts[instance_id] = 0

    def holds(self, instance_id: int, key: int) -> bool:
        return instance_id in self.owners.get(key, _NOBODY)

    def size(self, instance_id: int) -> int:
        """Keys the instance holds."""
        return self.counts.get(instance_id, 0)

    def matches(self, keys: Sequence[int]) -> dict[int, int]:
        """Instance -> how many leading ``keys`` it holds (instances holding none are absent)."""
        out: dict[int, int] = {}
        if not keys:
            return out
        alive = set(self.owners.get(keys[0], _NOBODY))
        j = 1
        while alive and j < len(keys):
            nxt = alive.intersection(self.owners.get(keys[j], _NOBODY))
            if len(nxt) < len(alive):
                for i in alive.difference(nxt):
                    out[i] = j
            alive = nxt
            j += 1
        for i in alive:
            out[i] = j
        return out
