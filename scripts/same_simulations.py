"""Whether the code in this checkout simulates exactly as a git revision does.

    python scripts/same_simulations.py REV [--policies a,b,...] [--requests N] [--workloads a,b,...] [--large] [--show]

Runs the same simulations under ``REV`` (exported with ``git archive`` to a temporary
directory) and under the working tree, each in its own process, and compares every figure
of every run summary (wall time left out). The runs: the first ``--requests`` requests of
each workload, on 8 mixed instances and on 2P6D (with ``--large`` also on 40P120D, at 20 times
the rate and with 20 times the requests: the view's columnar reads, which start above 32
instances, and its pruned least-load read, above 128), under each policy. Workloads (default
``sessions,mooncake``): ``sessions`` (14 req/s), ``mooncake`` (the Mooncake conversation
trace, 2 req/s), ``azure-code`` and ``azure-conv`` (the Azure 2023 traces, 5 and 30 req/s),
``reasoning`` (the synthetic long-output workload, 3 req/s); a trace absent from
``../shared/traces/`` is skipped and named, and a run that compares nothing exits 2.
A speed-up that claims to change no simulation is checked with it; it exits 1 and names
the runs that differ, 0 when all agree. ``--show`` prints, under each run that differs, the
headline figures before and after (mean and p99 TTFT, mean TPOT, p99 TBT, SLO attainment,
preemptions) with the relative change.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
WORKLOADS = ("sessions", "mooncake", "azure-code", "azure-conv", "reasoning")
DEFAULT_POLICIES = "least-loaded,sibyl,prefix-precise,prefix-approx,kv-cost,cache-aware,combined"

RUNS = r'''
import json, sys
from dataclasses import replace
from pathlib import Path
import numpy as np
from baton.metrics import SLO
from baton.sim import ClusterSpec, simulate
from baton.workload import load_trace
from baton.workload.sessions import SessionsSpec, generate_sessions
from baton.workload.transform import scale_to_rate

from baton.workload import generate, reasoning_spec

policies, n, traces, names = sys.argv[1].split(","), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4].split(",")
large = sys.argv[5] == "large"
count = n * (20 if large else 1)  # requests each workload provides (the large cluster takes all)
TRACES = {"mooncake": ("mooncake_conversation.jsonl", 2.0), "azure-code": ("azure_code_2023.csv", 5.0),
          "azure-conv": ("azure_conv_2023.csv", 30.0)}
workloads = []
for name in names:
    if name == "sessions":
        workloads.append((name, generate_sessions(SessionsSpec(), np.random.default_rng(0))[:count], 14.0))
    elif name == "reasoning":
        workloads.append((name, generate(reasoning_spec(count, 1.0), np.random.default_rng(0)), 3.0))
    elif (traces / TRACES[name][0]).is_file():
        window = load_trace(traces / TRACES[name][0])[:count]
        t0 = window[0].arrival_s
        workloads.append((name, [replace(r, req_id=i, arrival_s=r.arrival_s - t0)
                                 for i, r in enumerate(window)], TRACES[name][1]))
clusters = {"8 mixed": ClusterSpec(prefill=0, decode=0, mixed=8, preset="llama-3.1-8b@a100-80g"),
            "2P6D": ClusterSpec(prefill=2, decode=6, preset="llama-3.1-8b@a100-80g")}
if large:
    clusters["40P120D"] = ClusterSpec(prefill=40, decode=120, preset="llama-3.1-8b@a100-80g")
out = {}
for name, requests, rate in workloads:
    for layout, cluster in clusters.items():
        scale = 20 if layout == "40P120D" else 1
        reqs = scale_to_rate(requests if scale > 1 else requests[:n], rate * scale)
        for policy in policies:
            summary = simulate(reqs, cluster, policy).summary(SLO(ttft_s=2.0, tpot_s=0.1))
            summary.pop("wall_s", None)
            out[f"{name}, {layout}, {policy}"] = summary
print(json.dumps(out, default=repr))
'''


def summaries(src: Path, policies: str, requests: int, workloads: str, large: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run([sys.executable, "-c", RUNS, policies, str(requests), str(TRACES), workloads,
                           "large" if large else "small"],
                          capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"the simulations under {src} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def differing(before: dict, after: dict) -> list[str]:
    """The runs of ``before`` whose summary ``after`` does not repeat figure for figure
    (a run missing from ``after`` differs)."""
    return [run for run in before
            if json.dumps(before[run], sort_keys=True) != json.dumps(after.get(run), sort_keys=True)]


SHOWN = ("mean_ttft_s", "p99_ttft_s", "mean_tpot_s", "p99_tbt_s", "slo_attainment", "preemptions")


def show(before: dict, after: dict) -> str:
    """The headline figures of one run, before -> after (relative change)."""
    parts = []
    for key in SHOWN:
        a, b = before.get(key), after.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            change = f" ({(b - a) / a:+.2%})" if a else ""
            parts.append(f"{key} {a:.4g} -> {b:.4g}{change}")
    return "         " + "; ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the git revision to compare against (e.g. HEAD~1)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--workloads", default="sessions,mooncake",
                    help=f"a comma-separated list of {', '.join(WORKLOADS)}")
    ap.add_argument("--large", action="store_true",
                    help="also run on 40P120D at 20 times the rate and the requests (the columnar reads)")
    ap.add_argument("--show", action="store_true", help="print the headline figures of each run that differs")
    args = ap.parse_args()
    unknown = sorted(set(args.workloads.split(",")) - set(WORKLOADS))
    if unknown:
        sys.exit(f"--workloads: unknown {', '.join(unknown)} (expected some of {', '.join(WORKLOADS)})")
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", args.rev], cwd=ROOT, capture_output=True)
        if archive.returncode:
            sys.exit(f"git archive {args.rev}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        before = summaries(Path(tmp) / "src", args.policies, args.requests, args.workloads, args.large)
    after = summaries(ROOT / "src", args.policies, args.requests, args.workloads, args.large)
    differ = differing(before, after)
    for run in before:
        print(f"{'DIFFERS' if run in differ else 'same   '}  {run}")
        if args.show and run in differ and run in after:
            print(show(before[run], after[run]))
    ran = {run.split(",")[0] for run in before}
    for name in args.workloads.split(","):
        if name not in ran:
            print(f"skipped  {name}: its trace is not in {TRACES}", file=sys.stderr)
    print(f"{len(before) - len(differ)} of {len(before)} runs identical to {args.rev}")
    if not before:
        print("nothing was compared", file=sys.stderr)
        return 2
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
