"""vLLM v1 prefix caching in the engine model: the cache's own rules (table-driven on a few
blocks), then whole runs: hits shorten prefills, at least one token is always computed,
memory is conserved, the closed-form advance stays exact, and turning it off changes nothing
for requests without prefix identity."""

from dataclasses import replace

import numpy as np
import pytest

from baton.core.prefix import block_keys, reuse_offered
from baton.core.request import Request
from baton.sim import ClusterSpec, EngineConfig
from baton.engine_model.prefix_cache import PrefixCache
from baton.workload.sessions import SessionsSpec, generate_sessions
from tests.sim.helpers import assert_all_ended, assert_drained, run, tiny_perf, workload


def test_freed_blocks_join_the_queue_tail_last_block_first_and_leave_from_the_head():
    cache = PrefixCache(4)
    cache.allocate(2)
    assert cache.register(0, [11, 12]) == 2
    assert cache.release(0, 2, [11, 12], 2) == 2
    assert cache.cached_keys() == [12, 11] and cache.free_blocks() == 4  # its last block goes first
    cache.allocate(3)  # 2 never-used blocks, then the head of the cached ones
    assert cache.cached_keys() == [11] and cache.hit_blocks([11, 12], 2) == 1


def test_a_shared_block_is_freed_when_its_last_holder_lets_go():
    cache = PrefixCache(4)
    cache.allocate(1)
    cache.register(0, [7])
    assert cache.take_hits(1, [7]) == 0  # held by request 0: no new physical block
    assert cache.active == {7: 2}
    assert cache.release(0, 1, [7], 1) == 0 and cache.active == {7: 1}
    assert cache.release(1, 1, [7], 1) == 1 and cache.cached_keys() == [7]
    assert cache.take_hits(2, [7]) == 1 and cache.free_blocks() == 3  # a free cached hit leaves the queue


def test_block_keys_chain_and_map_coarse_ids_onto_engine_blocks():
    a = Request(0, 0.0, 1024, 1, (5, 6), 512)
    b = Request(1, 0.0, 1024, 1, (5, 7), 512)
    ka, kb = block_keys(a, 16), block_keys(b, 16)
    assert len(ka) == 64 and ka[:32] == kb[:32] and ka[32] != kb[32]
    assert len(set(ka)) == 64  # every sub-block of a 512-token id is its own key
    c = Request(2, 0.0, 1024, 1, (9, 6), 512)
    assert block_keys(c, 16)[32] != ka[32]  # same second id, different prefix: a different key


