"""The gateway's in-flight accounting and its reconciliation with scraped metrics."""

import pytest

from baton.core.instance import Role
from baton.core.request import Phase
from baton.gateway.config import EngineSpec
from baton.gateway.live import LiveCluster, ScrapeSample


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def cluster(n_decode=2, blocks=100):
    clock = Clock()
    c = LiveCluster(clock, default_kv_blocks=blocks, block_size=16)
    c.add_engine(EngineSpec("http://p:1", Role.PREFILL, "p0"))
    for i in range(n_decode):
        c.add_engine(EngineSpec(f"http://d:{i}", Role.DECODE, f"d{i}"))
    return c, clock


def run_request(c, clock, decode, prompt=40, tokens=20, early=False):
    st = c.new_request(prompt, tokens)
    c.bind(st, 0, decode if early else None, None)
    assert c.instances[0].prefill_queue_tokens == prompt
    clock.t += 0.1
    c.prefill_done(st)
    c.expect_decode(st, decode)
    assert c.instances[decode].incoming_tokens == prompt
    for _ in range(tokens):
        clock.t += 0.01
        if st.phase is not Phase.DECODE:
            c.start_decode(st)
        c.token(st)
    return st


@pytest.mark.parametrize("early", [False, True])
def test_accounting_tracks_a_request_and_returns_to_zero(early):
    c, clock = cluster()
    st = run_request(c, clock, 1, early=early)
    inst = c.instances[1]
    assert inst.decodes.n == 1 and c.view.generated_tokens(st.req_id) == 20
    assert c.view.context_tokens(st.req_id) == 60 and inst.token_load(clock.t) == 60
    assert inst.kv_blocks_used == 4  # ceil(60 / 16)
    assert inst.recent_iteration_s == pytest.approx(0.01, rel=0.5)
    c.finish(st)
    assert all(v == 0 for v in c.totals().values())
    assert st.phase is Phase.FINISHED


def test_early_binding_books_shadow_load_until_the_prefill_ends():
    c, clock = cluster()
    st = c.new_request(100, 10)
    c.bind(st, 0, 2, None)
    assert c.instances[2].shadow_tokens == 100 and c.instances[2].incoming_tokens == 0
    c.prefill_done(st)
    c.expect_decode(st, 2)
    assert c.instances[2].shadow_tokens == 0 and c.instances[2].incoming_tokens == 100
    c.finish(st, "client_abort")
    assert all(v == 0 for v in c.totals().values()) and st.phase is Phase.REJECTED


def test_a_deflected_prefill_drops_its_early_decode_booking():
    c, clock = cluster()
    st = c.new_request(100, 10)
    c.bind(st, 0, 1, None)  # bound early: decode on d0 (instance 1)
    assert c.instances[1].shadow_tokens == 100
    c.deflect(st, 2, 64)  # the held prefill goes to d1, which will also decode it
    assert c.instances[1].shadow_tokens == 0 and c.instances[0].prefill_queue_tokens == 0
    assert c.instances[2].prefill_queue_tokens == 100
    assert (st.prefill_instance, st.decode_instance, st.chunk_limit_tokens) == (2, 2, 64)
    c.prefill_done(st)
    c.expect_decode(st, 2)
    c.start_decode(st)
    c.finish(st)
    assert all(v == 0 for v in c.totals().values())


def test_leave_decode_and_move_for_a_migration():
    c, clock = cluster()
    st = run_request(c, clock, 1, tokens=5)
    c.leave_decode(st)
    c.expect_decode(st, 2)
    assert c.instances[1].decodes.n == 0 and c.instances[1].kv_blocks_used == 0
    assert c.instances[2].incoming_tokens == 45
    c.start_decode(st)
    c.token(st)
    assert c.instances[2].decodes.get(st.req_id, "generated") == 6
    c.finish(st)
    assert all(v == 0 for v in c.totals().values())


def test_stale_scrape_cannot_hide_new_placements():
    """A scrape says d0 is empty; requests placed since then still count (no herding)."""
    c, clock = cluster(blocks=1000)
    c.record_scrape(1, ScrapeSample(0.0, kv_usage=0.0))
    c.record_scrape(2, ScrapeSample(0.0, kv_usage=0.05))  # 50 blocks of someone else's work
    placed = [run_request(c, clock, 1, prompt=320, tokens=1) for _ in range(3)]
    assert c.instances[1].kv_blocks_used == 3 * 21  # own placements, despite the 0% scrape
    assert c.instances[2].kv_blocks_used == 50  # external load the gateway cannot see itself
    c.record_scrape(1, ScrapeSample(1.0, kv_usage=0.2))  # engine reports more than we placed
    assert c.instances[1].kv_blocks_used == 200
    run_request(c, clock, 1, prompt=320, tokens=1)
    assert c.instances[1].kv_blocks_used == 221  # scrape + what was placed after it
    for st in placed:
        c.finish(st)
    assert c.instances[1].kv_blocks_used == 221 - 63


def test_roles_health_and_removal_change_candidates():
    c, _ = cluster()
    assert c.view.decode_ids == [1, 2]
    c.set_health(1, False)
    assert c.view.decode_ids == [2]
    c.set_health(1, True)
    assert c.set_role(2, Role.PREFILL) and not c.set_role(2, Role.PREFILL)
    assert c.view.decode_ids == [1] and c.view.prefill_ids == [0, 2]
    c.remove_engine(1)
    assert c.view.decode_ids == [] and not c.set_health(1, True)
    assert c.find("d0") is None and c.find("1") is None and c.find("d1") == c.find("2") == 2


def test_prompt_length_corrected_mid_flight_releases_what_was_booked():
    """The gateway estimates text prompts; the engine's count replaces the estimate while
    blocks are booked. Releases must undo the booking, not the corrected length."""
    c, clock = cluster()
    st = c.new_request(6, 5)
    c.bind(st, 0, None, None)
    c.set_prompt_tokens(st, 33)
    c.prefill_done(st)
    c.expect_decode(st, 1)
    c.set_prompt_tokens(st, 40)
    c.start_decode(st)
    c.token(st)
    c.finish(st)
    assert all(v == 0 for v in c.totals().values())


def test_policies_see_engine_metrics_as_scraped_and_own_bookings_exact():
    """The gateway's view is the simulator's ``scraped`` mode, built from the same classes."""
    from baton.core.info import ViewMode
    c, clock = cluster(blocks=1000)
    assert c.view.info.mode is ViewMode.SCRAPED
    c.record_scrape(1, ScrapeSample(0.0, running=5, waiting=2, kv_usage=0.3))
    st = c.new_request(320, 8)
    c.bind(st, 0, 1, None)
    clock.t = 0.5
    assert (c.view.running_requests(1), c.view.waiting_requests(1), c.view.kv_usage(1)) == (5, 2, 0.3)
    assert c.view.running_requests(2) == 0  # never scraped
    assert c.view.prefill_load(0) >= 320    # the gateway's own booking, at once
    c.record_scrape(1, ScrapeSample(1.0, running=1))
    assert c.view.running_requests(1) == 1 and c.view.waiting_requests(1) == 0


def test_instances_carry_the_configured_link_for_policies():
    c = LiveCluster(Clock(), default_kv_blocks=100, block_size=16, link_gbps=25.0)
    iid = c.add_engine(EngineSpec("http://d:1", Role.DECODE, "d"))
    assert c.view.link_bytes_per_s(iid) == c.instances[iid].link_bytes_per_s == 25e9 / 8
