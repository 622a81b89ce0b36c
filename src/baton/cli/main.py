"""The ``baton`` command: ``baton simulate`` and ``baton demo``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from baton.cli.config import Experiment, WorkloadConfig, load_experiment, with_cluster
from baton.cli.output import console, progress_bar, summary_table
from baton.core.errors import BatonError, ConfigError
from baton.metrics import SLO, write_records
from baton.sim import ClusterSpec, simulate
from baton.workload import FORMATS, SyntheticSpec

DEMO_POLICIES = ("round-robin", "least-loaded", "least-kv", "least-requests", "power-of-two", "colocated")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="experiment YAML (cluster, policy, workload, slo, seed)")
    p.add_argument("--trace", help="trace file (Azure CSV, Mooncake JSONL, BurstGPT, ShareGPT JSON, Vidur CSV)")
    p.add_argument("--format", choices=sorted(FORMATS), help="trace format (default: detect)")
    p.add_argument("--requests", type=int, help="keep the first N requests")
    p.add_argument("--rate", type=float, help="rescale arrivals to R requests/s on average")
    p.add_argument("--prefill", type=int, help="prefill instances")
    p.add_argument("--decode", type=int, help="decode instances")
    p.add_argument("--mixed", type=int, help="mixed (colocated) instances")
    p.add_argument("--preset", help="model@hardware performance preset")
    p.add_argument("--ttft-slo", type=float, help="TTFT SLO in seconds")
    p.add_argument("--tpot-slo", type=float, help="TPOT SLO in seconds")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--out", default="baton-out", help="output directory (default: baton-out)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--reference", action="store_true",
                   help="per-iteration reference mode instead of the closed-form advance")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="baton", description="Scheduling for PD-disaggregated LLM serving")
    sub = top.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="simulate one policy on one workload and cluster")
    _common(sim)
    sim.add_argument("--policy", help="policy name (e.g. least-loaded) or see --config")
    demo = sub.add_parser("demo", help="built-in bursty heavy-tailed workload, all baselines")
    _common(demo)
    return top


def _experiment(args: argparse.Namespace) -> Experiment:
    exp = load_experiment(args.config) if args.config else Experiment()
    exp = with_cluster(exp, prefill=args.prefill, decode=args.decode, mixed=args.mixed, preset=args.preset)
    wl = exp.workload
    if args.trace:
        wl = WorkloadConfig(trace=args.trace, format=args.format)
    if args.requests is not None:
        wl.requests = args.requests
    if args.rate is not None:
        wl.rate_rps = args.rate
    exp.workload = wl
    if args.ttft_slo is not None or args.tpot_slo is not None:
        exp.slo = SLO(args.ttft_slo or exp.slo.ttft_s, args.tpot_slo or exp.slo.tpot_s)
    if args.seed is not None:
        exp.seed = args.seed
    if getattr(args, "policy", None):
        exp.policy = args.policy
    for name, value in (("requests", args.requests), ("rate", args.rate)):
        if value is not None and value <= 0:
            raise ConfigError(f"--{name}: expected a positive number, got {value}")
    return exp


def demo_experiment() -> Experiment:
    """The embedded default: bursty (Gamma, CV 3) arrivals, heavy-tailed lognormal lengths,
    2 prefill + 4 decode Llama-3.1-8B instances on A100-80G."""
    spec = SyntheticSpec(requests=1500, rate_rps=14.0, arrival="gamma", cv=3.0,
                         prompt="lognormal", prompt_median=700, prompt_sigma=0.9, prompt_cap=8192,
                         output="lognormal", output_median=250, output_sigma=1.1, output_cap=4096)
    return Experiment(cluster=ClusterSpec(prefill=2, decode=4), workload=WorkloadConfig(synthetic=spec),
                      slo=SLO(ttft_s=1.0, tpot_s=0.05), seed=7)


def _run(exp: Experiment, policy, args, label: str):
    requests = exp.workload.load(exp.seed)
    horizon = requests[-1].arrival_s if requests else 0.0
    with progress_bar(not args.quiet, label, horizon) as update:
        result = simulate(requests, exp.cluster, policy, seed=exp.seed,
                          closed_form=not args.reference, progress=update)
    return result, result.summary(exp.slo)


def _write(out: Path, name: str, result, summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_records(result.records, out / f"{name}.requests.csv")
    (out / f"{name}.summary.json").write_text(json.dumps(_clean(summary), indent=2))


def _clean(summary: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}


def _report(results: dict, args, title: str) -> None:
    if args.json:
        print(json.dumps({k: _clean(v) for k, v in results.items()}))
    else:
        console().print(summary_table(results, title))
        print(f"records and summaries written to {Path(args.out).resolve()}")


def cmd_simulate(args: argparse.Namespace) -> None:
    exp = _experiment(args)
    name = exp.policy if isinstance(exp.policy, str) else str(exp.policy.get("name", "custom"))
    result, summary = _run(exp, exp.policy, args, name)
    _write(Path(args.out), name, result, summary)
    c = exp.cluster
    _report({name: summary}, args, f"{name} on {c.prefill}P{c.decode}D"
            f"{f'+{c.mixed}M' if c.mixed else ''} {c.preset}")


def cmd_demo(args: argparse.Namespace) -> None:
    exp = demo_experiment()
    if args.config or args.trace or args.prefill or args.decode or args.preset:
        exp = _experiment(args)
    elif args.requests or args.rate or args.seed is not None:
        exp.workload.requests, exp.workload.rate_rps = args.requests, args.rate
        exp.seed = exp.seed if args.seed is None else args.seed
    results = {}
    for policy in DEMO_POLICIES:
        result, summary = _run(exp, policy, args, policy)
        _write(Path(args.out), policy, result, summary)
        results[policy] = summary
    c = exp.cluster
    _report(results, args, f"Baton demo: bursty heavy-tailed workload, {c.prefill}P{c.decode}D {c.preset} "
            f"(SLO TTFT {exp.slo.ttft_s}s, TPOT {exp.slo.tpot_s}s)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        {"simulate": cmd_simulate, "demo": cmd_demo}[args.command](args)
    except BatonError as exc:
        print(f"baton: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("baton: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
