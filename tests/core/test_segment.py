import numpy as np
import pytest

from baton.core.decode_table import DecodeTable
from baton.core.instance import Segment


@pytest.mark.parametrize("iter0,slope", [(0.02, 0.0), (0.015, 1e-6), (0.01, 3e-5)])
def test_iterations_done_matches_cumulative_sum(iter0, slope):
    seg = Segment(5.0, iter0, slope, 500)
    ends = 5.0 + np.cumsum(iter0 + slope * np.arange(500))
    for t in np.linspace(4.9, ends[-1] + 1, 997):
        assert seg.iterations_done(float(t)) == int(np.searchsorted(ends, t, side="right"))


def test_block_growth_matches_brute_force():
    rng = np.random.default_rng(3)
    ctx = rng.integers(1, 300, size=37)
    bs = 16
    residues = (ctx + bs - 1) % bs
    counts = np.bincount(residues, minlength=bs)
    ge = tuple(int(x) for x in np.concatenate([np.cumsum(counts[::-1])[::-1], [0]]))
    seg = Segment(0.0, 0.01, 0.0, 10_000, bs, len(ctx), ge)
    base = (-(-ctx // bs)).sum()
    for k in range(0, 200):
        assert seg.block_growth(k) == (-(-(ctx + k) // bs)).sum() - base


def test_decode_table_add_remove_keeps_aggregates():
    t = DecodeTable(capacity=2)
    for i in range(5):
        t.add(i, 100 + i, 1, 50, i, 7)
    assert t.ctx_sum == sum(100 + i for i in range(5))
    row = t.remove(1)
    assert row["ctx"] == 101 and 1 not in t and len(t) == 4
    t.advance(3)
    assert t.ctx_sum == sum(100 + i + 3 for i in (0, 2, 3, 4))
    assert sorted(t.req_ids()) == [0, 2, 3, 4]
    assert t.get(4, "generated") == 4


def test_listed_iteration_times_set_iterations_done_and_block_growth():
    """A prefill's iterations planned together: times and blocks as listed, per iteration."""
    iters = (0.03, 0.031, 0.0335, 0.012)
    ends = (2.0 + 0.03, 2.0 + 0.03 + 0.031, 2.0 + 0.03 + 0.031 + 0.0335, 2.0 + 0.03 + 0.031 + 0.0335 + 0.012)
    seg = Segment(2.0, iters[0], 0.0, 4, 16, iters_s=iters, ends_s=ends, prefill_blocks=(0, 32, 64, 80))
    for t in np.linspace(1.9, 2.2, 301):
        assert seg.iterations_done(float(t)) == int(np.searchsorted(ends, t, side="right"))
    assert [seg.iterations_done(t) for t in ends] == [1, 2, 3, 4]  # an end event's own time counts
    assert [seg.end_s(k) for k in range(1, 5)] == list(ends) and seg.end_s(0) == 2.0
    assert [seg.iteration_s(k) for k in range(4)] == list(iters)
    assert [seg.block_growth(k) for k in range(4)] == [0, 32, 64, 80]
    seg.max_iters = 2  # cut after the second iteration
    assert seg.iterations_done(10.0) == 2


@pytest.mark.parametrize("listed", [False, True])
def test_a_cut_is_seen_by_a_read_at_the_same_instant(listed):
    """iterations_done keeps its last answer for readers at the same instant; a cut made
    between two such reads must still change the answer."""
    iters = (0.01,) * 6
    ends = tuple(float(e) for e in np.cumsum(iters))
    seg = Segment(0.0, 0.01, 0.0, 6, iters_s=iters if listed else (), ends_s=ends if listed else ())
    assert seg.iterations_done(0.045) == 4 == seg.iterations_done(0.045)
    seg.max_iters = 2
    assert seg.iterations_done(0.045) == 2
