"""Arrow's headline experiment: the highest request rate each system sustains at 90% SLO
attainment on the Azure code and conversation traces (Arrow section 7, Table 1 SLOs).

    python benchmarks/arrow_sustainable.py [--requests N] [--nic-gbps G] [--traces code,conv] [--start P,D]

Systems (8 GPUs, Llama-3.1-8B, H100 standing in for the paper's H800):
- ``arrow``: 4P4D start, elastic pools;
- ``arrow-static``: the paper's "Minimal Load" ablation (Arrow's dispatch, fixed 4P4D);
- ``round-robin`` at 4P4D;
- ``static-xpyd`` 1P1D at TP 4 (the paper's vLLM-disaggregated) and 4P4D at TP 1;
- ``colocated`` on one TP-8 instance (the paper's vLLM baseline).
``--start 6,2`` starts the split systems at 6P2D instead (a decode-bound start on the
conversation trace: does Arrow move instances back to decode?). Links: ``--nic-gbps`` (default 3,200 = NVLink's 400 GB/s: the paper's single 8-GPU server
moves KV over NVLink). Rates: each trace's timestamps rescaled (``baton sweep``'s rule).
Prints a table, then one JSON line: per trace, per system, the sustainable rate (req/s).
Needs ../shared/traces/ (skips a trace that is absent).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from baton.experiments.config import Experiment, WorkloadConfig  # noqa: E402
from baton.experiments.sweep import run_sweep  # noqa: E402
from baton.metrics import SLO  # noqa: E402
from baton.sim import ClusterSpec  # noqa: E402

TRACES = {"code": ("azure_code_2023.csv", SLO(3.0, 0.1), [2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128]),
          "conv": ("azure_conv_2023.csv", SLO(2.0, 0.15), [8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160])}
SYSTEMS = {  # name: (policy, prefill, decode, mixed, preset)
    "arrow": ("arrow", 4, 4, 0, "llama-3.1-8b@h100"),
    "arrow-static": ("arrow-static", 4, 4, 0, "llama-3.1-8b@h100"),
    "round-robin 4P4D": ("round-robin", 4, 4, 0, "llama-3.1-8b@h100"),
    "static-xpyd 4P4D": ("static-xpyd", 4, 4, 0, "llama-3.1-8b@h100"),
    "static-xpyd 1P1D TP4": ("static-xpyd", 1, 1, 0, "llama-3.1-8b-tp4@h100"),
    "colocated TP8": ("colocated", 0, 0, 1, "llama-3.1-8b-tp8@h100"),
}


def systems(start: tuple[int, int]) -> dict:
    """``SYSTEMS`` with the 4P4D ones started at ``start`` (prefill, decode) instead."""
    if start == (4, 4):
        return SYSTEMS
    tag = f"{start[0]}P{start[1]}D"
    return {name.replace("4P4D", tag): (policy, *start, m, preset) if (p, d) == (4, 4) else (policy, p, d, m, preset)
            for name, (policy, p, d, m, preset) in SYSTEMS.items()}


def sustainable(trace: str, slo: SLO, rates: list[float], requests: int | None, nic_gbps: float,
                start: tuple[int, int] = (4, 4)) -> dict:
    out = {}
    for name, (policy, p, d, m, preset) in systems(start).items():
        exp = Experiment(cluster=ClusterSpec(prefill=p, decode=d, mixed=m, preset=preset, nic_gbps=nic_gbps),
                         workload=WorkloadConfig(trace=trace, requests=requests), slo=slo)
        t0 = time.monotonic()
        res = run_sweep(replace(exp), {name: policy}, rates)
        knee = res.knees()[name]  # each passing rate on a steady window (baton.experiments.steady)
        out[name] = {"max_sustainable_rate_rps": res.max_rates_rps()[name], "max_rate_status": knee.status,
                     "attainment": [round(x, 3) for x in res.series(name, "slo_attainment")],
                     "steady": [int(p.get("steady", 1)) for p in res.points[name]],
                     "role_changes": [int(x) for x in res.series(name, "role_changes")]}
        flips = max(out[name]["role_changes"], default=0)
        print(f"  {name:<22} {knee.text():>14} req/s ({knee.status}; most role changes in a run {flips}; "
              f"{time.monotonic() - t0:.0f} s)", flush=True)
    return out


def window_trace(path: Path, window: int, n: int) -> str:
    """Requests [window*n, (window+1)*n) of an Azure trace, as a temporary Azure CSV (for a
    held-out check on a part of the trace the default run never sees)."""
    import csv
    import tempfile
    with path.open() as handle:
        rows = list(csv.reader(handle))
    head, body = rows[0], rows[1 + window * n: 1 + (window + 1) * n]
    if len(body) < n:
        sys.exit(f"{path}: window {window} of {n} requests runs past the trace's {len(rows) - 1}")
    out = Path(tempfile.mkdtemp(prefix="baton-arrow-")) / f"{path.stem}-w{window}.csv"
    with out.open("w", newline="") as handle:
        csv.writer(handle).writerows([head, *body])
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000, help="first N requests of each trace (0: all)")
    ap.add_argument("--nic-gbps", type=float, default=3200.0, help="KV link per instance (Gbit/s)")
    ap.add_argument("--traces", default="code,conv")
    ap.add_argument("--window", type=int, default=0,
                    help="use requests [W*N, (W+1)*N) of each trace (N = --requests); 1 = held out")
    ap.add_argument("--start", default="4,4", help="prefill,decode instances the split systems start with")
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    try:
        start = tuple(int(x) for x in args.start.split(","))
        assert len(start) == 2 and min(start) >= 1 and sum(start) == 8
    except (ValueError, AssertionError):
        sys.exit(f"--start {args.start!r}: give prefill,decode instances adding up to 8 (e.g. 6,2)")
    figures: dict = {"requests": args.requests or None, "nic_gbps": args.nic_gbps, "window": args.window,
                     "start": list(start)}
    for key in args.traces.split(","):
        file, slo, rates = TRACES[key]
        path = ROOT.parent / "shared" / "traces" / file
        if not path.exists():
            print(f"{key}: {path} absent, skipped")
            continue
        print(f"{key} (TTFT {slo.ttft_s} s, TPOT {slo.tpot_s} s), rates {rates}:", flush=True)
        trace = window_trace(path, args.window, args.requests) if args.window and args.requests else str(path)
        figures[key] = sustainable(trace, slo, rates, args.requests or None, args.nic_gbps, start)
        arrow, static = (figures[key][k]["max_sustainable_rate_rps"] for k in ("arrow", "arrow-static"))
        if arrow and static:
            figures[key]["arrow_over_static"] = arrow / static
            print(f"  arrow / arrow-static: {arrow / static:.2f}x")
    print(json.dumps(figures))
    if args.record:
        from baton.report.results import record
        record("arrow-sustainable", figures, time.perf_counter() - started,
               "python benchmarks/arrow_sustainable.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
