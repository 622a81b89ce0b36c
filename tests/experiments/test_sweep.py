"""Sweep points are seeded simulations: every executor gives the same numbers."""

import pytest

from baton.experiments import Experiment, WorkloadConfig, max_sustainable_rate, run_sweep
from baton.sim import ClusterSpec
from baton.workload import SyntheticSpec


@pytest.mark.parametrize("rates,att,expected", [
    ([1, 2, 3], [1.0, 0.95, 0.5], 2.0 + 0.05 / 0.45),
    ([1, 2, 3], [1.0, 1.0, 0.9], 3.0),
    ([1, 2, 3], [0.8, 0.95, 1.0], None),
    ([1, 2], [0.9, 0.1], 1.0),
    ([], [], None),
])
def test_max_sustainable_rate(rates, att, expected):
    got = max_sustainable_rate(rates, att, 0.9)
    assert got == (pytest.approx(expected) if expected is not None else None)


def small() -> Experiment:
    return Experiment(cluster=ClusterSpec(prefill=1, decode=2),
                      workload=WorkloadConfig(synthetic=SyntheticSpec(requests=50, rate_rps=5.0,
                                                                      arrival="gamma", cv=2.0)), seed=5)


POLICIES = {"rr": "round-robin", "p2": "power-of-two"}


def same(a, b) -> bool:
    """Exact equality, NaN equal to NaN (summaries hold NaN where nothing was measured)."""
    return repr(a) == repr(b)


def test_processes_equal_serial():
    a = run_sweep(small(), POLICIES, [3.0, 9.0], executor="serial")
    b = run_sweep(small(), POLICIES, [9.0, 3.0], executor="processes", workers=2)
    assert same(a.points, b.points) and a.rates_rps == b.rates_rps == [3.0, 9.0]
    assert a.points["rr"][0] != a.points["rr"][1]


def test_ray_equals_serial():
    ray = pytest.importorskip("ray")
    try:
        a = run_sweep(small(), POLICIES, [3.0, 9.0], executor="serial")
        b = run_sweep(small(), POLICIES, [3.0, 9.0], executor="ray")
    finally:
        ray.shutdown()
    assert same(a.points, b.points)