def _repeat(prompt_tokens: int, gap_s: float = 5.0, extra: int = 0) -> list[Request]:
    ids = tuple(range(-(-(prompt_tokens + extra) // 16)))
    return [Request(0, 0.0, prompt_tokens, 4, ids, 16), Request(1, gap_s, prompt_tokens + extra, 4, ids, 16)]


def _colocated(caching: bool = True, kv_tokens: int = 40_000) -> dict:
    return dict(cluster=ClusterSpec(prefill=0, decode=0, mixed=1, engine=EngineConfig(
        512, 32, 16, enable_prefix_caching=caching)), perf=tiny_perf(kv_tokens), policy="colocated")


@pytest.mark.parametrize("prompt,hit", [(2000, 1984), (2008, 2000), (16, 0), (17, 16)])
def test_a_repeated_prompt_hits_all_its_full_blocks_but_the_last_token(prompt, hit):
    sim, result = run(_repeat(prompt), **_colocated())
    stats = sim.engines[0].cache.stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 2 * prompt, hit)
    first, second = result.records
    assert second.prefill_s < first.prefill_s or hit == 0
    assert result.summary(__import__("baton.metrics", fromlist=["SLO"]).SLO())["prefix_cache_hit_rate"] == \
        pytest.approx(hit / (2 * prompt))
    assert_drained(sim)


def test_a_hit_saves_the_prefill_compute_of_the_cached_tokens():
    perf = tiny_perf(40_000)
    sim, result = run(_repeat(2000, extra=500), **_colocated())
    cached = result.records[1].prefill_s
    _, fresh = run([Request(0, 0.0, 500, 4)], **_colocated())
    # the 500 new tokens attend to 2,000 cached ones: more than a fresh 500-token prefill,
    # far less than 2,500 fresh tokens
    alone = fresh.records[0].prefill_s
    assert alone * (1 - 1e-9) <= cached < 0.5 * perf.prefill_time_s(2500, 512)


def test_sessions_end_with_memory_conserved_and_closed_form_exact_under_preemption():
    reqs = generate_sessions(SessionsSpec(sessions=25, session_rate=4.0, system_tokens=600, think_s=0.5,
                                          output_median=80, tpot_s=0.005, max_context=3000), np.random.default_rng(3))
    cluster = ClusterSpec(prefill=0, decode=0, mixed=2, engine=EngineConfig(512, 32, 16))
    out = {}
    for closed_form in (True, False):
        sim, result = run(reqs, policy="least-loaded", cluster=cluster, perf=tiny_perf(6000), closed_form=closed_form)
        assert_all_ended(sim, result, len(reqs))
        assert_drained(sim)
        out[closed_form] = result
    assert sum(r.preemptions for r in out[True].records) > 0  # memory pressure with a cache
    a, b = out[True], out[False]
    assert all(r.finished for r in a.records)
    np.testing.assert_allclose([(r.req_id, r.ttft_s, r.e2e_s, r.preemptions) for r in a.records],
                               [(r.req_id, r.ttft_s, r.e2e_s, r.preemptions) for r in b.records], rtol=1e-9)
    hits = sum(s.hits for s in a.prefix_cache.values())
    assert hits > 0 and hits == sum(s.hits for s in b.prefix_cache.values())


def test_pd_prefills_hit_on_the_prefill_instance_and_the_decode_side_takes_the_whole_kv():
    reqs = generate_sessions(SessionsSpec(sessions=20, session_rate=2.0, think_s=1.0), np.random.default_rng(1))
    sim, result = run(reqs, policy="least-loaded", perf=tiny_perf(200_000),
                      cluster=ClusterSpec(prefill=1, decode=1, engine=EngineConfig(2048, 64, 16), nic_gbps=10))
    assert_all_ended(sim, result, len(reqs))
    assert_drained(sim)
    prefill, decode = result.prefix_cache[0], result.prefix_cache[1]
    assert prefill.hits > 0.5 * prefill.queries and decode.queries == 0  # decodes never look up


def test_without_prefix_ids_caching_changes_nothing():
    reqs = workload(4, n=80)
    with_ids = [replace(r, prefix_ids=()) for r in reqs]
    runs = [run(with_ids, cluster=ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 32, 16,
                                                                                       enable_prefix_caching=on)))[1]
            for on in (True, False)]
    assert [(r.ttft_s, r.e2e_s) for r in runs[0].records] == [(r.ttft_s, r.e2e_s) for r in runs[1].records]
    stats = runs[0].prefix_cache.values()  # still counted as vLLM counts them: queried, never hit
    assert sum(s.queries for s in stats) >= sum(r.prompt_tokens for r in with_ids) and sum(s.hits for s in stats) == 0


def test_reuse_offered_counts_leading_blocks_seen_before():
    reqs = _repeat(160)  # 10 blocks, then the same 10
    assert reuse_offered(reqs) == pytest.approx(0.5)
    assert reuse_offered(reqs, capacity_blocks=5) == 0.0  # forgotten before they come back
    assert np.isnan(reuse_offered([Request(0, 0.0, 100, 1)]))


def test_a_block_computed_twice_stays_private_and_the_blocks_after_it_are_still_cached():
    cache = PrefixCache(10)
    cache.allocate(2)
    cache.register(0, [1, 2])          # request 0 computed blocks 1, 2
    cache.allocate(3)
    assert cache.register(1, [1, 2, 3]) == 1  # request 1 computed them too (at once), then 3
    assert cache.holds(1) == 1 and cache.active == {1: 1, 2: 1, 3: 1}
    assert cache.release(1, 3, [1, 2, 3], 3) == 3  # its two copies and block 3: all its own
    assert cache.cached_keys() == [3] and cache.free_blocks() == 8
    assert cache.hit_blocks([1, 2, 3], 3) == 3  # 1 and 2 held by request 0, 3 free and cached


def test_concurrent_requests_with_one_prefix_cache_their_own_suffixes():
    # two requests with one 1,008-token prefix are admitted in the same iteration (both
    # queued behind a long prefill): both compute it, and each one's own blocks are still
    # cached, so each one's next turn hits its whole first turn (1,504 tokens)
    shared = tuple(range(63))
    reqs = [Request(0, 0.0, 3000, 2),
            Request(1, 0.01, 1500, 4, shared + tuple(range(100, 132)), 16),
            Request(2, 0.02, 1500, 4, shared + tuple(range(200, 232)), 16),
            Request(3, 5.0, 1600, 4, shared + tuple(range(100, 132)) + (999,) * 7, 16),
            Request(4, 6.0, 1600, 4, shared + tuple(range(200, 232)) + (998,) * 7, 16)]
    setup = _colocated()  # a token budget that admits both first turns in one iteration
    setup["cluster"] = replace(setup["cluster"], engine=replace(setup["cluster"].engine, max_num_batched_tokens=4096))
    sim, result = run(reqs, **setup)
    assert sim.engines[0].cache.stats.hits == 2 * 1504
    assert_drained(sim)
