"""``gateway.engine_health``: health failures and outlier ejection never leave a side
(prefill, decode) without an engine while one still answers. Through ``Control``, of which
it is a part."""

import pytest

from baton.protocol.errors import ApiError
from tests.gateway.test_control import make
from tests.gateway.test_live import run_request


def test_an_ejected_engine_comes_back_when_its_side_would_otherwise_have_none():
    """A soak found 503s "no healthy decode instance": one decode engine ejected for failing
    legs (it was overloaded), then the other stopped answering its scrapes. Ejection may
    not take a side's last engine, and a later health failure may not either: the ejected
    one returns at once."""
    control, cluster, clock = make(n_decode=2)
    for _ in range(control.config.outliers.consecutive_errors):
        control.blame(1)
    assert not cluster.healthy(1) and cluster.healthy(2)
    for _ in range(control.config.unhealthy_after_failures):
        control.note_failure(2, "/metrics: no answer")
    assert not cluster.healthy(2)
    assert cluster.healthy(1) and not control.outliers.is_ejected(1)
    assert control.choose_decode(run_request(cluster, clock, 1, tokens=5)) == 1


def test_a_health_failure_leaves_other_sides_ejections_alone():
    control, cluster, clock = make(n_decode=3)
    for _ in range(control.config.outliers.consecutive_errors):
        control.blame(1)
    for _ in range(control.config.unhealthy_after_failures):
        control.note_failure(2, "/metrics: no answer")
    assert control.outliers.is_ejected(1) and not cluster.healthy(1)  # decode 3 still takes work
    assert cluster.healthy(3)


def test_a_request_whose_other_decode_engine_failed_it_may_use_an_ejected_one():
    """Recovery after a stalled stream excludes the engine that stalled; if the only other
    decode engine is ejected (but answers), the request goes there rather than failing."""
    control, cluster, clock = make(n_decode=2)
    for _ in range(control.config.outliers.consecutive_errors):
        control.blame(1)
    state = run_request(cluster, clock, 2, tokens=5)
    assert control.choose_decode(state, exclude=frozenset({2})) == 1
    cluster.set_health(1, False)  # ejected and not answering: nothing is left
    with pytest.raises(ApiError, match="no healthy decode instance"):
        control.choose_decode(state, exclude=frozenset({2}))
