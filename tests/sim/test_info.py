"""Staleness in the simulator: what a policy sees is the last published scrape."""

import numpy as np
import pytest

from baton.core.errors import ConfigError
from baton.core.info import InfoModel, ViewMode
from baton.policies import PolicyContext, Scheduler, Stage, build_scheduler
from baton.sim import ClusterSpec, EngineConfig, Simulator
from tests.sim.helpers import tiny_perf, workload


class Probe(Stage):
    """Records, every 13 ms, what the view shows and what the engine has."""

    tick_interval_s = 0.013

    def __init__(self, context):
        super().__init__(context)
        self.seen = []

    def tick(self, view):
        for i in view.decode_ids:
            inst = view.instance(i)
            self.seen.append((view.now_s, i, view.running_requests(i), view.kv_usage(i),
                              inst.running_requests, inst.kv_usage_at(view.now_s)))
        return []


@pytest.mark.parametrize("interval_s, delay_s", [(0.25, 0.0), (0.5, 0.2)])
def test_policies_see_the_scrape_published_delay_after_it_was_taken(interval_s, delay_s):
    perf = tiny_perf(4000)
    ctx = PolicyContext(np.random.default_rng(0), perf)
    probe = Probe(ctx)
    sched = Scheduler("probe", [*build_scheduler("least-loaded", ctx).stages, probe])
    cluster = ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 32, 16))
    sim = Simulator(cluster, perf, sched, workload(3, n=40, rate=20.0), info=InfoModel(ViewMode.SCRAPED,
                                                                                      interval_s, delay_s))
    truth = {}  # scrape time -> {instance: (running, kv usage)}
    original = sim._on_scrape

    def scrape():
        truth[sim.now] = {i: (s.running_requests, s.kv_usage_at(sim.now)) for i, s in sim.instances.items()}
        original()
    sim._on_scrape = scrape
    sim.run()
    stale = 0
    for now, i, running, kv, true_running, true_kv in probe.seen:
        # at an equal time a tick runs before the scrape is published (event priorities)
        taken = [t for t in truth if t + delay_s < now]
        expected = truth[max(taken)][i] if taken else (0, 0.0)  # nothing published yet: looks idle
        assert (running, kv) == pytest.approx(expected), now
        stale += (running, kv) != (true_running, true_kv)
    assert stale > 0  # the engine did move on between scrapes


def test_exact_view_sees_the_engine_now():
    perf = tiny_perf(4000)
    ctx = PolicyContext(np.random.default_rng(0), perf)
    probe = Probe(ctx)
    sched = Scheduler("probe", [*build_scheduler("least-loaded", ctx).stages, probe])
    sim = Simulator(ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 32, 16)), perf, sched,
                    workload(3, n=40, rate=20.0), info=InfoModel(ViewMode.EXACT))
    sim.run()
    assert probe.seen and all((r, kv) == (tr, tkv) for _, _, r, kv, tr, tkv in probe.seen)


def test_stages_that_need_bookings_cannot_run_scraped_only():
    perf = tiny_perf(4000)
    sched = build_scheduler("sibyl", PolicyContext(np.random.default_rng(0), perf))
    with pytest.raises(ConfigError, match="scraped-only"):
        Simulator(ClusterSpec(), perf, sched, [], info=InfoModel(ViewMode.SCRAPED_ONLY))
