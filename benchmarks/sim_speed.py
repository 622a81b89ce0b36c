"""Simulator speed: wall time, simulated output tokens per wall second, peak memory.

Runs (1) the Azure conversation trace on 4P4D (skipped when the trace is absent),
(2) a synthetic reasoning workload of 20,000 requests (mean output ~5,000, cap 8,192)
on 16P64D, and (3) closed-form vs per-iteration mode on a subset, measured in the same
run. The last line is one JSON object.
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
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
