"""Flow control (``core.flow_control``) in the simulator, on 8 instances (4P4D,
llama-3.1-8b@a100-80g, least-loaded, the synthetic workload's default lengths):

1. **Priority under overload.** The cluster's sustainable rate S (90% SLO attainment at
   the run SLO, 2 s / 100 ms, by bisection without flow control), then 2 x S with 20% of
   requests interactive (band 1, TTFT 1 s, TPOT 50 ms) and 80% batch (band 0, 30 s /
   200 ms): the interactive band's attainment with flow control (EDF) and without.
2. **Fairness.** Two tenants of equal weight: `a` sends S/2 (its share), `b` five times as
   much; `a`'s attainment alone, then beside `b` with flow control (VTC fairness) and without.

Usage: python benchmarks/flow_control.py [--requests 3000] [--seed 0]
The last line is one JSON object: sustainable_rate_rps, high_attainment_fc,
high_attainment_nofc, fair_alone, fair_with_fc, fair_without_fc, fair_gap_points,
unfair_gap_points, live_verdicts_agree (null: the live half is not built yet).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from baton.core.flow_control import FlowControlSettings  # noqa: E402
from baton.experiments.config import Experiment, WorkloadConfig  # noqa: E402
from baton.experiments.run import run_experiment  # noqa: E402
from baton.metrics import SLO  # noqa: E402
from baton.sim.cluster import ClusterSpec  # noqa: E402
from baton.workload.classes import RequestClass  # noqa: E402
from baton.workload.synthetic import SyntheticSpec  # noqa: E402

CLUSTER = ClusterSpec(prefill=4, decode=4)
SLO_RUN = SLO(2.0, 0.1)


def run(rate: float, requests: int, seed: int, classes: tuple[RequestClass, ...] = (),
        flow: bool = False, fairness: str = "vtc") -> dict[str, float]:
    """One simulation's summary."""
    exp = Experiment(cluster=CLUSTER, policy="least-loaded", seed=seed, slo=SLO_RUN,
                     workload=WorkloadConfig(synthetic=SyntheticSpec(requests=requests, rate_rps=rate),
                                             classes=classes),
                     flow_control=FlowControlSettings(enabled=flow, ordering="edf", fairness=fairness))
    return run_experiment(exp)[1].summary


def sustainable(requests: int, seed: int) -> float:
    """The highest rate (req/s) at 90% attainment, by bisection over [1, 200]."""
    low, high = 1.0, 200.0
    for _ in range(8):
        mid = (low + high) / 2
        low, high = (mid, high) if run(mid, requests, seed)["slo_attainment"] >= 0.9 else (low, mid)
    return low


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    s = sustainable(args.requests, args.seed)
    print(f"sustainable rate: {s:.1f} req/s (90% attainment at 2 s / 100 ms, no flow control)", file=sys.stderr)
    mix = (RequestClass(0.2, 1, "interactive", 1.0, 0.05), RequestClass(0.8, 0, "batch", 30.0, 0.2))
    high = {fc: run(2 * s, args.requests, args.seed, mix, fc)["band1_slo_attainment"] for fc in (True, False)}
    print(f"2 x S, 20% interactive: its attainment {high[True]:.3f} with flow control, "
          f"{high[False]:.3f} without", file=sys.stderr)
    share = s / 2
    alone = run(share, args.requests // 6, args.seed, (RequestClass(1.0, 0, "a"),))["slo_attainment"]
    pair = (RequestClass(1 / 6, 0, "a"), RequestClass(5 / 6, 0, "b"))
    fair = {fc: run(6 * share, args.requests, args.seed, pair, fc)["tenant_a_slo_attainment"] for fc in (True, False)}
    print(f"tenant a: alone {alone:.3f}; beside b at 5x: {fair[True]:.3f} with VTC flow control, "
          f"{fair[False]:.3f} without", file=sys.stderr)
    print(f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    print(json.dumps({"sustainable_rate_rps": round(s, 2), "high_attainment_fc": round(high[True], 4),
                      "high_attainment_nofc": round(high[False], 4), "fair_alone": round(alone, 4),
                      "fair_with_fc": round(fair[True], 4), "fair_without_fc": round(fair[False], 4),
                      "fair_gap_points": round(100 * (alone - fair[True]), 2),
                      "unfair_gap_points": round(100 * (alone - fair[False]), 2), "live_verdicts_agree": None}))


if __name__ == "__main__":
    main()
