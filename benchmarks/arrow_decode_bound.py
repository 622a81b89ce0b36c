"""Does Arrow act when the decode side is full? Requests waiting for a decode instance's
KV blocks, Arrow's role changes, and SLO attainment, on a cluster whose decode side is
too small for the traffic.

    python benchmarks/arrow_decode_bound.py [--requests 6000] [--rates 45,60,80] [--start 6,2]

The Azure conversation trace (the first ``--requests``, arrivals rescaled to each rate),
8 ``llama-3.1-8b@a100-80g`` instances started at ``--start`` (6P2D: two decode instances
for short prompts and short answers), the project's SLOs for it (TTFT 3 s, TPOT 0.1 s).
Above its knee the two decode instances' KV fills and PD handoffs queue for their blocks
while their batches stay well under the TPOT SLO: a policy sees that only through the
requests booked on them (``running_tokens``: Arrow's decode load), not through token
intervals. Per system and rate: attainment, role changes, the share of requests whose
handoff waited for blocks and their median wait, and median TTFT. Needs
../shared/traces/azure_conv_2023.csv (exits 0 with a note when it is absent). The last
line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from baton.metrics import SLO  # noqa: E402
from baton.sim import ClusterSpec, simulate  # noqa: E402
from baton.workload import load_trace  # noqa: E402
from baton.workload.transform import scale_to_rate, window  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "azure_conv_2023.csv"
PRESET = "llama-3.1-8b@a100-80g"
SLO_CONV = SLO(ttft_s=3.0, tpot_s=0.1)
SYSTEMS = ("arrow", "arrow-static", "least-loaded", "combined")


def run(requests: list, rate: float, policy: str, start: tuple[int, int]) -> dict:
    """One run's figures: attainment, role changes, waits for decode blocks, TTFT."""
    cluster = ClusterSpec(prefill=start[0], decode=start[1], preset=PRESET)
    result = simulate(scale_to_rate(requests, rate), cluster, policy, slo=SLO_CONV)
    summary = result.summary(SLO_CONV)
    done = [r for r in result.records if r.finished]
    waits = np.array([r.receive_wait_s for r in done if r.receive_wait_s > 0])
    return {"slo_attainment": round(summary["slo_attainment"], 3), "role_changes": int(summary["role_changes"]),
            "waited_for_blocks": round(waits.size / max(len(done), 1), 3),
            "p50_block_wait_s": round(float(np.median(waits)), 2) if waits.size else 0.0,
            "p50_ttft_s": round(summary["p50_ttft_s"], 2), "steady": int(summary["steady"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6000, help="first N requests of the trace")
    ap.add_argument("--rates", default="45,60,80", help="request rates to run (req/s, comma-separated)")
    ap.add_argument("--start", default="6,2", help="prefill,decode instances at the start")
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    try:
        rates = [float(x) for x in args.rates.split(",")]
        start = tuple(int(x) for x in args.start.split(","))
        assert len(start) == 2 and min(start) >= 1 and min(rates) > 0
    except (ValueError, AssertionError):
        sys.exit(f"--rates {args.rates!r} / --start {args.start!r}: expected positive rates and two counts >= 1")
    if not TRACE.exists():
        print(f"{TRACE} absent: nothing to run")
        return
    requests = window(load_trace(TRACE), 0, args.requests)
    figures: dict = {"requests": len(requests), "start": list(start), "preset": PRESET}
    print(f"Azure conversation, {len(requests)} requests, {start[0]}P{start[1]}D {PRESET}, SLO TTFT 3 s TPOT 0.1 s")
    print(f"  {'rate':>5} {'system':<13} {'attain':>7} {'flips':>6} {'waited':>7} {'p50 wait s':>10} "
          f"{'p50 TTFT s':>10} {'steady':>6}")
    for rate in rates:
        for policy in SYSTEMS:
            t0 = time.monotonic()
            f = figures.setdefault(f"{rate:g}", {})[policy] = run(requests, rate, policy, start)
            print(f"  {rate:5g} {policy:<13} {f['slo_attainment']:7.3f} {f['role_changes']:6d} "
                  f"{f['waited_for_blocks']:7.1%} {f['p50_block_wait_s']:10.2f} {f['p50_ttft_s']:10.2f} "
                  f"{'yes' if f['steady'] else 'no':>6}   ({time.monotonic() - t0:.0f} s)", flush=True)
    print(json.dumps(figures))
    if args.record:
        from baton.report.results import record
        record("arrow-decode-bound", figures, time.perf_counter() - started,
               "python benchmarks/arrow_decode_bound.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
