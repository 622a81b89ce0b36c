"""Simulator speed: CPU per simulated request (against a git revision), wall time at 1,024
instances, simulated tokens per wall second, peak memory, and whole processes against Vidur.

Without flags it measures every figure it can on this machine:

1. the Vidur-shaped cases, each simulation in its own fresh process (the fidelity
   benchmark's light case: Llama-2-70B TP2 on A100s, Vidur's uniform request lengths of
   256-4,096 tokens at 10:1 prompt to output, Poisson at 0.3 req/s per replica, colocated
   round-robin, 512-token chunks, 128 sequences, exact view): 10,000 requests on 1 replica
   and 50,000 on 16; median CPU seconds of the simulation per simulated request over
   ``--repeats`` runs (``cpu_us_per_request_10k``, ``_50k``);
2. ``combined`` against ``least-loaded`` on the same trace, CPU per simulated request
   (``combined_over_least_loaded``: the demo workload on 4P12D at its rate per instance;
   medians of ``--repeats`` interleaved runs of each);
3. the Azure conversation trace on 4P4D (when ``../shared/traces/`` has it), a synthetic
   reasoning workload of 20,000 requests on 16P64D, closed form against per-iteration mode
   on a subset (``closed_form_speedup``, the worst relative e2e difference), peak RSS;
4. the demo's built-in workload at its rate per instance on 1,024 instances (256P768D) with
   200,000 requests in a fresh process (``wall_s_1024``, ``rss_mib_1024``), and how wall
   per request grows with instances (16, 256, 1,024) and requests (10k, 50k, 200k).

``--against REV`` also runs the Vidur-shaped cases and the 1,024-instance case on the code
of git revision REV (exported with ``git archive``), interleaved with this tree's runs so
that machine noise falls on both alike, and reports the ratios (``cpu_ratio_10k``,
``cpu_ratio_50k``: REV's CPU per request over this tree's; ``wall_ratio_1024``). ``--vidur``
adds both simulators as whole processes on the same requests (Vidur 0.0.26 from the
fidelity benchmark's install, its forests trained by an untimed first run; ``baton
simulate`` on Vidur's own request metrics, start-up included): ``vidur_speedup_10k`` and
``vidur_speedup_50k`` (``--vidur-only``: that part alone). ``--quick`` skips part 4. The
last line is one JSON object; a key is absent only when its part was skipped or its input
is not on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "azure_conv_2023.csv"
VIDUR_CASES = {"10k": (10_000, 1), "50k": (50_000, 16)}

# One simulation in a fresh process, on whichever tree PYTHONPATH names; only APIs both
# trees have. Prints {"cpu_s", "wall_s", "rss_mib", "requests"}.
CHILD = r'''
import json, resource, sys, time
import numpy as np
kind, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from baton.core.request import Request
from baton.sim import ClusterSpec, EngineConfig, simulate
if kind == "vidur":
    from baton.core.info import InfoModel, ViewMode
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1.0 / (0.3 * size), n))
    total = rng.integers(256, 4097, n)
    prompt = np.maximum(1, (total * 10.0 / 11.0).astype(np.int64))
    reqs = [Request(i, float(a), int(p), int(max(1, t - p))) for i, (a, p, t) in enumerate(zip(arrivals, prompt, total))]
    cluster = ClusterSpec(prefill=0, decode=0, mixed=size, preset="llama-2-70b-tp2@a100-80g",
                          engine=EngineConfig(512, 128, 16, max_model_len=4096))
    args = (reqs, cluster, "colocated-rr")
    kwargs = {"info": InfoModel(ViewMode.EXACT)}
else:  # the demo's workload at its rate per instance, 1:3 prefill to decode
    from dataclasses import replace
    from baton.cli.commands import demo_experiment
    from baton.workload import generate
    exp = demo_experiment()
    per_instance = exp.workload.synthetic.rate_rps / (exp.cluster.prefill + exp.cluster.decode)
    spec = replace(exp.workload.synthetic, requests=n, rate_rps=per_instance * size)
    reqs = generate(spec, np.random.default_rng(0))
    args = (reqs, ClusterSpec(prefill=size // 4, decode=size - size // 4), kind)
    kwargs = {}
cpu0, wall0 = time.process_time(), time.perf_counter()
simulate(*args, **kwargs)
print(json.dumps({"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "requests": n}))
'''


def child(src: Path, kind: str, n: int, size: int) -> dict:
    """One simulation in a fresh process on the tree whose ``src`` is given."""
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run([sys.executable, "-c", CHILD, kind, str(n), str(size)], capture_output=True,
                          text=True, env=env, cwd=src.parent)
    if done.returncode != 0:
        sys.exit(f"sim_speed: the run on {src} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def export(rev: str, into: Path) -> Path:
    """The ``src`` folder of git revision ``rev``, exported under ``into``."""
    archive = into / "rev.tar"
    with archive.open("wb") as out:
        done = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], stdout=out, stderr=subprocess.PIPE)
    if done.returncode != 0:
        sys.exit(f"sim_speed: --against {rev}: {done.stderr.decode().strip()}")
    with tarfile.open(archive) as tar:  # our own repository's files; the data filter where Python has it
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return into / "src"


def vidur_shaped(out: dict, trees: dict[str, Path], repeats: int) -> None:
    """Median CPU per simulated request of each tree, runs interleaved; ratios against this tree."""
    cpu: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in VIDUR_CASES}
    for r in range(repeats):
        for case, (n, replicas) in VIDUR_CASES.items():
            for tree, src in trees.items():
                cpu[(tree, case)].append(child(src, "vidur", n, replicas)["cpu_s"] / n)
        print(f"repeat {r + 1}/{repeats}: " + ", ".join(
            f"{t} {c} {cpu[(t, c)][-1] * 1e6:.0f} us/request" for t in trees for c in VIDUR_CASES), flush=True)
    for case, (n, replicas) in VIDUR_CASES.items():
        here = statistics.median(cpu[("this", case)])
        out[f"cpu_us_per_request_{case}"] = round(here * 1e6, 1)
        line = f"Vidur-shaped {n:,} requests on {replicas} replica(s): {here * 1e6:.0f} us CPU per request"
        if "rev" in trees:
            there = statistics.median(cpu[("rev", case)])
            out[f"cpu_ratio_{case}"] = round(there / here, 3)
            line += f" against {there * 1e6:.0f} at the revision = {there / here:.2f}x less (target >= 1.8x)"
        print(line, flush=True)


def combined_cost(out: dict, src: Path, repeats: int) -> None:
    """``combined`` over ``least-loaded``, CPU per simulated request, demo workload on 4P12D:
    each policy's median of ``repeats`` runs, the two interleaved (one unpaired run each
    read 1.90x and 2.12x on this machine minutes apart)."""
    n = 6_000
    runs: dict[str, list[float]] = {"least-loaded": [], "combined": []}
    for _ in range(repeats):
        for p, cpu_s in runs.items():
            cpu_s.append(child(src, p, n, 16)["cpu_s"] / n)
    cpu = {p: statistics.median(v) for p, v in runs.items()}
    out["combined_over_least_loaded"] = round(cpu["combined"] / cpu["least-loaded"], 3)
    print(f"demo workload, 16 instances, {n:,} requests: combined {cpu['combined'] * 1e6:.0f} us CPU per request, "
          f"least-loaded {cpu['least-loaded'] * 1e6:.0f} = {out['combined_over_least_loaded']}x (target <= 2x)",
          flush=True)


def scale(out: dict, trees: dict[str, Path]) -> None:
    per_req = {}
    for instances, requests in ((16, 3125), (256, 50_000), (1024, 200_000)):
        run = child(trees["this"], "least-loaded", requests, instances)
        per_req[instances] = run["wall_s"] / requests
        print(f"demo workload, {instances} instances (least-loaded), {requests} requests: simulation "
              f"{run['wall_s']:.1f} s, {per_req[instances] * 1e6:.0f} us per request, peak RSS {run['rss_mib']:.0f} MiB",
              flush=True)
        if instances == 1024:
            out["wall_s_1024"], out["rss_mib_1024"] = round(run["wall_s"], 2), round(run["rss_mib"], 1)
            if "rev" in trees:
                before = child(trees["rev"], "least-loaded", requests, instances)["wall_s"]
                out["wall_ratio_1024"] = round(before / run["wall_s"], 3)
                print(f"  at the revision: {before:.1f} s = {out['wall_ratio_1024']}x", flush=True)
    out["per_request_1024_over_16"] = round(per_req[1024] / per_req[16], 3)
    by_requests = {200_000: per_req[1024]}
    for requests in (10_000, 50_000):
        by_requests[requests] = child(trees["this"], "least-loaded", requests, 1024)["wall_s"] / requests
    out["per_request_200k_over_10k"] = round(by_requests[200_000] / by_requests[10_000], 3)
    print(f"wall per request: 1,024 over 16 instances {out['per_request_1024_over_16']}x (target <= 1.5); "
          f"200k over 10k requests {out['per_request_200k_over_10k']}x (target <= 1.2); 1,024 instances with "
          f"200k requests {out['wall_s_1024']} s (target <= 40), {out['rss_mib_1024']} MiB (target < 2,048)",
          flush=True)


def in_process(out: dict, reasoning_requests: int, subset_n: int) -> None:
    """The trace, reasoning and mode-comparison runs, in this process."""
    import numpy as np

    from baton.sim import ClusterSpec, simulate
    from baton.workload import first, generate, load_trace, reasoning_spec

    if TRACE.is_file():
        reqs = load_trace(TRACE)
        t0 = time.perf_counter()
        res = simulate(reqs, ClusterSpec(prefill=4, decode=4), "least-loaded")
        wall = time.perf_counter() - t0
        print(f"azure conv 4P4D: {len(reqs)} requests, wall {wall:.2f} s, "
              f"{res.output_tokens / wall:,.0f} simulated output tok per wall s, events {res.counters.events}")
        out["azure_conv_4p4d_wall_s"] = round(wall, 3)
    else:
        print(f"azure conv 4P4D: skipped ({TRACE} not found)")
    reqs = generate(reasoning_spec(reasoning_requests, 14.0), np.random.default_rng(0))
    t0 = time.perf_counter()
    res = simulate(reqs, ClusterSpec(prefill=16, decode=64), "least-loaded")
    wall = time.perf_counter() - t0
    print(f"reasoning 16P64D: {len(reqs)} requests (mean output {np.mean([r.output_tokens for r in reqs]):.0f}), "
          f"wall {wall:.2f} s, {res.output_tokens / wall:,.0f} simulated output tok per wall s, "
          f"events {res.counters.events}, simulated {res.makespan_s:.0f} s")
    out["reasoning_16p64d_wall_s"] = round(wall, 3)
    subset, cluster = first(reqs, subset_n), ClusterSpec(prefill=2, decode=8)
    walls, results = [], []
    for closed_form in (True, False):
        t0 = time.perf_counter()
        results.append(simulate(subset, cluster, "least-loaded", closed_form=closed_form))
        walls.append(time.perf_counter() - t0)
    fast, ref = results
    worst = max(abs(a.e2e_s - b.e2e_s) / b.e2e_s for a, b in zip(fast.records, ref.records) if a.finished)
    out["closed_form_speedup"] = round(walls[1] / walls[0], 2)
    out["closed_form_worst_relative_e2e"] = float(f"{worst:.2e}")
    print(f"closed form vs per-iteration on {len(subset)} requests 2P8D: {walls[0]:.2f} s vs {walls[1]:.2f} s = "
          f"{out['closed_form_speedup']}x faster; events {fast.counters.events} vs {ref.counters.events}; "
          f"worst relative e2e difference {worst:.1e}")
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", metavar="REV", help="also run a git revision's code, interleaved, and print ratios")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of each Vidur-shaped case per tree, and of each policy in the combined cost (median)")
    ap.add_argument("--reasoning-requests", type=int, default=20_000)
    ap.add_argument("--subset", type=int, default=300, help="requests in the mode comparison")
    ap.add_argument("--quick", action="store_true", help="skip the 1,024-instance and scaling runs (minutes)")
    ap.add_argument("--vidur", action="store_true", help="also whole processes against Vidur (installs it; long)")
    ap.add_argument("--vidur-only", action="store_true", help="only the whole processes against Vidur")
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    sys.path.insert(0, str(ROOT / "src"))
    out: dict[str, float] = {}
    if args.vidur_only:
        against_vidur(out)
        print(json.dumps(out))
        if args.record:
            from baton.report.results import record
            record("sim-speed-vidur", out, time.perf_counter() - started,
                   "python benchmarks/sim_speed.py " + " ".join(sys.argv[1:]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": ROOT / "src"}
        if args.against:
            trees["rev"] = export(args.against, Path(tmp))
        vidur_shaped(out, trees, args.repeats)
        combined_cost(out, trees["this"], args.repeats)
        in_process(out, args.reasoning_requests, args.subset)
        if not args.quick:
            scale(out, trees)
    if args.vidur:
        against_vidur(out)
    print(json.dumps(out))
    if args.record:
        from baton.report.results import record
        record("sim-speed", {**out, "against": args.against}, time.perf_counter() - started,
               "python benchmarks/sim_speed.py " + " ".join(sys.argv[1:]))


def against_vidur(out: dict) -> None:
    """Whole-process wall time of Vidur over Baton's on the same requests."""
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
                continue
            baton_s = baton_whole_process_s(run.metrics, case)
            out[key] = round(run.wall_s / baton_s, 2)
            print(f"whole processes, {n:,} requests on {replicas} replica(s): Vidur {run.wall_s:.1f} s, "
                  f"baton simulate {baton_s:.1f} s = {out[key]}x (targets: >= 20x at 10k, >= 30x at 50k)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
