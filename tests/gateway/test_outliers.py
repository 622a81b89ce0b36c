"""Outlier ejection (gateway.outliers), on hand-built leg outcomes: no servers, no clock."""

from __future__ import annotations

import pytest

from baton.gateway.outliers import OutlierDetector, OutlierSettings


def detector(n: int = 4, veto: set[int] | None = None, **settings) -> OutlierDetector:
    d = OutlierDetector(OutlierSettings(**settings), lambda iid: iid not in (veto or set()))
    for iid in range(n):
        d.add(iid)
    return d


@pytest.mark.parametrize("outcomes,ejected", [
    ("xxxxx", True),       # five errors in a row
    ("xxxx", False),
    ("xxxxoxxxx", False),  # a success ends the run
    ("oxxxxx", True),
])
def test_consecutive_errors_eject(outcomes, ejected):
    d = detector()
    results = [d.failure(0, 0.0) if c == "x" else d.success(0) for c in outcomes]
    assert d.is_ejected(0) is ejected
    assert (True in results) is ejected


def test_ejection_time_grows_with_each_ejection_and_is_capped():
    d = detector(base_ejection_s=30, max_ejection_s=70, consecutive_errors=1)
    now, lengths = 0.0, []
    for _ in range(4):
        assert d.failure(0, now)
        lengths.append(d.ejection_s(0, now))
        now += lengths[-1]
        assert d.sweep(now).returned == [0]
    assert lengths == [30, 60, 70, 70]


def test_healthy_intervals_earn_back_the_multiplier():
    d = detector(base_ejection_s=10, consecutive_errors=1)
    d.failure(0, 0.0)
    d.sweep(10.0)                      # back in
    d.failure(0, 10.0)
    assert d.ejection_s(0, 10.0) == 20  # second ejection: twice as long
    d.sweep(30.0)
    for t in (40.0, 50.0):              # two intervals without an error
        d.sweep(t)
    d.failure(0, 60.0)
    assert d.ejection_s(0, 60.0) == 10  # the multiplier is back to one


@pytest.mark.parametrize("n,percent,out", [
    (4, 50, 2),   # half of four
    (4, 10, 1),   # below one engine: one may always be out
    (3, 50, 1),
])
def test_max_ejection_percent_keeps_engines_in(n, percent, out):
    d = detector(n, consecutive_errors=1, max_ejection_percent=percent)
    for iid in range(n):
        d.failure(iid, 0.0)
    assert sum(d.is_ejected(i) for i in range(n)) == out


def test_the_caller_can_veto_an_ejection():
    d = detector(veto={1}, consecutive_errors=1)
    assert d.failure(0, 0.0) and not d.failure(1, 0.0)
    assert not d.is_ejected(1)


def test_disabled_ejects_nothing():
    d = detector(enabled=False, consecutive_errors=1)
    assert not d.failure(0, 0.0)


def volume(d: OutlierDetector, iid: int, ok: int, errors: int) -> None:
    for _ in range(ok):
        d.success(iid)
    for _ in range(errors):  # spread so that no run of errors is long enough to eject
        d.failure(iid, 0.0)
        d.success(iid)
        d.hosts[iid].ok -= 1


def test_success_rate_ejects_an_engine_far_below_the_others():
    d = detector(6, consecutive_errors=10**6)
    for iid in range(5):
        volume(d, iid, 200, 2)
    volume(d, 5, 150, 52)              # 74 % against 99 %
    sweep = d.sweep(1.0)
    assert sweep.ejected == [(5, "success_rate")]


@pytest.mark.parametrize("hosts,requests,ejected", [
    (4, 200, []),                      # too few engines for statistics (Envoy: 5)
    (6, 20, []),                       # too few requests per engine (Envoy: 100)
])
def test_success_rate_needs_hosts_and_volume(hosts, requests, ejected):
    d = detector(hosts, consecutive_errors=10**6, failure_percentage_threshold=100)
    for iid in range(hosts - 1):
        volume(d, iid, requests, 0)
    volume(d, hosts - 1, requests // 2, requests // 2)
    assert d.sweep(1.0).ejected == ejected


def test_failure_percentage_ejects_an_engine_failing_most_legs():
    d = detector(6, consecutive_errors=10**6, success_rate_min_hosts=100)
    for iid in range(5):
        volume(d, iid, 60, 0)
    volume(d, 5, 5, 55)                # 92 % failed
    assert d.sweep(1.0).ejected == [(5, "failure_percentage")]


def test_counts_start_again_each_interval():
    d = detector(6, consecutive_errors=10**6, success_rate_min_hosts=100)
    volume(d, 5, 5, 55)
    d.sweep(1.0)                       # too few engines with volume: nothing, and the counts go
    assert d.hosts[5].ok == d.hosts[5].errors == 0


def test_proven_means_the_last_counted_leg_succeeded():
    d = detector()
    assert not d.proven(0)             # never seen to work
    d.success(0)
    assert d.proven(0)
    d.failure(0, 0.0)
    assert not d.proven(0)

