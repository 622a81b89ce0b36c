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
