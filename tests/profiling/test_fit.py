"""A profile's repeat spread (profiling/fit.py): what a fit's MAPE cannot go below."""

import pytest

from baton.profiling.fit import repeat_spread
from baton.profiling.grid import ProfileRow


def decode(batch, ctx, seconds):
    return ProfileRow("decode", 0, 0.0, batch, ctx, seconds, "client")


def test_repeats_of_one_point_are_compared_and_single_points_are_not():
    rows = [
        decode(4, 2048, 0.050), decode(4, 2060, 0.055),  # one point: contexts 0.6% apart, 10% slower
        decode(4, 8192, 0.080), decode(4, 8200, 0.080), decode(4, 8180, 0.120),  # one point, 50% apart
        decode(8, 2048, 0.070),  # measured once: no spread
        decode(4, 4096, 0.060),  # another context for batch 4, measured once
        ProfileRow.prefill(512, 0.030, "engine"), ProfileRow.prefill(512, 0.033, "engine"),
    ]
    spread = repeat_spread(rows)
    assert spread["decode"]["points"] == 2
    assert spread["decode"]["median"] == pytest.approx((0.10 + 0.50) / 2)
    assert spread["decode"]["max"] == pytest.approx(0.50)
    assert spread["prefill"] == {"points": 1, "median": pytest.approx(0.10), "max": pytest.approx(0.10)}
    assert repeat_spread([decode(4, 2048, 0.05)]) == {}
