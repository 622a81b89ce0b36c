"""Flow control in the simulator (``sim/gate.py``), seeded: every request ends (finished,
or rejected as shed), shed requests never reached an engine, and under overload the high
band keeps its SLO only with flow control."""

from __future__ import annotations

from baton.core.flow_control import FlowControlSettings
from baton.experiments.config import Experiment, WorkloadConfig
from baton.experiments.run import run_experiment
from baton.metrics import SLO
from baton.sim.cluster import ClusterSpec
from baton.workload.classes import RequestClass
from baton.workload.synthetic import SyntheticSpec

MIX = (RequestClass(0.2, 1, "interactive", 1.0, 0.05), RequestClass(0.8, 0, "batch", 30.0, 0.2))


def run(flow: FlowControlSettings, rate: float = 70.0, requests: int = 800):
    exp = Experiment(cluster=ClusterSpec(prefill=2, decode=2), policy="least-loaded", seed=3, slo=SLO(2.0, 0.1),
                     workload=WorkloadConfig(synthetic=SyntheticSpec(requests=requests, rate_rps=rate),
                                             classes=MIX), flow_control=flow)
    return run_experiment(exp)


def test_every_request_ends_and_shed_ones_never_ran():
    result, data = run(FlowControlSettings(enabled=True, ttl_s=3.0))
    records = result.records
    assert len(records) == 800 and all(r.finished or r.reject_reason for r in records)
    shed = [r for r in records if r.reject_reason == "shed"]
    assert shed and all(r.path == "" and r.ttft_s != r.ttft_s for r in shed)  # no instance, no token
    assert data.summary["rejected_shed"] == len(shed)
    assert all(r.priority == 0 for r in shed)  # the high band is dispatched first: nothing of it waits 3 s


def test_the_high_band_keeps_its_slo_only_with_flow_control():
    with_fc = run(FlowControlSettings(enabled=True, ordering="edf"))[1].summary
    without = run(FlowControlSettings(enabled=False))[1].summary
    assert with_fc["band1_slo_attainment"] >= 0.95 > without["band1_slo_attainment"]
    assert with_fc["finished"] == without["finished"] == 800  # nothing lost without a TTL
