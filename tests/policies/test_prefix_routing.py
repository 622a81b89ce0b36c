"""The prefix-aware stages, table-driven on small hand-built views: a prefix source saying
which instance caches which blocks, queues and KV usage set by hand."""

import numpy as np
import pytest

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.core.errors import ConfigError
from baton.core.prefix_index import PrefixIndex
from baton.perf import build
from baton.policies import PolicyContext, build_scheduler

KEYS = tuple(range(100, 110))  # a 10-block prompt


def view_of(specs, cached=None, role=Role.MIXED):
    """specs: (queued prefills, KV blocks used) per instance; ``cached``: instance -> how
    many leading KEYS its engine holds."""
    instances = {}
    for i, (queued, used) in enumerate(specs):
        inst = InstanceState(i, role, kv_blocks_total=1000, block_size_tokens=16)
        for j in range(queued):
            inst.queue_prefill(10_000 + 100 * i + j, 500)
        inst.kv_blocks_used, inst.waiting_requests = used, queued
        instances[i] = inst
    index = PrefixIndex()
    for i, n in (cached or {}).items():
        index.add(i, KEYS[:n])
    return ClusterView(instances, {}, prefix_source=index)


def scheduler(name, seed=0):
    return build_scheduler(name, PolicyContext(np.random.default_rng(seed), build("llama-3.1-8b@a100-80g")))


def request(i=1, keys=KEYS):
    st = RequestState(Request(i, 0.0, 16 * len(keys) + 5, 10))
    st.block_keys = keys
    return st


CASES = [
    # policy, instances (queued, KV used), cached blocks by instance, expected prefill
    ("prefix-precise", [(0, 0), (0, 0)], {1: 8}, 1),
    ("prefix-precise", [(0, 0), (0, 940)], {1: 8}, 1),    # prefix 1.6 + KV 0.06 + queue 1 > 0 + 1 + 1
    ("prefix-precise", [(0, 0), (4, 0)], {1: 8}, 1),      # 1.6 + 1 + 0 > 0 + 1 + 1
    ("prefix-precise", [(0, 0), (4, 0)], {1: 4}, 0),      # 0.8 + 1 + 0 < 2: the queue outweighs the prefix
    ("prefix-precise", [(0, 0), (0, 0)], {}, 0),          # nothing cached: a tie, the lowest id
    ("kv-cost", [(0, 0), (0, 0)], {1: 8}, 1),
    ("kv-cost", [(0, 0), (0, 300)], {1: 8}, 0),           # 300 blocks in use cost more than 8 cached save
    ("kv-cost", [(2, 0), (0, 0)], {0: 10}, 1),            # 1,000 queued tokens (62 blocks) outweigh 10 cached
]


BOUND_CASES = [
    # policy, instances (queued, KV used), cached blocks by instance, expected prefill
    ("prefix-precise", [(0, 390), (0, 1000)], {1: 10}, 0),   # full KV: 2 + 0 + 1 would beat 0 + 0.61 + 1
    ("prefix-precise", [(0, 390), (0, 949)], {1: 10}, 1),    # under the 0.95 ceiling the match still counts
    ("prefix-precise", [(0, 0), (70, 0)], {1: 10}, 0),       # 70 over 0 outstanding: past SGLang's 64 and 1.5x
    ("prefix-precise", [(40, 0), (100, 0)], {1: 10}, 1),     # 60 over the fewest: within the balance bound
    ("prefix-approx", [(0, 390), (0, 1000)], {1: 10}, 0),
    ("prefix-approx", [(0, 0), (70, 0)], {1: 10}, 0),
    ("prefix-approx", [(0, 390), (0, 949)], {1: 10}, 1),
]


@pytest.mark.parametrize("name,specs,cached,want", BOUND_CASES)
def test_a_cached_prefix_does_not_outweigh_a_saturated_instance(name, specs, cached, want):
    """Issue 55 (MEDIUM 5): a full match scores the prefix weight, as much as the load
    scores can take back; an instance with its KV full or past the balance thresholds gets
    no prefix credit, so one popular prefix does not pile onto one engine."""
    sched = scheduler(name)
    view = view_of(specs, cached if name == "prefix-precise" else None)
    if name == "prefix-approx":  # its history: the prompt was sent to instance 1 before
        for i, n in cached.items():
            sched.stages[0].history.record(i, KEYS[:n], 1000)
    assert sched.plan_arrival(view, request()).prefill_instance == want


