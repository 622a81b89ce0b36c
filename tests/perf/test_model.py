"""The perf model's shared helpers (perf/model.py)."""

import numpy as np
import pytest

from baton.perf import length_cv2


@pytest.mark.parametrize("lengths", [[5], [], [7, 7, 7], [1, 100_000], [0, 0], list(range(1, 300))])
def test_length_cv2_of_integer_lengths_matches_the_float_definition(lengths):
    arr = np.asarray(lengths, dtype=np.float64)
    want = float(arr.var() / arr.mean() ** 2) if arr.size >= 2 and arr.mean() > 0 else 0.0
    assert length_cv2(np.asarray(lengths, dtype=np.int64)) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert length_cv2(lengths) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert length_cv2(arr) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_length_cv2_of_a_large_random_batch():
    ctx = np.random.default_rng(0).integers(1, 1_000_000, size=1024)
    f = ctx.astype(np.float64)
    assert length_cv2(ctx) == pytest.approx(float(f.var() / f.mean() ** 2), rel=1e-12)


@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int64])
def test_length_cv2_does_not_wrap_narrow_or_huge_integers(dtype):
    lengths = np.array([50_000, 60_000, 7], dtype=dtype) if dtype is not np.uint16 else np.array([50_000, 60_000, 7],
                                                                                                  dtype=dtype)
    f = lengths.astype(np.float64)
    assert length_cv2(lengths) == pytest.approx(float(f.var() / f.mean() ** 2), rel=1e-12)
    huge = np.array([3_000_000_000, 1], dtype=np.int64)  # squares past 2**63: the float path
    h = huge.astype(np.float64)
    assert length_cv2(huge) == pytest.approx(float(h.var() / h.mean() ** 2), rel=1e-12)
