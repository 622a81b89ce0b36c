"""The gateway's control state without HTTP: decisions through the one dispatcher, stale
decisions dropped and counted, ticks that survive policy bugs and ended requests, and a
finished request told to the policy while it can still read it."""

import logging

import numpy as np
import pytest

from baton.core.decisions import ChangeRole, DecisionError, Deflect, Migrate, Watch
from baton.core.instance import Role
from baton.gateway.config import EngineSpec, GatewayConfig
from baton.gateway.control import Control
from baton.gateway.live import LiveCluster
from baton.gateway.metrics import GatewayMetrics, TokenTimes
from baton.perf import build
from baton.policies import PolicyContext, Scheduler, Stage, scheduler_for
from tests.gateway.test_live import Clock, run_request

PERF = build("llama-3.1-8b@a100-80g")


class Served:
    """A request in flight, as control sees it (``control.InFlight``)."""

    def __init__(self, state):
        self.state, self.client_xid, self.path, self.moved_to, self.client = state, "x", "pd", [], ""
        self.times = TokenTimes()

    def request_migration(self, target):
        self.moved_to.append(target)


def make(policy="least-loaded", n_decode=2, scheduler=None):
    clock = Clock()
    cluster = LiveCluster(clock, default_kv_blocks=1000, block_size=16)
    engines = [EngineSpec("http://p:1", Role.PREFILL, "p0")] + [
        EngineSpec(f"http://d:{i}", Role.DECODE, f"d{i}") for i in range(n_decode)]
    for spec in engines:
        cluster.add_engine(spec)
    config = GatewayConfig(engines=engines, policy=policy)
    control = Control(config, cluster, scheduler or scheduler_for(policy, PERF), GatewayMetrics())
    return control, cluster, clock


def sample(control, name, **labels):
    return control.metrics.registry.get_sample_value(name, labels) or 0.0


def served(control, cluster, clock, decode=1, tokens=5):
    st = run_request(cluster, clock, decode, tokens=tokens)
    flow = Served(st)
    control.admit(flow)
    return flow


@pytest.mark.parametrize("decision,kind", [(Migrate(7, 2), "migrate"), (Watch(7, 100), "watch"),
                                           (Deflect(7, 2, 64), "deflect")])
def test_a_decision_about_an_ended_request_is_dropped_and_counted(decision, kind):
    control, cluster, clock = make()
    flow = served(control, cluster, clock)
    control.end(flow, "ok", 5)
    assert flow.state.req_id == 0
    stale = type(decision)(*(0 if f == "req_id" else getattr(decision, f) for f in decision.__slots__))
    assert control.execute(stale, 0) is False
    assert sample(control, "baton_stale_decisions_total", kind=kind) == 1
    assert control.watches == {} and flow.moved_to == []


def test_a_migration_reaches_the_flow_and_marks_the_request():
    control, cluster, clock = make()
    flow = served(control, cluster, clock)
    assert control.execute(Migrate(flow.state.req_id, 2), 0) is True
    assert flow.moved_to == [2] and flow.state.migrating


@pytest.mark.parametrize("bad", [object(), Migrate(0, 99), ChangeRole(42, Role.DECODE)])
def test_an_unknown_decision_or_instance_raises(bad):
    control, cluster, clock = make()
    served(control, cluster, clock)
    with pytest.raises(DecisionError):
        control.execute(bad, 0)


def test_sibyl_is_told_a_request_finished_while_it_can_still_read_its_placement():
    control, cluster, clock = make("sibyl")
    flow = served(control, cluster, clock)
    sibyl = control.scheduler.stages[0]
    before = sibyl.survival.count
    control.end(flow, "ok", 5)  # raised KeyError before: the request was forgotten first
    assert cluster.totals() == {k: 0 for k in cluster.totals()}
    assert sibyl.survival.count == before + 1
    assert sample(control, "baton_requests_total", path="pd", outcome="ok") == 1


def test_ares_keeps_ticking_after_a_request_it_moved_ended():
    control, cluster, clock = make("ares")
    flow = served(control, cluster, clock)
    ares_index, ares = 1, control.scheduler.stages[1]
    ares.in_flight[flow.state.req_id] = (1, 2)
    control.end(flow, "ok", 5)
    for _ in range(3):
        clock.t += 1.0
        control.tick(ares_index)
    assert ares.in_flight == {}
    assert sample(control, "baton_policy_ticks_total", stage="1") == 3
    assert sample(control, "baton_policy_tick_errors_total", stage="1") == 0


class Broken(Stage):
    name = "broken"
    tick_interval_s = 1.0

    def __init__(self, context):
        super().__init__(context)
        self.calls = 0

    def tick(self, view):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a policy bug")
        return [ChangeRole(2, Role.PREFILL)]


def test_a_failing_tick_is_logged_and_counted_and_the_next_one_runs(caplog):
    stage = Broken(PolicyContext(np.random.default_rng(0), PERF))
    control, cluster, clock = make(scheduler=Scheduler("broken", [stage]))
    with caplog.at_level(logging.ERROR, logger="baton.gateway"):
        control.tick(0)
    assert any("tick of stage 0 failed" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    control.tick(0)
    assert sample(control, "baton_policy_tick_errors_total", stage="0") == 1
    assert sample(control, "baton_policy_ticks_total", stage="0") == 1
    assert cluster.instances[2].role is Role.PREFILL
    assert sample(control, "baton_role_flips_total", role="prefill") == 1