@pytest.mark.parametrize("name,specs,cached,want", CASES)
def test_engine_cache_policies_blend_prefix_and_load(name, specs, cached, want):
    plan = scheduler(name).plan_arrival(view_of(specs, cached), request())
    assert plan.prefill_instance == want and plan.decode_instance == want  # colocated: decodes there


def test_siblings_follow_a_prediction_until_the_ttl_ends():
    sched, view = scheduler({"name": "p", "stages": [{"stage": "prefix-precise", "predict_ttl_s": 2.0}]}), \
        view_of([(0, 0), (0, 0), (0, 0)])
    view.instance(0).kv_blocks_used = 10  # the first request goes to 1 (more free KV than 0, tie with 2)
    first = sched.plan_arrival(view, request(1)).prefill_instance
    assert first == 1
    view.instance(1).kv_blocks_used = 20  # its KV now counts against it, yet its predicted prefix wins
    assert sched.plan_arrival(view, request(2)).prefill_instance == 1
    view.now_s = 2.5  # the prediction has expired and no event confirmed it
    assert sched.plan_arrival(view, request(3)).prefill_instance == 2


@pytest.mark.parametrize("name,load", [("prefix-approx", "kv"), ("cache-aware", "queue")])
def test_router_history_policies_send_a_shared_prefix_where_they_sent_it(name, load):
    sched, view = scheduler(name), view_of([(0, 0), (0, 0), (0, 0)])
    first = sched.plan_arrival(view, request(0, KEYS[:8] + (900, 901))).prefill_instance
    # now the instance it went to is the busiest by what each policy weighs (KV usage for
    # prefix-approx, outstanding requests for cache-aware): by load alone the next would
    # go elsewhere
    if load == "kv":
        view.instance(first).kv_blocks_used = 150
    else:
        for j in range(5):
            view.instance(first).queue_prefill(60_000 + j, 100)
    placed = [sched.plan_arrival(view, request(i, KEYS[:8] + (900 + i, 901 + i))).prefill_instance
              for i in range(1, 4)]
    assert placed == [first] * 3  # 8 of 10 blocks sent there before
    other = sched.plan_arrival(view, request(9, tuple(range(500, 510)))).prefill_instance
    assert other != first  # no match: load (or the smallest tree) decides


def test_cache_aware_balances_first_then_follows_then_fills():
    sched = scheduler("cache-aware")
    view = view_of([(0, 0), (0, 0)])
    assert sched.plan_arrival(view, request(1)).prefill_instance == 0  # empty trees: the lowest id
    for j in range(100):  # 100 outstanding requests on 0, none on 1: imbalanced (> 64 and > 1.5x)
        view.instance(0).queue_prefill(50_000 + j, 10)
    assert sched.plan_arrival(view, request(2)).prefill_instance == 1  # despite the match on 0
    report = sched.report()
    assert report["cache_aware_balanced"] == 1 and report["cache_aware_filled"] == 1


def test_pd_prefill_by_prefix_and_decode_by_token_load_or_by_a_later_stage():
    view = view_of([(0, 0), (0, 0), (0, 0), (0, 0)], {1: 8}, role=Role.PREFILL)
    view.instance(2).role = view.instance(3).role = Role.DECODE
    view.invalidate_roles()
    view.instance(2).kv_blocks_used = 500
    st = request()
    sched = scheduler("prefix-precise")
    plan = sched.plan_arrival(view, st)
    assert plan.prefill_instance == 1 and plan.decode_instance is None
    assert sched.choose_decode(view, st) in (2, 3)
    composed = scheduler("prefix-precise+sibyl")
    assert composed.plan_arrival(view, request(2)).prefill_instance == 1
    assert composed.stages[0].choose_decode(view, st) is None  # the SIBYL stage binds the decode


@pytest.mark.parametrize("stage,param", [("cache-aware", {"fallback": "random"}), ("prefix-precise", {"prefix_weight": -1}),
                                         ("kv-cost", {"temperature": -0.1}), ("prefix-approx", {"lru_capacity_blocks": 0})])
def test_bad_parameters_are_config_errors_that_name_the_key(stage, param):
    with pytest.raises(ConfigError, match=rf"policy\.stages\[0\]\.{next(iter(param))}: expected"):
        scheduler({"name": "x", "stages": [{"stage": stage, **param}]})


