"""Helpers shared by baseline stages: pick the instance with the smallest key."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def argmin(ids: Sequence[int], key: Callable[[int], float]) -> int | None:
    """The id with the smallest key; ties go to the lowest id (deterministic)."""
    best, best_key = None, None
    for i in ids:
        k = key(i)
        if best_key is None or k < best_key:
            best, best_key = i, k
    return best
