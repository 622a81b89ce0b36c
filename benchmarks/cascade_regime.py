"""CascadeInfer in its regime, and its planner guarded.

    python benchmarks/cascade_regime.py [--repeats 3] [--requests 20000] [--out DIR]

16 colocated Llama-3.2-3B instances on H100 (``examples/cascade-16.yaml``), for colocated
round-robin (the paper's vLLM baseline), ``cascade`` (the paper's planner: a plan every
10 s from the period's statistics, the first at the first tick) and ``cascade-guarded``
(Baton's guard, ``policies/cascade_guard.py``: the first plan after 10 s of statistics, a
new plan only when it gains more than its moves cost plus 5%, every stage left the
instances its arrivals' prefills need):

(1) ShareGPT-like lengths (lognormal prompts, median 250, outputs, median 300; Poisson),
SLO TTFT 0.25 s, TPOT 20 ms: the max sustainable rate at 90% attainment per repeat (seeds
draw different requests), and each policy over colocated round-robin as paired ratios
(the issue's held-out target: >= 1.1x).
(2) Throughput under heavy load, as the paper's Figure 10 measures it (completed requests
and output tokens per second over the run, SLO aside), at ``--overload`` req/s, with the
engines' batch cap at Baton's default (``max_num_seqs`` 256) and at the paper's 1,024.
(3) The long-context multi-turn regime: the sessions workload with long histories (system
prompts of 2,000 tokens, 8 turns on average, answers of 400), at the same overload:
throughput, and each policy's planner outcomes (plans adopted, kept, repaired, merged).

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cache_aware import interval, ratio_interval  # noqa: E402

from baton.experiments.config import load_experiment  # noqa: E402
from baton.experiments.sweep import run_point, run_sweep  # noqa: E402
from baton.workload.sessions import SessionsSpec  # noqa: E402

POLICIES = {"colocated-rr": "colocated-rr", "cascade": "cascade", "cascade-guarded": "cascade-guarded"}
RATES = [300.0, 400.0, 500.0, 600.0, 700.0]
LONG_SESSIONS = SessionsSpec(sessions=1000, session_rate=200.0, system_prompts=64, system_tokens=2000,
                             turns_mean=8.0, output_median=400.0, think_s=5.0, max_context=32768)


def base(requests: int):
    exp = load_experiment(ROOT / "examples" / "cascade-16.yaml")
    return replace(exp, workload=replace(exp.workload, synthetic=replace(exp.workload.synthetic, requests=requests)))


def capacity(args, out: dict) -> None:
    per_seed = {name: [] for name in POLICIES}
    statuses = {name: [] for name in POLICIES}  # knee / capped (a lower bound) / not measurable (counted 0)
    for seed in range(args.repeats):
        result = run_sweep(replace(base(args.requests), seed=seed), POLICIES, RATES)
        for name, knee in result.knees().items():
            per_seed[name].append(knee.rate_rps or 0.0)
            statuses[name].append(knee.status)
        print(f"  sharegpt-like: repeat {seed + 1}/{args.repeats} swept", flush=True)
    print("ShareGPT-like, 16 x llama-3.2-3b@h100: max sustainable rate at 90% attainment (req/s)")
    for name, values in per_seed.items():
        m, lo, hi = interval(values)
        odd = [s for s in statuses[name] if s != "knee"]
        print(f"  {name:<16} {m:7.1f} [{lo:7.1f}, {hi:7.1f}]   per repeat {[round(v, 1) for v in values]}"
              + (f"  ({', '.join(odd)})" if odd else ""))
        out[f"sharegpt_{name.replace('-', '_')}_max_rate_status"] = statuses[name]
        out[f"sharegpt_{name.replace('-', '_')}_max_rate_rps"] = m
        out[f"sharegpt_{name.replace('-', '_')}_max_rate_per_repeat"] = values
    for name in ("cascade", "cascade-guarded"):
        g, lo, hi = ratio_interval(per_seed[name], per_seed["colocated-rr"])
        print(f"  {name} over colocated-rr: {g:.3f}x [{lo:.3f}, {hi:.3f}] (held-out target >= 1.1x)")
        out[f"sharegpt_{name.replace('-', '_')}_over_rr"] = g
        out[f"sharegpt_{name.replace('-', '_')}_over_rr_ci95"] = [lo, hi]


def _throughput(exp, rate: float, seeds: int) -> dict[str, dict[str, tuple[float, float, float]]]:
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(name, replace(exp, policy=pol, seed=s)) for name, pol in POLICIES.items() for s in range(seeds)]
    with ProcessPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(run_point, [e for _, e in jobs], [rate] * len(jobs)))
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for name in POLICIES:
        mine = [r for (n, _), r in zip(jobs, runs) if n == name]
        out[name] = {k: interval([r.get(k, math.nan) for r in mine])
                     for k in ("throughput_rps", "throughput_tok_s", "slo_attainment", "cascade_plans_adopted",
                               "cascade_plans_kept", "cascade_plans_repaired", "cascade_plans_merged")}
    return out


def heavy(args, out: dict) -> None:
    for cap in (256, 1024):
        exp = base(args.requests)
        exp = replace(exp, cluster=replace(exp.cluster, engine=replace(exp.cluster.engine, max_num_seqs=cap)))
        _report(f"ShareGPT-like at {args.overload:g} req/s, max_num_seqs {cap}", _throughput(exp, args.overload,
                args.repeats), out, f"heavy_{cap}")
    exp = replace(base(args.requests), workload=replace(base(args.requests).workload, sessions=LONG_SESSIONS))
    _report(f"long-context sessions at {args.sessions_rate:g} req/s", _throughput(exp, args.sessions_rate,
            args.repeats), out, "sessions")


def _report(label: str, res: dict, out: dict, key: str) -> None:
    print(f"{label}: throughput (req/s; output tokens/s), attainment; plans adopted / kept / repaired / merged")
    for name, figs in res.items():
        rps, tps, att = figs["throughput_rps"], figs["throughput_tok_s"], figs["slo_attainment"]
        plans = " / ".join(f"{figs[f'cascade_plans_{k}'][0]:.1f}" for k in ("adopted", "kept", "repaired", "merged"))
        print(f"  {name:<16} {rps[0]:7.1f} [{rps[1]:7.1f}, {rps[2]:7.1f}]  {tps[0]:9.0f}  att {att[0]:.3f}  "
              f"plans {plans if name == 'cascade-guarded' else '-'}")
        out[f"{key}_{name.replace('-', '_')}_throughput_rps"] = rps[0]
        out[f"{key}_{name.replace('-', '_')}_output_tokens_per_s"] = tps[0]
        out[f"{key}_{name.replace('-', '_')}_slo_attainment"] = att[0]
    for name in ("cascade", "cascade-guarded"):
        ratio = res[name]["throughput_rps"][0] / res["colocated-rr"]["throughput_rps"][0]
        print(f"  {name} / colocated-rr throughput: {ratio:.3f}x")
        out[f"{key}_{name.replace('-', '_')}_throughput_over_rr"] = ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--overload", type=float, default=800.0, help="heavy load, req/s (ShareGPT-like)")
    ap.add_argument("--sessions-rate", type=float, default=100.0, help="heavy load, req/s (long sessions)")
    ap.add_argument("--skip-capacity", action="store_true")
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    out: dict = {}
    if not args.skip_capacity:
        capacity(args, out)
    heavy(args, out)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}))
    if args.record:
        from baton.report.results import record
        record("cascade-regime", out, time.perf_counter() - started,
               "python benchmarks/cascade_regime.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
