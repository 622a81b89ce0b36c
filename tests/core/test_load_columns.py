"""The columnar load reads against the per-instance ones they replace: every columnar
read during whole simulations (decode segments mid-flight, preemptions, migrations,
role flips, colocated and PD) must equal the scalar reads exactly, and a stale column
(a mutation that did not mark its instance) must be caught."""

import numpy as np
import pytest

from baton.core.instance import InstanceState, Role, Segment
from baton.core.load_columns import LoadColumns
from baton.core.view import ClusterView
from baton.sim import ClusterSpec, EngineConfig
from tests.sim.helpers import run, workload


@pytest.fixture
def checked_reads(monkeypatch):
    """Wrap the view's columnar reads so each one is compared with the scalar reads."""
    reads = {"n": 0}
    pairs = (("token_loads", "token_load"), ("prefill_loads", "prefill_load"),
             ("own_request_counts", "own_requests"), ("kv_usages", "kv_usage"),
             ("token_intervals", "token_interval_s"), ("decode_works", "decode_work"),
             ("running_tokens_of", "running_tokens"))
    for vector, scalar in pairs:
        original = getattr(ClusterView, vector)

        def checked(self, ids, _original=original, _scalar=scalar):
            got = _original(self, ids)
            want = [getattr(self, _scalar)(i) for i in ids]
            assert list(got) == want, (self.now_s, list(got), want)
            reads["n"] += 1
            return got
        monkeypatch.setattr(ClusterView, vector, checked)
    original_moments = ClusterView.prefill_moments

    def moments(self, ids):
        got = original_moments(self, ids)
        assert [tuple(int(c[k]) for c in got) for k in range(len(ids))] == [self.queued_prefill_moments(i) for i in ids]
        reads["n"] += 1
        return got
    monkeypatch.setattr(ClusterView, "prefill_moments", moments)
    original_snapshots = ClusterView.decode_snapshots

    def snapshots(self, ids):
        got = original_snapshots(self, ids)
        parts = [self.decode_snapshot(i) for i in ids]
        for col in range(3):
            want = np.concatenate([p[col] for p in parts]) if parts else np.zeros(0)
            assert got[col].tolist() == want.tolist()
        assert got[3].tolist() == [pos for pos, p in enumerate(parts) for _ in range(p[0].size)]
        reads["n"] += 1
        return got
    monkeypatch.setattr(ClusterView, "decode_snapshots", snapshots)
    original_least, original_at_least = ClusterView.least_token_load, ClusterView.token_loads_at_least

    def least(self, ids):  # the pruned argmin: the first id of the least scalar load
        got = original_least(self, ids)
        loads = [self.token_load(i) for i in ids]
        assert got == (ids[loads.index(min(loads))] if loads else None), (self.now_s, got, loads)
        reads["n"] += 1
        return got

    def at_least(self, ids, tokens):
        got = original_at_least(self, ids, tokens)
        assert got == all(self.token_load(i) >= tokens for i in ids)
        reads["n"] += 1
        return got
    original_fewest = ClusterView.fewest_own_requests

    def fewest(self, ids):
        got = original_fewest(self, ids)
        assert got == min(self.own_requests(i) for i in ids)
        assert all(self.accepts_decodes(i) == (i in self.decode_ids) for i in self._instances)
        reads["n"] += 1
        return got
    monkeypatch.setattr(ClusterView, "least_token_load", least)
    monkeypatch.setattr(ClusterView, "token_loads_at_least", at_least)
    monkeypatch.setattr(ClusterView, "fewest_own_requests", fewest)
    return reads


