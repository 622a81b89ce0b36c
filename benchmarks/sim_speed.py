"""Simulator speed: wall time, simulated output tokens per wall second, peak memory.

Runs (1) the Azure conversation trace on 4P4D (skipped when the trace is absent),
(2) a synthetic reasoning workload of 20,000 requests (mean output ~5,000, cap 8,192)
on 16P64D, (3) closed-form vs per-iteration mode on a subset, measured in the same
run, and with ``--scale`` (4) the demo's built-in workload (bursty, heavy-tailed lengths)
at the demo's rate per instance (14 req/s on 6 instances, 1:2 prefill to decode) on a
1,024-instance PD cluster (256P768D) with 200,000 requests (``wall_s_1024``, and its peak
RSS in a fresh process, ``rss_mib_1024``), and how wall time per simulated request grows
with the instance count (16, 256, 1,024 at that load per instance, requests in proportion)
and with the requests (10k, 50k, 200k on 1,024 instances), and with ``--vidur`` (5) both
simulators as whole processes on the same requests (Vidur 0.0.26 from the fidelity
benchmark's install, its forests trained by an untimed first run; ``baton simulate`` on
Vidur's own request metrics, start-up included): 10,000 requests on 1 replica
(``vidur_speedup_10k``) and 50,000 on 16 (``vidur_speedup_50k``) of Llama-2-70B TP2 at
0.3 req/s per replica (the fidelity benchmark's light case). The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from baton.sim import ClusterSpec, simulate
from baton.workload import first, generate, load_trace, reasoning_spec

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_conv_2023.csv"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def timed(requests, cluster, policy, closed_form=True):
    t0 = time.perf_counter()
    result = simulate(requests, cluster, policy, closed_form=closed_form)
    wall = time.perf_counter() - t0
    return wall, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reasoning-requests", type=int, default=20_000)
    ap.add_argument("--reasoning-rate", type=float, default=14.0, help="requests/s (decode-bound)")
    ap.add_argument("--subset", type=int, default=300, help="requests in the mode comparison")
    ap.add_argument("--scale", action="store_true", help="also the 1,024-instance and scaling runs (long)")
    ap.add_argument("--vidur", action="store_true", help="also whole processes against Vidur (long)")
    args = ap.parse_args()
    out: dict[str, float | None] = {}

    if TRACE.is_file():
        reqs = load_trace(TRACE)
        wall, res = timed(reqs, ClusterSpec(prefill=4, decode=4), "least-loaded")
        print(f"azure conv 4P4D: {len(reqs)} requests, wall {wall:.2f} s, "
              f"{res.output_tokens / wall:,.0f} simulated output tok per wall s, events {res.counters.events}")
        out["azure_conv_4p4d_wall_s"] = round(wall, 3)
    else:
        print(f"azure conv 4P4D: skipped ({TRACE} not found)")
        out["azure_conv_4p4d_wall_s"] = None

    reqs = generate(reasoning_spec(args.reasoning_requests, args.reasoning_rate), np.random.default_rng(0))
    mean_out = float(np.mean([r.output_tokens for r in reqs]))
    wall, res = timed(reqs, ClusterSpec(prefill=16, decode=64), "least-loaded")
    print(f"reasoning 16P64D: {len(reqs)} requests (mean output {mean_out:.0f}), wall {wall:.2f} s, "
          f"{res.output_tokens / wall:,.0f} simulated output tok per wall s, events {res.counters.events}, "
          f"simulated {res.makespan_s:.0f} s")
    out["reasoning_16p64d_wall_s"] = round(wall, 3)

    subset = first(reqs, args.subset)
    cluster = ClusterSpec(prefill=2, decode=8)
    fast_wall, fast = timed(subset, cluster, "least-loaded", closed_form=True)
    ref_wall, ref = timed(subset, cluster, "least-loaded", closed_form=False)
    worst = max(abs(a.e2e_s - b.e2e_s) / b.e2e_s for a, b in zip(fast.records, ref.records) if a.finished)
    speedup = ref_wall / fast_wall
    print(f"closed form vs per-iteration on {len(subset)} requests 2P8D: {fast_wall:.2f} s vs "
          f"{ref_wall:.2f} s = {speedup:.1f}x faster; events {fast.counters.events} vs "
          f"{ref.counters.events}; worst relative e2e difference {worst:.1e}")
    out["closed_form_speedup"] = round(speedup, 2)
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    print(f"peak RSS {out['peak_rss_mib']} MiB")
    if args.scale:
        scale(out)
    if args.vidur:
        against_vidur(out)
    print(json.dumps(out))


def demo_at(instances: int, requests: int):
    """The demo's workload at its rate per instance, on ``instances`` (1:3 prefill to decode)."""
    from dataclasses import replace as dc_replace
    from baton.cli.commands import demo_experiment
    exp = demo_experiment()
    per_instance = exp.workload.synthetic.rate_rps / (exp.cluster.prefill + exp.cluster.decode)
    spec = dc_replace(exp.workload.synthetic, requests=requests, rate_rps=per_instance * instances)
    return generate(spec, np.random.default_rng(0)), ClusterSpec(prefill=instances // 4, decode=instances - instances // 4)


def whole_process(instances: int, requests: int) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of one simulation in a fresh Python process."""
    import subprocess
    code = ("import sys, time, resource; sys.path.insert(0, %r); import sim_speed as s; "
            "reqs, cl = s.demo_at(%d, %d); t = time.perf_counter(); s.simulate(reqs, cl, 'least-loaded'); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
            % (str(Path(__file__).parent), instances, requests))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall, rss = done.stdout.split()[-2:]
    return float(wall), float(rss)


def scale(out: dict) -> None:
    per_req = {}
    for instances, requests in ((16, 3125), (256, 50_000), (1024, 200_000)):
        wall, rss = whole_process(instances, requests)
        per_req[instances] = wall / requests
        print(f"demo workload, {instances} instances (least-loaded), {requests} requests: simulation {wall:.1f} s, "
              f"{per_req[instances] * 1e6:.0f} us per request, peak RSS {rss:.0f} MiB", flush=True)
        if instances == 1024:
            out["wall_s_1024"], out["rss_mib_1024"] = round(wall, 2), round(rss, 1)
    out["per_request_1024_over_16"] = round(per_req[1024] / per_req[16], 3)
    by_requests = {200_000: per_req[1024]}
    for requests in (10_000, 50_000):
        wall, _ = whole_process(1024, requests)
        by_requests[requests] = wall / requests
        print(f"demo workload, 1024 instances, {requests} requests: {wall:.1f} s, "
              f"{by_requests[requests] * 1e6:.0f} us per request", flush=True)
    out["per_request_200k_over_10k"] = round(by_requests[200_000] / by_requests[10_000], 3)
    print(f"wall per request: 1,024 over 16 instances {out['per_request_1024_over_16']}x (target <= 1.5); "
          f"200k over 10k requests {out['per_request_200k_over_10k']}x (target <= 1.2); 1,024 instances with "
          f"200k requests {out['wall_s_1024']} s (target <= 60), {out['rss_mib_1024']} MiB (target < 2,048)")


def against_vidur(out: dict) -> None:
    """Whole-process wall time of Vidur over Baton's on the same requests."""
    import tempfile
    sys.path.insert(0, str(Path(__file__).parent))
    from fidelity import LLAMA70, Case, baton_whole_process_s, vidur_case
    from vidur_runner import ensure_hub, ensure_vidur, run_vidur

    python = ensure_vidur()
    ensure_hub()
    with tempfile.TemporaryDirectory() as work:
        # an untimed small run first: Vidur trains and caches its forests on first use
        run_vidur(python, vidur_case(Case("warm", LLAMA70, 1, 256, 4096, 10.0, 0.3), 0.3, 200), Path(work) / "warm")
        for key, replicas, n in (("vidur_speedup_10k", 1, 10_000), ("vidur_speedup_50k", 16, 50_000)):
            case = Case(f"speed-{n}", LLAMA70, replicas, 256, 4096, 10.0, 0.3 * replicas)
            run = run_vidur(python, vidur_case(case, case.rate_rps, n), Path(work) / key)
            if run is None:
                print(f"{key}: Vidur crashed on a preemption; no ratio")
                out[key] = None
                continue
            baton_s = baton_whole_process_s(run.metrics, case)
            out[key] = round(run.wall_s / baton_s, 2)
            print(f"whole processes, {n:,} requests on {replicas} replica(s): Vidur {run.wall_s:.1f} s, "
                  f"baton simulate {baton_s:.1f} s = {out[key]}x (targets: >= 20x at 10k, >= 30x at 50k)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
