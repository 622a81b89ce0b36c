"""Helpers shared by the stages: pick the instance with the smallest key or the highest score."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def argmin(ids: Sequence[int], key: Callable[[int], float]) -> int | None:
    """The id with the smallest key; ties go to the first in ``ids`` (the lowest id when
    ``ids`` are in id order, as the view's lists are)."""
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


def argmax_of(ids: Sequence[int], scores: np.ndarray) -> int | None:
    """The id whose score (``scores``, aligned with ``ids``) is highest; ties go to the
    lowest id whatever the order of ``ids`` (deterministic)."""
    if not len(ids):
        return None
    j = int(np.argmax(scores))
    tied = scores == scores[j]
    if np.count_nonzero(tied) == 1:  # the common case: no tie to break
        return int(ids[j])
    return min(ids[j] for j in np.flatnonzero(tied).tolist())
