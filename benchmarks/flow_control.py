"""Flow control (``core.flow_control``) in the simulator, on 8 instances (4P4D,
llama-3.1-8b@a100-80g, least-loaded, the synthetic workload's default lengths):

1. **Priority under overload.** The cluster's sustainable rate S (90% SLO attainment at
   the run SLO, 2 s / 100 ms, on a steady window, by bisection without flow control), then 2 x S with 20% of
   requests interactive (band 1, TTFT 1 s, TPOT 50 ms) and 80% batch (band 0, 30 s /
   200 ms): the interactive band's attainment with flow control (EDF) and without.
2. **Fairness.** Two tenants of equal weight: `a` sends S/2 (its share), `b` five times as
   much; `a`'s attainment alone, then beside `b` with flow control (VTC fairness) and without.

Live half (``--live-requests N``, 0 to skip): both scenarios again on ``baton serve`` in
front of eight ``baton emulate`` processes ``--time-scale`` times slower than the preset
(arrival rates divided and SLOs multiplied by it), each request's class sent as headers,
N requests per run; and the simulator on exactly those traces at the same scale. A
scenario's verdict is whether its target is met: (1) the interactive band at >= 95% with
flow control and below without; (2) tenant `a` within 5 points of its attainment alone
with flow control and more than 5 points below without. ``live_verdicts_agree``: the live
verdicts equal the simulated ones on the same traces.

Usage: python benchmarks/flow_control.py [--requests 3000] [--seed 0] [--live-requests 400]
The last line is one JSON object: sustainable_rate_rps, high_attainment_fc,
high_attainment_nofc, fair_alone, fair_with_fc, fair_without_fc, fair_gap_points,
unfair_gap_points, live_verdicts_agree (null when the live half is skipped), live (each
live and simulated figure of the live half).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.live, tests.conformance.harness

from baton.core.flow_control import FlowControlSettings  # noqa: E402
from baton.core.request import Request  # noqa: E402
from baton.gateway.replay import ReplayRecord, replay  # noqa: E402
from baton.metrics.records import RequestRecord  # noqa: E402
from baton.metrics.summary import Window, meets_slo  # noqa: E402
from baton.sim.runner import simulate  # noqa: E402
from baton.experiments.config import Experiment, WorkloadConfig  # noqa: E402
from baton.experiments.run import run_experiment  # noqa: E402
from baton.experiments.steady import steady_point  # noqa: E402
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
    """The highest rate (req/s) at 90% attainment on a steady window (``steady_point``:
    a pass on fewer than max(60 s, 10 mean e2e) of arrivals runs again on more), by
    bisection over [1, 200]."""
    low, high = 1.0, 200.0
    for _ in range(8):
        mid = (low + high) / 2
        point = steady_point(lambda n, r=mid: run(r, n, seed), mid, requests)
        low, high = (mid, high) if point["slo_attainment"] >= 0.9 and point["steady"] else (low, mid)
    return low


# --- the live half ---------------------------------------------------------------------------
SCALE = 5.0  # emulators this many times slower than the preset: rates / SCALE, SLOs x SCALE
OUTPUT_CAP = 400  # tokens: a live run lasts as long as its longest answer (x SCALE)
MIX = (RequestClass(0.2, 1, "interactive", 1.0, 0.05), RequestClass(0.8, 0, "batch", 30.0, 0.2))
PAIR = (RequestClass(1 / 6, 0, "a"), RequestClass(5 / 6, 0, "b"))


def trace(rate: float, requests: int, seed: int, classes: tuple[RequestClass, ...]) -> list[Request]:
    """The scenario's requests (``rate`` at the preset's speed) at ``SCALE``: arrivals
    stretched, own SLOs too."""
    wl = WorkloadConfig(synthetic=SyntheticSpec(requests=requests, rate_rps=rate, output_cap=OUTPUT_CAP),
                        classes=classes)
    return [replace(r, arrival_s=r.arrival_s * SCALE,
                    ttft_slo_s=r.ttft_slo_s * SCALE if r.ttft_slo_s is not None else None,
                    tpot_slo_s=r.tpot_slo_s * SCALE if r.tpot_slo_s is not None else None)
            for r in wl.load(seed)]


def flow_settings(on: bool) -> dict:
    return {"enabled": on, "ordering": "edf", "fairness": "vtc"}


def simulated(requests: list[Request], flow: bool) -> list[RequestRecord]:
    """The simulator on the scaled trace, its engines ``SCALE`` times slower."""
    from tests.conformance.harness import slowed_preset
    cluster = replace(CLUSTER, preset=slowed_preset(CLUSTER.preset, SCALE))
    flow_control = FlowControlSettings(**flow_settings(flow))
    return simulate(requests, cluster, "least-loaded", slo=scaled_slo(), flow=flow_control).records


def scaled_slo() -> SLO:
    return SLO(SLO_RUN.ttft_s * SCALE, SLO_RUN.tpot_s * SCALE)


def live(requests: list[Request], flow: bool) -> list[RequestRecord]:
    """The scaled trace through ``baton serve`` and eight emulators (4P4D) ``SCALE`` times slower."""
    from tests.live import servers, start_emulator, start_gateway
    tmp = Path(tempfile.mkdtemp(prefix="baton-flow-"))
    emus = [start_emulator(tmp, "--time-scale", f"{SCALE:g}") for _ in range(8)]
    engines = [{"name": f"{role[0]}{i % 4}", "url": e.url, "role": role}
               for i, (e, role) in enumerate(zip(emus, ["prefill"] * 4 + ["decode"] * 4))]
    slo = scaled_slo()
    gw = start_gateway(tmp, {"engines": engines, "policy": "least-loaded", "admin_token": "admin-token-for-tests",
                             "ttft_slo_s": slo.ttft_s, "tpot_slo_s": slo.tpot_s, "max_inflight": 100_000,
                             "max_inflight_per_client": 100_000, "classes": {"client_headers": "all"},
                             "flow_control": flow_settings(flow)})
    with servers(*emus, gw):
        answers = asyncio.run(replay(gw.url, requests, timeout_s=3600))
    return [record_of(r, a) for r, a in zip(requests, answers)]


def record_of(r: Request, a: ReplayRecord) -> RequestRecord:
    """A live answer as the simulator's record (times from its send)."""
    nan = float("nan")
    finished = a.status == 200 and a.output_tokens == r.output_tokens
    reason = "" if finished else "shed" if a.status == 429 else f"status_{a.status}"
    tpot = (a.e2e_s - a.ttft_s) / (r.output_tokens - 1) if finished and r.output_tokens > 1 else nan
    e2e = a.e2e_s if finished else nan
    return RequestRecord(r.req_id, r.arrival_s, r.prompt_tokens, r.output_tokens, finished, reason,
                         a.ttft_s if finished else nan, tpot, e2e, e2e / r.output_tokens, nan, nan, nan, nan, nan,
                         0, 0, "", False, r.priority, r.tenant, nan if r.ttft_slo_s is None else r.ttft_slo_s,
                         nan if r.tpot_slo_s is None else r.tpot_slo_s)


