"""Helpers shared by baseline stages: pick the instance with the smallest key."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def argmin(ids: Sequence[int], key: Callable[[int], float]) -> int | None:
    """The id with the smallest key; ties go to the lowest id (deterministic)."""
    best, best_key = None, None
    for i in ids:
        k = key(i)
        if best_key is None or k < best_key:
            best, best_key = i, k
    return best


def argmin_of(ids: Sequence[int], keys: np.ndarray) -> int | None:
    """The id whose key (``keys``, aligned with ``ids``) is smallest; ties go to the
    first, as ``argmin``'s do when ``ids`` are in id order."""
    return int(ids[int(np.argmin(keys))]) if len(ids) else None


def least_token_load(view, ids: Sequence[int]) -> int | None:
    """The instance of ``ids`` with the least token load (``ClusterView.least_token_load``);
    ties go to the first."""
    return view.least_token_load(ids)