@pytest.mark.parametrize("policy,cluster", [
    ("least-loaded", ClusterSpec(prefill=1, decode=3, engine=EngineConfig(512, 32, 16), nic_gbps=10)),
    ("colocated", ClusterSpec(prefill=0, decode=0, mixed=3, engine=EngineConfig(512, 32, 16))),
    ("ares", ClusterSpec(prefill=1, decode=3, engine=EngineConfig(512, 32, 16), nic_gbps=10)),
    ("arrow", ClusterSpec(prefill=2, decode=2, engine=EngineConfig(512, 32, 16), nic_gbps=10)),
    ("combined", ClusterSpec(prefill=2, decode=3, engine=EngineConfig(512, 32, 16), nic_gbps=10)),
    ("kairos", ClusterSpec(prefill=1, decode=3, engine=EngineConfig(512, 32, 16), nic_gbps=10)),
    # more candidates than the view's scalar cut-offs (prefill loads above 8 instances, least
    # token load above 32): the vectorised closed form
    ("least-loaded", ClusterSpec(prefill=26, decode=40, engine=EngineConfig(512, 32, 16), nic_gbps=10)),
    # mixed instances above the cut-offs: prefill iterations planned together (listed times)
    ("least-loaded", ClusterSpec(prefill=0, decode=0, mixed=40, engine=EngineConfig(512, 32, 16))),
    # more decode candidates than the pruning cut-off: least load by lower bounds
    ("least-loaded", ClusterSpec(prefill=2, decode=140, engine=EngineConfig(512, 32, 16), nic_gbps=10)),
])
@pytest.mark.parametrize("closed_form", [True, False])
def test_columnar_reads_equal_scalar_reads_in_whole_runs(checked_reads, policy, cluster, closed_form):
    sim, result = run(workload(3, n=80, rate=30.0), policy, cluster=cluster, closed_form=closed_form)
    assert all(r.finished or r.rejected for r in result.records)
    assert checked_reads["n"] > 50  # the reads really happened, mid-segment included


