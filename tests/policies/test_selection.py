"""The column selections the policies share: ties and empty candidate lists."""

from __future__ import annotations

import numpy as np
import pytest

from baton.policies.selection import argmax_of, argmin_of


@pytest.mark.parametrize("ids,scores,want", [
    ([0, 1, 2], [0.1, 0.9, 0.3], 1),
    ([5, 2, 9], [0.7, 0.7, 0.1], 2),  # a tie goes to the lowest id, not the first listed
    ([9, 4, 7], [1.0, 0.5, 1.0], 7),
    ([3], [0.0], 3),
    ([], [], None),
])
def test_argmax_of_breaks_ties_by_lowest_id(ids, scores, want):
    assert argmax_of(ids, np.array(scores, dtype=float)) == want


@pytest.mark.parametrize("ids,keys,want", [
    ([0, 1, 2], [3, 1, 1], 1),  # the first of equals, as argmin's
    ([4, 8], [2.5, 0.5], 8),
    ([], [], None),
])
def test_argmin_of_takes_the_first_smallest(ids, keys, want):
    assert argmin_of(ids, np.array(keys, dtype=float)) == want