def test_kv_cost_with_a_temperature_samples_and_is_seeded():
    name = {"name": "t", "stages": [{"stage": "kv-cost", "temperature": 1.0}]}
    picks = [scheduler(name, seed).plan_arrival(view_of([(0, 0), (0, 0)], {1: 8}), request()).prefill_instance
             for seed in range(30)]
    assert set(picks) == {0, 1} and picks.count(1) > picks.count(0)
    again = [scheduler(name, seed).plan_arrival(view_of([(0, 0), (0, 0)], {1: 8}), request()).prefill_instance
             for seed in range(30)]
    assert picks == again


def test_the_index_matches_leading_runs_for_all_instances_at_once():
    index = PrefixIndex()
    index.add(0, KEYS[:3])
    index.add(1, KEYS)
    index.add(2, KEYS[1:])  # holds later blocks but not the first: no match
    assert index.matches(KEYS) == {0: 3, 1: 10}
    index.remove(1, KEYS[5:6])
    assert index.matches(KEYS) == {0: 3, 1: 5} and index.size(1) == 9
    index.clear(1)
    assert index.matches(KEYS) == {0: 3} and index.size(1) == 0


def test_the_index_handles_a_thousand_instances_and_their_removals():
    index = PrefixIndex()
    for i in range(0, 1024, 3):
        index.add(i, KEYS[:1 + i % 10])
    found = index.matches(KEYS)
    assert found == {i: 1 + i % 10 for i in range(0, 1024, 3)}
    index.remove(1020, KEYS)
    assert 1020 not in index.matches(KEYS) and index.size(1020) == 0
    index.remove(999, KEYS[5:])  # 999 held 10 keys: now 5
    assert index.matches(KEYS)[999] == 5 and index.size(999) == 5


@pytest.mark.parametrize("fallback,want", [("smallest-tree", 1), ("least-loaded", 2)])
def test_cache_aware_fills_by_its_fallback_when_nothing_matches(fallback, want):
    """Trees of 20, 0 and 5 blocks, 1, 3 and 0 queued requests (not imbalanced), a prompt
    matching nothing: the smallest tree is 1, the fewest requests 2."""
    sched = scheduler({"name": "ca", "stages": [{"stage": "cache-aware", "fallback": fallback}]})
    stage = sched.stages[0]
    stage.history.record(0, tuple(range(200, 220)), 1000)
    stage.history.record(2, tuple(range(300, 305)), 1000)
    view = view_of([(1, 0), (3, 0), (0, 0)])
    assert sched.plan_arrival(view, request(4, tuple(range(600, 610)))).prefill_instance == want
    assert stage.filled == 1


@pytest.mark.parametrize("seed", range(6))
def test_scores_written_where_matched_equal_the_dense_formulas_bit_for_bit(seed):
    """prefix-precise's blend and kv-cost's cost add the prefix term only where an instance
    matched; the dense formulas (the peers' own) must give the same floats everywhere, at
    the default weights and at others."""
    rng = np.random.default_rng(seed)
    specs = [(int(rng.integers(0, 4)), int(rng.integers(0, 1000))) for _ in range(12)]
    cached = {int(i): int(rng.integers(1, 11)) for i in rng.choice(12, size=4, replace=False)}
    view, st = view_of(specs, cached), request()
    ids = view.prefill_ids
    dense_match = np.array([float(cached.get(i, 0)) for i in ids])
    for wp, wk, wq in ((2.0, 1.0, 1.0), (1.5, 0.3, 2.5)):
        stage = scheduler({"name": "p", "stages": [{"stage": "prefix-precise", "prefix_weight": wp,
                                                    "kv_weight": wk, "queue_weight": wq}]}).stages[0]
        queue = np.array([view.own_requests(i) for i in ids], dtype=float)
        qscore = (queue.max() - queue) / (queue.max() - queue.min()) if queue.max() > queue.min() else 1.0
        dense = wp / len(KEYS) * dense_match + wk * (1.0 - view.kv_usages(ids)) + wq * qscore
        want = min(i for i, v in zip(ids, dense) if v == dense.max())
        assert stage.pick_prefill(view, st) == (want, cached.get(want, 0))
    for credit, scale in ((1.0, 1.0), (0.7, 2.0)):
        stage = scheduler({"name": "k", "stages": [{"stage": "kv-cost", "overlap_credit": credit,
                                                    "prefill_load_scale": scale}]}).stages[0]
        prefill = (view.prefill_loads(ids) + st.request.prompt_tokens) / 16
        decode = view.kv_usages(ids) * 1000 + np.ceil(st.request.prompt_tokens / 16)
        dense = scale * np.maximum(prefill - credit * dense_match, 0.0) + decode
        costs, overlaps = stage.costs(view, st, ids)
        assert costs.tobytes() == dense.tobytes() and overlaps == cached
