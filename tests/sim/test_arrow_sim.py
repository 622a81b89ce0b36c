"""Arrow in the simulator: instances move between pools under a burst of long prompts and
come back when decode is busy; work queued before a flip finishes where it is; every
request ends and every block is released."""

import numpy as np
import pytest

from baton.core.decisions import ChangeRole
from baton.core.instance import Role
from baton.metrics import SLO
from baton.policies import PolicyContext, build_scheduler
from baton.sim import ClusterSpec, EngineConfig, Simulator
from tests.sim.helpers import assert_all_ended, assert_drained, req, run_checked, tiny_perf


def run_arrow(requests, policy="arrow", prefill=1, decode=2):
    perf = tiny_perf(kv_tokens=40_000)
    ctx = PolicyContext(np.random.default_rng(0), perf, ttft_slo_s=0.15, tpot_slo_s=0.012)
    sched = build_scheduler({"name": policy, "stages": [{"stage": "arrow", "flips": policy == "arrow",
                                                         "monitor_interval_s": 0.05, "monitor_window_s": 0.2}]},
                            ctx)
    cluster = ClusterSpec(prefill=prefill, decode=decode, engine=EngineConfig(1024, 64, 16), nic_gbps=100)
    return run_checked(cluster, perf, sched, requests)


def burst_then_long_outputs():
    """30 long prompts in 60 ms (prefill-bound), then 80 short prompts with long outputs
    (decode-bound: about 50k context tokens on one decode instance, over 0.7 x its Max
    Running Tokens)."""
    burst = [req(i, i * 0.002, 3000, 4) for i in range(30)]
    tail = [req(30 + i, 0.5 + i * 0.005, 300, 600) for i in range(80)]
    return burst + tail


def test_a_decode_instance_is_lent_for_a_burst_and_comes_back():
    sim, result = run_arrow(burst_then_long_outputs())
    flips = [(t, i, r) for t, i, r in result.role_log if t > 0]
    lent = [(t, i) for t, i, r in flips if r == "prefill"]
    assert lent, flips  # Algorithm 1 borrowed a decode instance for the burst
    t_lent, borrowed = lent[0]
    assert t_lent < 0.1
    served = [r for r in result.records if r.path.split(">")[0] == result.instance_names[borrowed] and r.req_id < 30]
    assert served  # the borrowed instance prefilled part of the burst
    back = [t for t, i, r in flips if r == "decode" and 0.5 < t < 1.5]
    assert back, flips  # decode got busy: an instance went back to decode (monitor or Algorithm 2)
    roles = {i: r for _, i, r in result.role_log}
    assert sorted(roles.values()).count("decode") >= 2  # 1P2D again (or more decode)


def test_without_flips_roles_never_change_and_the_burst_waits():
    _, static = run_arrow(burst_then_long_outputs(), policy="arrow-static")
    _, elastic = run_arrow(burst_then_long_outputs())
    assert static.counters.role_changes == 0 and [t for t, *_ in static.role_log if t > 0] == []
    ttft = lambda res: np.mean([r.ttft_s for r in res.records if r.req_id < 30])  # noqa: E731
    assert ttft(elastic) < ttft(static)  # more prefill instances during the burst


def test_queued_prefills_finish_on_an_instance_flipped_to_decode():
    """P->D: the instance keeps its queued prefills after the flip and runs them."""
    perf = tiny_perf(kv_tokens=40_000)
    ctx = PolicyContext(np.random.default_rng(0), perf, ttft_slo_s=10.0, tpot_slo_s=0.012)
    sched = build_scheduler("arrow", ctx)
    cluster = ClusterSpec(prefill=2, decode=1, engine=EngineConfig(256, 64, 16), nic_gbps=100)
    requests = [req(i, i * 0.001, 2000, 30) for i in range(6)]
    sim = Simulator(cluster, perf, sched, requests, sample_interval_s=0.1)
    original = sim._on_arrival

    def arrive_then_flip(index):
        original(index)
        if index == 5:  # every prompt is queued: flip instance 0 to decode under them
            sim.execute(ChangeRole(0, Role.DECODE), -1)
    sim._on_arrival = arrive_then_flip
    result = sim.run()
    assert_all_ended(sim, result, len(requests))
    on_zero = [r for r in result.records if r.path.split(">")[0] == result.instance_names[0]]
    assert on_zero and all(r.finished for r in on_zero)
    assert len(on_zero) == 3  # its three queued prompts, all prefilled after the flip began
    # and their decodes stay there (Algorithm 2: no transfer; the path is one instance)
    assert all(r.path == result.instance_names[0] for r in on_zero)
    assert_drained(sim)
    # the flip's cost: its three queued requests shared the instance with decode work, which
    # began when the first of them finished its prefill there
    assert sim.counters.flip_exposed_requests == 3
    first_decode = min(sim.states[r.req_id].decode_start_s for r in on_zero)
    assert sim.counters.flip_first_work_s == [pytest.approx(first_decode - 0.005)]
    summary = result.summary(SLO())
    assert summary["flip_first_work_mean_s"] > 0 and summary["flips_unused"] == 0


def test_requests_queued_for_decode_blocks_make_arrow_flip_while_prefill_is_busy():
    """3P1D, one decode instance whose KV (40k tokens) holds about 45 of 300 requests:
    handoffs queue for its blocks while its batch stays under the TPOT SLO. Those queued
    handoffs are its running tokens (Algorithm 2's decode load), so Arrow flips prefill
    instances to decode while arrivals still keep them busy, not only once they go idle."""
    perf = tiny_perf(kv_tokens=40_000)
    ctx = PolicyContext(np.random.default_rng(0), perf, ttft_slo_s=1.0, tpot_slo_s=0.5)
    sched = build_scheduler({"name": "arrow", "stages": [{"stage": "arrow", "monitor_interval_s": 0.05,
                                                         "monitor_window_s": 0.2}]}, ctx)
    cluster = ClusterSpec(prefill=3, decode=1, engine=EngineConfig(1024, 64, 16), nic_gbps=100)
    requests = [req(i, i * 0.005, 500, 400) for i in range(300)]  # arrivals until 1.5 s
    _, result = run_checked(cluster, perf, sched, requests)
    to_decode = [t for t, _, r in result.role_log if t > 0 and r == "decode"]
    assert to_decode and to_decode[0] < 1.0, result.role_log
    assert any(r.receive_wait_s > 0 for r in result.records)  # the regime: handoffs did wait for blocks
