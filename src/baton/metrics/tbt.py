"""Token-gap (TBT) distribution over all tokens, as a log-bucket histogram.

Buckets grow by a factor of 1.01, so any reported percentile is within 1% (relative)
of the exact one. Gaps arrive in bulk: an affine series of iteration times weighted by
the number of requests in the batch, so recording costs one vectorised call per segment,
or none when the whole series falls inside one bucket (its counts are then the same; its
sum differs from the vectorised one by rounding only).
"""

from __future__ import annotations

import math

import numpy as np

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
_LISTED_BELOW = 8  # gaps recorded without numpy calls (numpy sums fewer than 8 in order, as Python does)


class GapHistogram:
    """Histogram of token gaps in seconds, from ``low_s`` to ``high_s``."""

    def __init__(self, low_s: float = 1e-5, high_s: float = 1e4, growth: float = 1.01) -> None:
        self.low_s, self.log_growth = low_s, math.log(growth)
        self.bins = int(math.ceil(math.log(high_s / low_s) / self.log_growth)) + 1
        self.counts = np.zeros(self.bins, dtype=np.float64)
        self.total = 0.0
        self.sum_s = 0.0
        self.max_s = 0.0

    def _index(self, gaps_s: np.ndarray) -> np.ndarray:
        idx = np.floor(np.log(np.maximum(gaps_s, self.low_s) / self.low_s) / self.log_growth)
        return np.clip(idx.astype(np.int64), 0, self.bins - 1)

    def add(self, gaps_s: np.ndarray | list[float] | tuple[float, ...], weight: float = 1.0) -> None:
        """Record each gap ``weight`` times."""
        if isinstance(gaps_s, (list, tuple)) and len(gaps_s) < _LISTED_BELOW:
            return self._add_few(gaps_s, weight)
        arr = np.asarray(gaps_s, dtype=np.float64)
        if arr.size == 0 or weight <= 0:
            return
        np.add.at(self.counts, self._index(arr), weight)
        self.total += weight * arr.size
        self.sum_s += weight * float(arr.sum())
        self.max_s = max(self.max_s, float(arr.max()))

    def _add_few(self, gaps_s: list[float] | tuple[float, ...], weight: float) -> None:
        """``add`` for a handful of gaps without numpy calls, with the same result: each
        gap's bucket from ``_one_bucket`` (clear of the edges, where the two logs could
        round apart; else the vectorised pass takes them all) and their sum in order (as
        numpy sums fewer than 8)."""
        if not gaps_s or weight <= 0:
            return
        buckets = [self._bucket_of(g) for g in gaps_s]
        if None in buckets:
            return self.add(np.asarray(gaps_s, dtype=np.float64), weight)
        counts = self.counts
        for b in buckets:
            counts[b] += weight
        self.total += weight * len(gaps_s)
        self.sum_s += weight * float(sum(gaps_s))
        self.max_s = max(self.max_s, max(gaps_s))

    def add_affine(self, first_s: float, slope_s: float, count: int, weight: int) -> None:
        """Record gaps first_s + slope_s*j for j in 0..count-1, each ``weight`` times."""
        if count <= 0 or weight <= 0:
            return
        last_s = first_s + slope_s * (count - 1)
        bucket = self._one_bucket(first_s, last_s)
        if bucket is None:
            self.add(first_s + slope_s * np.arange(count), weight)
            return
        # a segment's gaps usually grow by well under the 1% a bucket spans: one bucket,
        # without a vectorised pass over the series (the simulator's hottest recording)
        self.counts[bucket] += weight * count
        self.total += weight * count
        self.sum_s += weight * (first_s * count + slope_s * (count * (count - 1) / 2))
        self.max_s = max(self.max_s, first_s, last_s)

    def _bucket_of(self, gap_s: float) -> int | None:
        """``_one_bucket(gap_s, gap_s)`` with one logarithm."""
        if not self.low_s < gap_s < math.inf:
            return None
        x = math.log(gap_s / self.low_s) / self.log_growth
        bucket = math.floor(x)
        if bucket >= self.bins - 1 or x - bucket < 1e-9 or bucket + 1 - x < 1e-9:
            return None
        return bucket

    def _one_bucket(self, a_s: float, b_s: float) -> int | None:
        """The bucket holding every value between ``a_s`` and ``b_s`` when both lie inside
        one bucket clear of its edges (so ``_index``'s vectorised log rounds them the same
        way), else None."""
        if not (self.low_s < a_s < math.inf and self.low_s < b_s < math.inf):  # NaN fails too
            return None
        xa = math.log(a_s / self.low_s) / self.log_growth
        xb = math.log(b_s / self.low_s) / self.log_growth
        bucket = math.floor(xa)
        if math.floor(xb) != bucket or bucket >= self.bins - 1:
            return None
        edge = 1e-9
        if min(xa, xb) - bucket < edge or bucket + 1 - max(xa, xb) < edge:
            return None
        return bucket

    def percentile_s(self, q: float) -> float:
        """The q-th percentile (0..100); the bucket's geometric midpoint."""
        if self.total == 0:
            return 0.0
        cum = np.cumsum(self.counts)
        i = int(np.searchsorted(cum, q / 100.0 * self.total, side="left"))
        i = min(i, self.bins - 1)
        return float(min(self.max_s, self.low_s * math.exp((i + 0.5) * self.log_growth)))

    def summary(self) -> dict[str, float]:
        out = {f"p{str(q).rstrip('0').rstrip('.').replace('.', '_')}_tbt_s": self.percentile_s(q)
               for q in PERCENTILES}
        out["mean_tbt_s"] = self.sum_s / self.total if self.total else 0.0
        out["max_tbt_s"] = self.max_s
        return out
