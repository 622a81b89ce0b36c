"""ARES phases on hand-built decode states, with the oracle estimator so the remaining
lengths are known exactly."""

import numpy as np
import pytest

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.core.decisions import Migrate
from baton.core.request import Phase
from baton.perf import build
from baton.policies import PolicyContext, build_scheduler

PERF = build("llama-3.1-8b@a100-80g")


def ares(**params):
    cfg = {"name": "t", "stages": [{"stage": "ares", "estimator": "oracle", **params}]}
    return build_scheduler(cfg, PolicyContext(np.random.default_rng(0), PERF)).stages[0]


def view_of(instances_spec, capacity_blocks=50_000, link_gbps=25.0):
    """instances_spec: per decode instance, a list of (context tokens, generated, output
    length); links of ``link_gbps`` (ARES's testbed: 25 Gb/s)."""
    instances, states, rid = {}, {}, 0
    for i, reqs in enumerate(instances_spec):
        inst = InstanceState(i, Role.DECODE, capacity_blocks, 16, link_bytes_per_s=link_gbps * 1e9 / 8)
        inst.recent_iteration_s = 0.03
        for ctx, gen, out in reqs:
            rid += 1
            st = RequestState(Request(rid, 0.0, ctx - gen, out))
            st.phase, st.decode_instance, st.generated_tokens = Phase.DECODE, i, gen
            states[rid] = st
            inst.decodes.add(rid, ctx, gen, out, rid, -(-ctx // 16))
        instances[i] = inst
    view = ClusterView(instances, states)
    view.now_s = 10.0
    return view


LONG = (4000, 100, 9000)  # 8,900 tokens still to generate


@pytest.mark.parametrize("spec,expected", [
    # balanced: nothing to gain
    ([[LONG, LONG], [LONG, LONG]], []),
    # one instance holds everything: move one long request to the empty one
    ([[LONG, LONG, LONG], []], [(1, None)]),
    # the heavy request is about to finish (oracle: 5 tokens left): not worth moving
    ([[(30_000, 995, 1000)], []], []),
])
def test_round(spec, expected):
    decisions = ares().tick(view_of(spec))
    assert len(decisions) == len(expected)
    for d in decisions:
        assert isinstance(d, Migrate) and d.target_instance == 1


def test_phase1_classification():
    stage = ares()
    view = view_of([[LONG] * 4, [LONG], [LONG], []])
    ids = np.array(view.decode_ids)
    req_ids, owner, ctx, rem, _ = stage.snapshot(view, ids)
    loads = stage.instance_loads(view, ids, owner, stage.trajectories(ctx, rem))
    over, under = stage.classify(loads)
    assert over.tolist() == [True, False, False, False]
    assert under.tolist() == [False, True, True, True]


def test_trajectory_leaves_when_predicted_to_finish():
    stage = ares(horizon_steps=4, horizon_tokens=200)
    traj = stage.trajectories(np.array([1000.0]), np.array([120.0]))
    assert traj.tolist() == [[1000, 1050, 1100, 0, 0]]


def test_memory_safety_blocks_a_move_that_would_overflow_the_target():
    big = (20_000, 100, 30_000)
    # target capacity 1,500 blocks x 16 x 0.95 headroom = 22,800 tokens: the request will
    # grow to 29,900 tokens, so it does not fit; with 10,000 blocks it does
    stage = ares()
    assert stage.tick(view_of([[big, big], []], capacity_blocks=1_500)) == []
    assert len(stage.tick(view_of([[big, big], []], capacity_blocks=10_000))) == 1


def test_greedy_multiple_moves_and_per_instance_cap():
    spec = [[LONG] * 6, [], []]
    assert len(ares(max_migrations=4, max_per_instance=1).tick(view_of(spec))) == 1
    moves = ares(max_migrations=4, max_per_instance=4).tick(view_of(spec))
    assert len(moves) >= 2 and {m.target_instance for m in moves} == {1, 2}


def test_move_lowers_the_objective():
    stage = ares()
    view = view_of([[LONG, LONG, (2000, 10, 300)], [(500, 10, 60)]])
    ids = np.array(view.decode_ids)
    req_ids, owner, ctx, rem, _ = stage.snapshot(view, ids)
    traj = stage.trajectories(ctx, rem)
    loads = stage.instance_loads(view, ids, owner, traj)
    row, tgt, delta = stage.best_move(loads, traj, np.arange(3), owner, np.array([1]), np.full(2, 1e9),
                                      ctx + rem)
    after = loads.copy()
    after[owner[row]] -= traj[row]
    after[tgt] += traj[row]
    assert delta < 0 and stage.objective(after) - stage.objective(loads) == pytest.approx(delta)


def test_without_prediction_current_load_is_balanced():
    cfg = {"name": "t", "stages": [{"stage": "ares", "estimator": "none"}]}
    stage = build_scheduler(cfg, PolicyContext(np.random.default_rng(0), PERF)).stages[0]
    assert len(stage.tick(view_of([[LONG, LONG, LONG], []]))) == 1
    assert stage.tick(view_of([[LONG], [LONG]])) == []


def _with_waiting(view, instance_id, ctx, gen, out, rid=99):
    """A request preempted on ``instance_id``, waiting in its queue to recompute."""
    st = RequestState(Request(rid, 0.0, ctx - gen, out))
    st.phase, st.decode_instance, st.generated_tokens = Phase.PREFILL, instance_id, gen
    view._requests[rid] = st
    view.instance(instance_id).queue_prefill(rid, ctx)
    return rid


def test_preempted_waiting_requests_count_as_load_but_only_move_when_asked():
    view = view_of([[(4000, 995, 1000)], [LONG], []])  # instance 0's runner ends in 5 tokens
    rid = _with_waiting(view, 0, *LONG)
    ids = np.array(view.decode_ids)
    req_ids, owner, ctx, rem, waiting = ares().snapshot(view, ids)
    assert rid in req_ids.tolist() and waiting[req_ids.tolist().index(rid)]
    assert owner[req_ids.tolist().index(rid)] == 0
    kept = ares().tick(view)
    assert all(d.req_id != rid for d in kept)
    moved = ares(move_preempted=True).tick(view)
    waiting_moves = [d for d in moved if d.req_id == rid]
    assert waiting_moves and waiting_moves[0].mode.value == "recompute" and waiting_moves[0].target_instance == 2


def test_the_migration_cost_is_read_from_the_cluster_link_not_guessed():
    """The same long request on an overloaded instance: worth moving over a fast link,
    not over one so slow that its KV takes longer than its remaining tokens."""
    spec = [[LONG, LONG, LONG], []]
    assert len(ares().tick(view_of(spec, link_gbps=100.0))) == 1
    assert ares().tick(view_of(spec, link_gbps=0.001)) == []
