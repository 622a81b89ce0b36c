"""The information model: which view fields are stale, and by how much."""

import pytest

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.core.errors import ConfigError
from baton.core.info import EngineSample, InfoModel, ViewMode, info_from_dict


def _instance(running=3, waiting=1, used=500):
    inst = InstanceState(0, Role.DECODE, kv_blocks_total=1000, block_size_tokens=16)
    inst.running_requests, inst.waiting_requests, inst.kv_blocks_used = running, waiting, used
    inst.recent_token_interval_s = 0.02
    inst.queue_prefill(7, 300)
    inst.add_incoming(8, 160)
    return inst


def test_exact_reads_the_engine_now_and_scraped_reads_the_last_scrape():
    inst = _instance()
    exact = ClusterView({0: inst}, {}, InfoModel(ViewMode.EXACT))
    scraped = ClusterView({0: inst}, {}, InfoModel(ViewMode.SCRAPED))
    # nothing scraped yet: engine metrics look idle, own bookings are there at once
    assert (scraped.running_requests(0), scraped.kv_usage(0)) == (0, 0.0)
    assert scraped.own_requests(0) == exact.own_requests(0) == 2
    assert scraped.incoming_tokens(0) == 160
    inst.set_sample(EngineSample(1.0, 1, 0, 0.1, 0.05))
    inst.running_requests, inst.kv_blocks_used = 9, 900  # the engine moves on after the scrape
    assert (exact.running_requests(0), exact.waiting_requests(0), exact.kv_usage(0)) == (9, 1, 0.9)
    assert (scraped.running_requests(0), scraped.waiting_requests(0), scraped.kv_usage(0)) == (1, 0, 0.1)
    assert scraped.token_interval_s(0) == 0.05 and exact.token_interval_s(0) == 0.02
    assert scraped.token_load(0) == exact.token_load(0) == 300 + 160  # own bookings stay exact


def test_scraped_only_has_no_bookings_and_estimates_from_metrics():
    inst = _instance()
    inst.set_sample(EngineSample(1.0, 4, 2, 0.25, 0.05))
    view = ClusterView({0: inst}, {}, InfoModel(ViewMode.SCRAPED_ONLY))
    assert view.own_requests(0) == 6                     # running + waiting
    assert view.token_load(0) == 0.25 * 1000 * 16        # KV usage x capacity
    assert view.incoming_tokens(0) == 0
    assert view.prefill_load(0) == pytest.approx(2 + 4e-3)


def test_waiting_decodes_are_preempted_requests_queued_where_they_decode():
    inst = _instance()
    preempted = RequestState(Request(7, 0.0, 200, 500))
    preempted.generated_tokens, preempted.decode_instance = 100, 0
    fresh = RequestState(Request(9, 0.0, 200, 500))
    inst.queue_prefill(9, 200)
    view = ClusterView({0: inst}, {7: preempted, 9: fresh})
    assert view.waiting_decodes(0) == [7]


@pytest.mark.parametrize("data, message", [
    ({"mode": "psychic"}, "view.mode"),
    ({"scrape_interval_s": 0}, "scrape_interval_s"),
    ({"delay_s": -1}, "delay_s"),
    ({"interval": 1}, "view.interval"),
    ({"scrape_interval_s": "1s"}, "scrape_interval_s"),
])
def test_bad_view_config_names_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        info_from_dict(data)


def test_view_config_reads():
    assert info_from_dict({"mode": "exact"}) == InfoModel(ViewMode.EXACT)
    assert info_from_dict({"scrape_interval_s": 5, "delay_s": 0.5}) == InfoModel(ViewMode.SCRAPED, 5.0, 0.5)
