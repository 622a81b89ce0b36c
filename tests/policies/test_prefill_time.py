"""Prefill time as policies predict it (policies/prefill_time.py): the hit-aware queue
pricing against hand-built queues."""

import numpy as np
import pytest

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.perf.fitted import FittedModel
from baton.policies.prefill_time import HitAwarePredictor, PrefillPredictor

# 5 ms + 10 us per prefill token
PERF = FittedModel(np.array([5e-3, 10e-6, 0.0, 5e-4, 1e-7, 0.0]), kv_bytes_per_token=100_000,
                   kv_capacity_tokens=1_000_000)


def queues(*lengths_per_instance):
    """A view of prefill instances with the given queued prompts (req ids 10 x i + j)."""
    instances, states = {}, {}
    for i, lengths in enumerate(lengths_per_instance):
        inst = InstanceState(i, Role.PREFILL, kv_blocks_total=10_000, block_size_tokens=16)
        for j, n in enumerate(lengths):
            inst.queue_prefill(10 * i + j, n)
            states[10 * i + j] = RequestState(Request(10 * i + j, 0.0, n, 10), prefill_instance=i)
        instances[i] = inst
    return ClusterView(instances, states)


CASES = [
    # queued prompts per instance, expected hits (instance, req, tokens), tokens the queue costs per instance
    ("no hit expected: the whole queue", [[8000, 2000]], [], [[8000, 2000]]),
    ("a hit takes its tokens off", [[8000, 2000]], [(0, 0, 7000)], [[1000, 2000]]),
    ("a hit of the whole prompt still costs one token", [[800]], [(0, 0, 800)], [[1]]),
    ("a hit recorded on another instance counts nowhere else", [[8000], [8000]], [(1, 0, 7000)],
     [[8000], [8000]]),
    ("hits on two instances", [[4000, 4000], [3000]], [(0, 1, 4000), (1, 10, 1000)], [[4000, 1], [2000]]),
]


@pytest.mark.parametrize("name,lengths,hits,costs", CASES, ids=[c[0] for c in CASES])
def test_queued_prompts_cost_their_uncached_tokens(name, lengths, hits, costs):
    view, plain, aware = queues(*lengths), PrefillPredictor(PERF), HitAwarePredictor(PERF)
    for instance, rid, tokens in hits:
        aware.expect(instance, rid, tokens)
    ids = list(range(len(lengths)))
    for i in ids:
        want = sum(plain.pt(n) for n in costs[i])  # the quadratic is a sum over prompts
        assert aware.delay(view, i) == pytest.approx(want, rel=1e-9)
        assert [aware.queued_tokens(view, i, 10 * i + j, n) for j, n in enumerate(lengths[i])] == costs[i]
    assert aware.delays(view, ids) == pytest.approx([aware.delay(view, i) for i in ids], rel=1e-12)
    if not hits:
        assert aware.delays(view, ids).tolist() == plain.delays(view, ids).tolist()


def test_a_started_prompt_is_not_discounted_and_a_moved_one_loses_its_expected_hit():
    view, aware = queues([8000, 2000]), HitAwarePredictor(PERF)
    aware.expect(0, 0, 7000)
    aware.expect(0, 1, 1000)
    inst = view.instance(0)
    inst.progress_prefill(0, 7000)  # admitted from its cached prefix: the booking already shrank
    assert aware.delay(view, 0) == pytest.approx(aware.pt(1000) + aware.pt(1000))
    inst.drop_prefill(1)  # re-planned elsewhere: its expectation goes
    assert aware.delay(view, 0) == pytest.approx(aware.pt(1000))
    assert aware.hits == {0: {0: 7000}}
    inst.queue_prefill(1, 2000)  # back again, with no new expectation: the whole prompt
    assert aware.delay(view, 0) == pytest.approx(aware.pt(1000) + aware.pt(2000))
    inst.drop_prefill(0)  # preempted: booked whole again, and its cached prefix may hit again
    inst.queue_prefill(0, 8000)
    assert aware.delay(view, 0) == pytest.approx(aware.pt(1000) + aware.pt(2000))


def test_no_expectation_is_kept_for_an_uncached_placement():
    aware = HitAwarePredictor(PERF)
    aware.expect(0, 5, 0)
    assert aware.hits == {}
