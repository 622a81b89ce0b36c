"""What every command that runs simulations shares: running the policies over the
workloads, naming the workload, clearing an output folder of a previous run's files, and
the comparison's report, table and files (summary.json, comparison.csv, report.html)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from baton.cli.output import console, progress_bar, summary_table
from baton.cli.source_check import check_source_engine
from baton.core.errors import ConfigError
from baton.experiments import Experiment, RunData, run_experiment
from baton.experiments.config import WorkloadConfig
from baton.experiments.comparison import write_comparison
from baton.experiments.provenance import write_run_json
from baton.experiments.repeats import combine, dropped_line, thin_tails_line, unsteady_line
from baton.metrics import write_records
from baton.metrics.summary import overload
from baton.perf import build as build_preset
from baton.policies import PolicyContext, build_scheduler
from baton.workload.stats import describe, implausible_rate


def clean(summary: dict) -> dict:
    """JSON-safe: NaN becomes null."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}


def emit_json(payload: dict) -> None:
    print(json.dumps(payload, allow_nan=False))


def cluster_text(exp: Experiment) -> str:
    c = exp.cluster
    return f"{c.prefill}P{c.decode}D{f'+{c.mixed}M' if c.mixed else ''} {c.preset}"


def validate_policies(exp: Experiment, policies: list[tuple[str, Any]]) -> None:
    """Build every policy once and check it against the cluster and the view mode before
    any run, so that a bad name or a policy the cluster cannot run fails at once, every
    such policy named in one error (not after the others' runs, which were thrown away)."""
    perf = build_preset(exp.cluster.preset)
    names = [n for n, _ in policies]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"policy names must be unique; repeated: {', '.join(sorted(dup))}")
    c, problems = exp.cluster, []
    for name, pol in policies:
        sched = build_scheduler(pol, PolicyContext(rng=np.random.default_rng(0), perf=perf))
        try:
            sched.check_cluster(c.prefill, c.decode, c.mixed)
            if sched.needs_bookings and not exp.view.mode.bookings:
                raise ConfigError(f"view: policy {sched.name!r} needs the router's own bookings; "
                                  "it cannot run with view mode scraped-only")
        except ConfigError as err:
            problems.append(f"{name}: {err}")
    if problems:
        raise ConfigError("these policies cannot run on this cluster: " + "; ".join(problems))


def run_all(exp: Experiment, policies: list[tuple[str, Any]], args,
             workloads: list[tuple[int, list]] | None = None) -> tuple[list[RunData], dict[str, list[dict]]]:
    """Every policy on every workload (one per repeat). Returns the first repeat's report
    data and every repeat's summary per policy; records of repeat k > 0 go to
    ``NAME.rK.requests.csv``."""
    validate_policies(exp, policies)
    if getattr(args, "records_format", "csv") == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ConfigError("--records-format parquet needs pyarrow: pip install -e '.[parquet]'") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clear_owned(out)
    workloads = workloads or [(exp.seed, exp.workload.load(exp.seed))]  # loaded once for all policies
    say_workload(exp, workloads[0][1], args)
    write_run_json(out, exp, [n for n, _ in policies], {"repeats": len(workloads), **check_source_engine(exp)})
    runs, summaries = [], {name: [] for name, _ in policies}
    for k, (seed, requests) in enumerate(workloads):
        horizon_s = requests[-1].arrival_s if requests else 0.0
        for name, pol in policies:
            label = name if len(workloads) == 1 else f"{name} ({k + 1}/{len(workloads)})"
            with progress_bar(not args.quiet, label, horizon_s) as update:
                result, data = run_experiment(replace(exp, policy=pol, seed=seed), closed_form=not args.reference,
                                              progress=update, name=name, requests=requests)
            stem = name if k == 0 else f"{name}.r{k}"
            write_records(result.records, out / f"{stem}.requests.{getattr(args, 'records_format', 'csv')}")
            summaries[name].append(data.summary)
            warning = overload(data.summary, exp.slo)
            if warning:
                print(f"warning: {label}: {warning}", file=sys.stderr)
            if k == 0:
                (out / f"{name}.summary.json").write_text(json.dumps(clean(data.summary), indent=2))
                runs.append(data)
    return runs, summaries


