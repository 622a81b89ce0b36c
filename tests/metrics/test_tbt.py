import math

import numpy as np

from baton.metrics import GapHistogram


def test_percentiles_within_one_percent():
    rng = np.random.default_rng(0)
    gaps = rng.lognormal(np.log(0.02), 0.8, size=200_000)
    h = GapHistogram()
    h.add(gaps)
    for q in (50, 90, 95, 99, 99.9):
        exact = np.percentile(gaps, q)
        assert abs(h.percentile_s(q) - exact) / exact < 0.01, q


def test_affine_series_with_weights():
    h = GapHistogram()
    h.add_affine(0.01, 0.001, 10, weight=3)
    values = np.repeat(0.01 + 0.001 * np.arange(10), 3)
    assert h.total == 30 and abs(h.sum_s - values.sum()) < 1e-12
    assert abs(h.percentile_s(50) - np.percentile(values, 50)) / np.percentile(values, 50) < 0.06


def test_affine_series_recorded_in_one_bucket_equal_the_vectorised_path():
    """The one-bucket shortcut records exactly what the vectorised path would: same bucket
    counts, totals and maximum (the sum to rounding), for series inside one bucket, across
    edges, below the lowest bucket and decreasing."""
    rng = np.random.default_rng(3)
    cases = [(0.02, 1e-7, 50, 2), (0.02, 1e-4, 50, 1), (1e-6, 1e-7, 5, 1), (0.05, -1e-6, 20, 3),
             (0.0300001, 0.0, 7, 1)]
    cases += [(float(rng.lognormal(-4, 1)), float(rng.normal(0, 1e-5)), int(rng.integers(1, 400)),
               int(rng.integers(1, 9))) for _ in range(300)]
    fast, slow = GapHistogram(), GapHistogram()
    for first, slope, count, weight in cases:
        fast.add_affine(first, slope, count, weight)
        slow.add(first + slope * np.arange(count), weight)
    assert np.array_equal(fast.counts, slow.counts)
    assert fast.total == slow.total and fast.max_s == slow.max_s
    assert fast.sum_s == slow.sum_s or abs(fast.sum_s - slow.sum_s) <= 1e-9 * slow.sum_s


def test_non_finite_gaps_take_the_vectorised_path():
    h = GapHistogram()
    assert h._one_bucket(float("inf"), 1.0) is None and h._one_bucket(0.01, float("nan")) is None
    assert h._one_bucket(0.0100001, 0.0100002) is not None


def test_a_few_gaps_recorded_without_numpy_equal_the_vectorised_record():
    """Lists shorter than 8 take a plain-Python path: the same buckets, count, sum and max
    as the vectorised one, bit for bit (gaps on a bucket edge included)."""
    rng = np.random.default_rng(7)
    few, many = GapHistogram(), GapHistogram()
    edge = many.low_s * math.exp(many.log_growth * 300)  # a bucket edge
    for _ in range(3000):
        gaps = rng.lognormal(-4.0, 1.0, int(rng.integers(1, 8))).tolist()
        if rng.random() < 0.05:
            gaps[0] = edge
        weight = int(rng.integers(1, 40))
        few.add(gaps, weight)
        many.add(np.asarray(gaps), weight)
    assert np.array_equal(few.counts, many.counts)
    assert (few.total, few.sum_s, few.max_s) == (many.total, many.sum_s, many.max_s)