def _instance(iid, ctx_rows=(), segment=None):
    inst = InstanceState(iid, Role.DECODE, 1000, 16)
    for j, ctx in enumerate(ctx_rows):
        inst.decodes.add(100 * iid + j, ctx, 1, 50, j, ctx // 16 + 1)
    inst.set_segment(segment)
    return inst


@pytest.mark.parametrize("now_s", [0.0, 0.0049, 0.005, 0.0105, 0.31, 5.0, 1e6])
def test_iterations_match_the_segment_closed_form(now_s):
    listed = Segment(0.0, 0.004, 0.0, 3, iters_s=(0.004, 0.006, 0.0045), ends_s=(0.004, 0.01, 0.0145))
    segs = [Segment(0.0, 0.005, 0.0, 40), Segment(0.0, 0.005, 1e-5, 40), Segment(0.1, 0.002, 3e-4, 7),
            Segment(0.0, 0.005, 1e-310, 9), None, listed]
    for copies in (1, 8):  # per instance below the cut-off, vectorised above it
        insts = {i: _instance(i, (100, 250), seg) for i, seg in enumerate(segs * copies)}
        cols = LoadColumns(insts)
        slots = cols.slots(list(insts))
        want = [i.iterations_since_sync(now_s) for i in insts.values()]
        assert cols.iterations_done(slots, now_s).tolist() == want
        assert cols.token_loads(slots, now_s).tolist() == [i.token_load(now_s) for i in insts.values()]


def test_mutations_reach_the_columns_and_new_instances_register():
    insts = {0: _instance(0, (100,)), 1: _instance(1)}
    view = ClusterView(insts, {})
    ids = [0, 1]
    assert view.token_loads(ids).tolist() == [100, 0]
    insts[1].queue_prefill(7, 300)
    insts[1].add_incoming(8, 40)
    insts[0].decodes.remove(0)
    assert view.token_loads(ids).tolist() == [0, 340]
    assert view.own_request_counts(ids).tolist() == [0, 2]
    insts[2] = _instance(2, (5, 6))  # an instance added live (the admin API)
    assert view.token_loads([0, 1, 2]).tolist() == [0, 340, 11]
    insts[0] = _instance(0, (9,))  # replaced under the same id: runtimes then invalidate roles
    view.invalidate_roles()
    assert view.token_loads([0, 1, 2]).tolist() == [9, 340, 11]
    assert view.token_loads(np.array([2, 0])).tolist() == [11, 9]  # id arrays too


def test_an_unmarked_mutation_is_visible_as_a_stale_column():
    """The check above is not vacuous: writing a load term behind the columns' back
    leaves them stale."""
    insts = {0: _instance(0, (100,))}
    view, cols = ClusterView(insts, {}), LoadColumns(insts)
    assert cols.token_loads(cols.slots([0]), 0.0).tolist() == [100]
    insts[0].incoming_tokens += 50  # not through add_incoming: no touch
    assert cols.token_loads(cols.slots([0]), 0.0).tolist() == [100] != [view.token_load(0)]
    # a few instances are read one by one (the view's small-table path): never stale
    assert view.token_loads([0]).tolist() == [150]
    assert np.array_equal(view.prefill_loads([0]), [view.prefill_load(0)])


def _random_instances(rng, count):
    """Decode instances with 0-3 rows each and a running affine segment where they decode."""
    insts = {}
    for i in range(count):
        ctxs = tuple(int(c) for c in rng.integers(50, 400, size=int(rng.integers(0, 4))))
        seg = Segment(float(rng.uniform(0, 0.05)), float(rng.uniform(0.004, 0.03)), 1e-5, 500) if ctxs else None
        insts[i] = _instance(i, ctxs, seg)
    return insts


def test_least_load_by_lower_bounds_equals_the_argmin_as_time_moves_and_tables_change():
    """Above the pruning cut-off, counts computed earlier serve as floors: the pick must
    still be the first least load at every later instant, after mutations and ties."""
    rng = np.random.default_rng(5)
    insts = _random_instances(rng, 200)
    cols = LoadColumns(insts)
    ids = list(insts)
    slots = cols.slots(ids)
    for step, now_s in enumerate(np.linspace(0.0, 2.0, 41)):
        if step % 7 == 3:  # a table write mid-run: its floor must not survive it
            inst = insts[int(rng.integers(0, 200))]
            inst.decodes.add(10_000 + step, 5, 1, 50, 99, 1)
        if step % 5 == 0:
            cols.token_loads(slots, float(now_s))  # counts computed: floors for later reads
        loads = [insts[i].token_load(float(now_s)) for i in ids]
        assert cols.least_token_load(slots, float(now_s)) == loads.index(min(loads)), now_s
        assert cols.token_loads_at_least(slots, float(now_s), min(loads))
        assert not cols.token_loads_at_least(slots, float(now_s), min(loads) + 1)


def test_floors_bound_the_loads_from_below_and_are_exact_where_counted():
    """The kept floor column: never above a load at any later instant, equal to it right
    after the counts were computed, and only ``base`` when a read goes back in time."""
    rng = np.random.default_rng(7)
    insts = _random_instances(rng, 150)
    cols = LoadColumns(insts)
    slots = cols.slots(list(insts))
    counted = 0
    for step, now_s in enumerate(np.linspace(0.0, 1.5, 31)):
        if step % 4 == 2:
            insts[int(rng.integers(0, 150))].decodes.add(20_000 + step, 7, 1, 50, 99, 1)
        if step % 4 == 1:  # a row leaves: the load falls, and so must the floor
            inst = next(x for x in insts.values() if x.decodes.n)
            inst.decodes.remove(inst.decodes.req_ids()[0])
        loads = np.array([insts[i].token_load(float(now_s)) for i in insts])
        assert (cols.token_load_floors(slots, float(now_s)) <= loads).all(), now_s
        if step % 3 == 0:
            cols.token_loads(slots, float(now_s))
            floors = cols.token_load_floors(slots, float(now_s))
            assert floors.tolist() == loads.tolist(), now_s
            counted += int((floors > cols.column("base", slots)).sum())
    assert counted > 100  # the counts really raised the floors above base
    cols.token_loads(slots[:50], 0.01)  # time went back: no count holds, read or not
    loads = np.array([insts[i].token_load(0.01) for i in insts])
    assert (cols.token_load_floors(slots, 0.01) <= loads).all()
    assert cols.token_load_floors(slots, 0.005).tolist() == cols.column("base", slots).tolist()