def say_workload(exp: Experiment, requests: list, args) -> None:
    """Name the workload and its rate on every run (stderr; the HTML header shows it too),
    and warn, even under --quiet, when the rate looks like a unit mistake."""
    source = Path(exp.workload.trace).name if exp.workload.trace else "synthetic workload"
    args.workload_text = f"{source}: {describe(requests)}"
    if not args.quiet:
        print(f"workload: {args.workload_text}", file=sys.stderr)
        for note in exp.workload.notes:
            print(f"note: {note}", file=sys.stderr)
    odd = implausible_rate(requests, _capacity_rps(exp, requests)) if own_timestamps(exp.workload) else None
    if odd:
        print(f"warning: {source}: {odd}", file=sys.stderr)


def own_timestamps(workload: WorkloadConfig) -> bool:
    """Whether a run's arrivals are the trace's own timestamps (so their unit matters): not
    drawn by --arrivals, not rescaled by --rate (a rescale keeps only their proportions)."""
    return bool(workload.trace) and workload.rate_rps is None and workload.arrivals is None


def _capacity_rps(exp: Experiment, requests: list) -> float | None:
    from baton.sim.capacity import max_rate_rps
    if not requests or exp.cluster.size == 0:
        return None
    prompt = sum(r.prompt_tokens for r in requests) / len(requests)
    output = sum(r.output_tokens for r in requests) / len(requests)
    return max_rate_rps(exp.cluster, build_preset(exp.cluster.preset), prompt, output)


OWNED = ("*.requests.csv", "*.requests.parquet", "*.summary.json", "summary.json", "comparison.csv", "run.json",
         "report.html", "*.png",
         "sweep.json", "sweep.html", "reproduce.json")


def clear_owned(out: Path) -> None:
    """A new run never mixes with an earlier one's files: remove what Baton wrote there
    (records, summaries, reports, figures), nothing else."""
    for pattern in OWNED:
        for f in out.glob(pattern):
            if f.is_file():
                f.unlink()


def compare_report(exp: Experiment, runs: list[RunData], args, title: str,
                    repeats: dict[str, list[dict]] | None = None) -> dict[str, dict]:
    """Write the comparison (summaries, CSV, HTML report) and print its table; returns the
    summaries (means over repeats, with each row's ``paired`` intervals)."""
    from baton.report import Report, compare_figures, write_report
    k = len(next(iter(repeats.values()))) if repeats else 1
    if k > 1:
        means, paired = combine(repeats)
        summaries = {name: {**clean(m), "paired": {key: {"mean_diff": v["mean_diff"],
                                                        "ci95": [finite(x) for x in v["ci95"]]}
                                                  for key, v in paired.get(name, {}).items()}}
                     for name, m in means.items()}
    else:
        summaries, paired = {r.name: clean(r.summary) for r in runs}, {}
    by_policy = repeats or {r.name: [r.summary] for r in runs}
    warnings = [line for line in (dropped_line(by_policy), unsteady_line(by_policy), thin_tails_line(by_policy))
                if line]
    for line in warnings:  # one line each for the whole comparison, not one per policy
        print(f"warning: {line}", file=sys.stderr)
    (Path(args.out) / "summary.json").write_text(json.dumps(summaries, indent=2))
    write_comparison(Path(args.out) / "comparison.csv", repeats or {r.name: [r.summary] for r in runs})
    meta = [f"cluster {cluster_text(exp)}; SLO TTFT {exp.slo.ttft_s} s, TPOT {exp.slo.tpot_s} s; "
            f"seed {exp.seed}; {getattr(args, 'workload_text', '')}"
            + (f"; means over {k} repeats, ~ = paired 95% interval includes 0" if k > 1 else "")]
    meta += [f"warning: {line}" for line in warnings]
    table_summaries = {n: {key: v for key, v in s.items() if key != "paired"} for n, s in summaries.items()}
    path = write_report(args.out, Report(title, table_summaries, compare_figures(runs, exp.slo), meta))
    if args.json:
        emit_json(summaries)
    else:
        out = console()
        out.print(summary_table(table_summaries, title, paired, wide=getattr(args, "wide", False), width=out.width))
        print(f"report: {path}")
    return summaries


def finite(x: float) -> float | None:
    return None if math.isnan(x) else x