def attainment(records: list[RequestRecord], keep=lambda r: True) -> float:
    """Steady-window attainment (the simulator's window) of the records ``keep`` selects."""
    window = Window.of(records)
    rs = [r for r in records if window.holds(r) and keep(r)]
    return sum(meets_slo(r, scaled_slo()) for r in rs) / max(1, len(rs))


def verdicts(run, s: float, n: int, seed: int) -> dict[str, float | bool]:
    """Both scenarios through ``run`` (``live`` or ``simulated``): their figures and verdicts."""
    high = {fc: attainment(run(trace(2 * s, n, seed, MIX), fc), lambda r: r.priority == 1)
            for fc in (True, False)}
    share = s / 2
    alone = attainment(run(trace(share, max(50, n // 6), seed, (RequestClass(1.0, 0, "a"),)), False))
    fair = {fc: attainment(run(trace(6 * share, n, seed, PAIR), fc), lambda r: r.tenant == "a") for fc in (True, False)}
    return {"high_fc": high[True], "high_nofc": high[False], "alone": alone, "fair_fc": fair[True],
            "fair_nofc": fair[False], "priority_verdict": high[True] >= 0.95 > high[False],
            "fairness_verdict": alone - fair[True] <= 0.05 < alone - fair[False]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--live-requests", type=int, default=400, help="requests per live run (0: no live half)")
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
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
    halves, agree = {}, None
    if args.live_requests:
        for name, runner in (("simulated", simulated), ("live", live)):
            halves[name] = verdicts(runner, s, args.live_requests, args.seed)
            print(f"{name} at x{SCALE:g}, {args.live_requests} requests: " + ", ".join(
                f"{k} {v:.3f}" if not isinstance(v, bool) else f"{k} {v}" for k, v in halves[name].items()),
                file=sys.stderr)
        agree = all(halves["live"][k] == halves["simulated"][k] for k in ("priority_verdict", "fairness_verdict"))
    print(f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    out = {"sustainable_rate_rps": round(s, 2), "high_attainment_fc": round(high[True], 4),
           "high_attainment_nofc": round(high[False], 4), "fair_alone": round(alone, 4),
           "fair_with_fc": round(fair[True], 4), "fair_without_fc": round(fair[False], 4),
           "fair_gap_points": round(100 * (alone - fair[True]), 2),
           "unfair_gap_points": round(100 * (alone - fair[False]), 2), "live_verdicts_agree": agree,
           "live": {h: {k: v if isinstance(v, bool) else round(v, 4) for k, v in f.items()} for h, f in halves.items()}}
    print(json.dumps(out))
    if args.record:
        from baton.report.results import record
        record("flow-control", out, time.perf_counter() - t0,
               "python benchmarks/flow_control.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
