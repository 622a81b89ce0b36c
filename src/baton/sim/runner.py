"""One-call entry point: workload + cluster + policy -> results."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from baton.core.flow_control import FlowControlSettings
from baton.core.info import InfoModel
from baton.core.request import Request
from baton.perf import build as build_preset
from baton.metrics.summary import SLO
from baton.perf.model import PerfModel
from baton.policies import scheduler_for
from baton.sim.cluster import ClusterSpec
from baton.sim.simulator import SimResult, Simulator


def simulate(requests: list[Request], cluster: ClusterSpec, policy: str | Mapping[str, Any],
             seed: int = 0, closed_form: bool = True, perf: PerfModel | None = None,
             sample_interval_s: float = 1.0,
             progress: Callable[[float, int, int], None] | None = None,
             info: InfoModel = InfoModel(), slo: SLO | None = None,
             extras: Mapping[str, Any] | None = None, flow: FlowControlSettings | None = None) -> SimResult:
    """Simulate ``requests`` on ``cluster`` under ``policy`` (a name or a stage config).

    The policy's random generator is seeded from ``seed``, so runs are reproducible.
    ``info`` is what policies see (``baton.core.info``; default: scraped every 1 s).
    ``slo`` is given to SLO-aware policies (Arrow) through their ``PolicyContext``;
    ``extras`` is what the policy needs besides (CascadeInfer's QoE model: callers get it
    from ``baton.profiling.qoe.extras_for(policy, preset)``). ``flow``: flow control in
    front of the policy (``core.flow_control``; None or disabled: every arrival placed at once).
    """
    perf = perf or build_preset(cluster.preset)
    scheduler = scheduler_for(policy, perf, seed, slo.ttft_s if slo else None, slo.tpot_s if slo else None,
                              extras)
    scheduler.check_cluster(cluster.prefill, cluster.decode, cluster.mixed)
    sim = Simulator(cluster, perf, scheduler, requests, closed_form=closed_form,
                    sample_interval_s=sample_interval_s, progress=progress, info=info, flow=flow,
                    ttft_slo_s=slo.ttft_s if slo else 2.0)
    return sim.run()
