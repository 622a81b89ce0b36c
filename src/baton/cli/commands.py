"""The commands behind ``baton simulate | compare | sweep | demo | workload stats``."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from baton import __version__
from baton.cli.args import experiment_from, parse_rates
from baton.cli.claims_text import ClaimLine, claim_lines
from baton.cli.output import console, points_bar, rows_table, summary_table
from baton.cli.running import (clean, clear_owned, cluster_text, compare_report, emit_json, own_timestamps, run_all,
                               validate_policies)
from baton.cli.source_check import check_source_engine
from baton.core.errors import ConfigError
from baton.experiments import Experiment, WorkloadConfig, load_experiment, policy_label
from baton.experiments.provenance import write_run_json
from baton.experiments.repeats import dropped_line, repeat_workloads
from baton.metrics import SLO
from baton.sim import ClusterSpec
from baton.workload import SyntheticSpec, workload_stats
from baton.workload.loaders import parse_columns
from baton.workload.stats import implausible_rate

DEMO_POLICIES = ("round-robin", "least-loaded", "least-kv", "least-requests", "power-of-two", "colocated",
                 "ils", "sibyl", "ares", "arrow", "kairos", "combined")


def demo_experiment() -> Experiment:
    """The embedded default: bursty (Gamma, CV 3) arrivals, heavy-tailed lognormal lengths,
    2 prefill + 4 decode Llama-3.1-8B instances on A100-80G."""
    spec = SyntheticSpec(requests=1500, rate_rps=14.0, arrival="gamma", cv=3.0,
                         prompt="lognormal", prompt_median=700, prompt_sigma=0.9, prompt_cap=8192,
                         output="lognormal", output_median=250, output_sigma=1.1, output_cap=4096)
    return Experiment(cluster=ClusterSpec(prefill=2, decode=4), workload=WorkloadConfig(synthetic=spec),
                      slo=SLO(ttft_s=1.0, tpot_s=0.05), seed=7)


def cmd_simulate(args: argparse.Namespace) -> None:
    exp = experiment_from(args)
    if args.policy:
        exp.policy = args.policy
    name = policy_label(exp.policy)
    runs, _ = run_all(exp, [(name, exp.policy)], args)
    summaries = {name: clean(runs[0].summary)}
    if args.json:
        emit_json(summaries)
    else:
        out = console()
        out.print(summary_table(summaries, f"{name} on {cluster_text(exp)}", wide=args.wide, width=out.width))
        print(f"records and summary written to {args.out}")


def _named_policies(args) -> list[tuple[str, Any]]:
    items = [(p.strip(), p.strip()) for p in (args.policies or "").split(",") if p.strip()]
    for path in args.configs or []:
        items.append((Path(path).stem, load_experiment(path).policy))
    if not items:
        raise ConfigError("compare: name the policies with --policies a,b,... or --configs A.yaml B.yaml")
    return items


def cmd_compare(args: argparse.Namespace) -> None:
    exp = experiment_from(args)
    policies = _named_policies(args)
    workloads = repeat_workloads(exp, args.repeats)
    started = time.monotonic()
    runs, repeats = run_all(exp, policies, args, workloads)
    summaries = compare_report(exp, runs, args, f"{' vs '.join(n for n, _ in policies)} on {cluster_text(exp)}",
                               repeats)
    if args.record:
        _record(args.record, {"cluster": cluster_text(exp), "repeats": args.repeats, "policies": summaries}, started)


def cmd_demo(args: argparse.Namespace) -> None:
    started = time.monotonic()
    exp = experiment_from(args, base=demo_experiment())
    runs, repeats = run_all(exp, [(p, p) for p in DEMO_POLICIES], args)
    compare_report(exp, runs, args, f"Baton demo: bursty heavy-tailed workload on {cluster_text(exp)}", repeats)
    if args.record:
        _record("demo", {r.name: clean(r.summary) for r in runs}, started)


def _record(name: str, figures: dict, started_s: float) -> None:
    """``--record``: the figures into results/NAME.json (``report.results``), with the time
    since ``started_s`` (monotonic)."""
    from baton.report.results import record
    record(name, figures, time.monotonic() - started_s)


def _sweep_payload(sweep) -> dict:
    maxima, knees = sweep.max_rates_rps(), sweep.knees()
    return {name: {"max_sustainable_rate_rps": maxima[name], "max_rate_status": knees[name].status,
                   "target_attainment": sweep.target_attainment,
                   "points": [clean(p) for p in pts]} for name, pts in sweep.points.items()}


def _sweep_rows(sweep) -> list[list[str]]:
    """Per policy: its max rate as ``steady.Sustained.text`` says it (``>=`` capped,
    ``<`` below the range, not measurable), then attainment / P99 TPOT / P95 TTFT per
    rate, ``*`` on a point whose window was not steady."""
    knees = sweep.knees()
    rows = []
    for name, pts in sweep.points.items():
        cells = [f"{p['slo_attainment'] * 100:.0f}% / {p['p99_tpot_s'] * 1e3:.0f} / {p['p95_ttft_s'] * 1e3:.0f}"
                 f"{'' if p.get('steady', 1.0) else ' *'}" if not math.isnan(p["p99_tpot_s"]) else "-" for p in pts]
        rows.append([name, knees[name].text(), *cells])
    return rows


def cmd_sweep(args: argparse.Namespace) -> None:
    from baton.report import Report, sweep_figures, write_report
    started = time.monotonic()
    exp = experiment_from(args)
    rates = parse_rates(args.rate)
    policies = _named_policies(args)
    validate_policies(exp, policies)
    source = check_source_engine(exp)
    with points_bar(not args.quiet, "sweep", len(rates) * len(policies)) as update:
        from baton.experiments.sweep import run_sweep  # its process pools, only for sweeps
        sweep = run_sweep(exp, dict(policies), rates, executor="ray" if args.ray else "processes",
                          workers=args.workers, ray_address=args.ray_address,
                          target_attainment=args.target, on_point=update)
    payload = _sweep_payload(sweep)
    if args.record:
        _record(args.record, {"cluster": cluster_text(exp), "rates_rps": rates, "policies": payload}, started)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    clear_owned(Path(args.out))
    write_run_json(Path(args.out), exp, [n for n, _ in policies], {"rates_rps": rates, **source})
    (Path(args.out) / "sweep.json").write_text(json.dumps(payload, indent=2))
    head = ["policy", f"max rate @{args.target:.0%} (req/s)"] + [f"{r:g} req/s" for r in rates]
    rows = _sweep_rows(sweep)
    title = f"Rate sweep on {cluster_text(exp)}"
    caption = ("SLO attainment / P99 TPOT ms / P95 TTFT ms at each rate, each on a steady window of at least "
               "60 s and 10 mean e2e of arrivals (* where the source could not give one); >= : no rate tried "
               "missed (a lower bound)")
    meta = [f"seed {exp.seed}; SLO TTFT {exp.slo.ttft_s} s, TPOT {exp.slo.tpot_s} s"]
    dropped = dropped_line(sweep.points)  # over all of a policy's rates
    if dropped:
        print(f"warning: {dropped}", file=sys.stderr)
        meta.append(f"warning: {dropped}")
    path = write_report(args.out, Report(title, figures=sweep_figures(sweep), extra_tables=[(caption, head, rows)],
                                         meta=meta), stem="sweep")
    if args.json:
        emit_json(payload)
        return
    console().print(rows_table(f"{title}: {caption}", head, rows))
    print(f"report: {path}")


def cmd_workload_stats(args: argparse.Namespace) -> None:
    from baton.report import Report, workload_figure, write_report
    columns = parse_columns(args.columns) if args.columns else None  # the trace flags of every command
    workload = WorkloadConfig(trace=args.file, format=args.format, arrivals=args.arrivals, columns=columns,
                              time_unit=args.time_unit, tokenizer=args.tokenizer)
    requests = workload.whole_trace()
    for note in workload.notes:
        print(f"note: {note}", file=sys.stderr)
    odd = implausible_rate(requests) if own_timestamps(workload) else None
    if odd:
        print(f"warning: {Path(args.file).name}: {odd}", file=sys.stderr)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_run_json(Path(args.out), Experiment(workload=workload), [])
    if args.cache_tokens <= 0:
        raise ConfigError(f"--cache-tokens: expected a positive integer, got {args.cache_tokens}")
    stats = workload_stats(requests, args.cache_tokens)
    name = Path(args.file).name
    fig = workload_figure(np.array([r.prompt_tokens for r in requests]), np.array([r.output_tokens for r in requests]),
                          np.array([r.arrival_s for r in requests]), f"Workload {name}")
    rows = [[k, f"{v:,.3f}".rstrip("0").rstrip(".")] for k, v in stats.items()]
    write_report(args.out, Report(f"Workload statistics: {name}", figures=[fig],
                                  extra_tables=[("Statistics", ["metric", "value"], rows)]), stem="workload")
    if args.json:
        emit_json({name: clean(stats)})
        return
    console().print(rows_table(f"Workload statistics: {name}", ["metric", "value"], rows))
    print(f"histogram: {(Path(args.out) / 'workload.png').resolve()}")


def cmd_calibrate(args: argparse.Namespace) -> None:
    from baton.experiments.calibration import survival_calibration
    if not 0 < args.train_fraction < 1:
        raise ConfigError(f"--train-fraction: expected a fraction in (0, 1), got {args.train_fraction}")
    exp = experiment_from(args)
    requests = exp.workload.load(exp.seed)
    if len(requests) < 10:
        raise ConfigError(f"calibrate: need at least 10 requests, got {len(requests)}")
    lengths = np.array([r.output_tokens for r in sorted(requests, key=lambda r: r.arrival_s)])
    result = survival_calibration(lengths, args.delta_tokens, args.alpha, args.train_fraction)
    name = Path(exp.workload.trace).name if exp.workload.trace else "synthetic"
    if args.json:
        emit_json({name: clean(result)})
        return
    print(f"survival calibration on {name}: mean absolute error {result['mae']:.4f}, "
          f"p95 {result['p95_abs_error']:.4f}, max {result['max_abs_error']:.4f} "
          f"over {result['grid_cells']} (current, target) cells; learned from {result['train_requests']} "
          f"requests, checked against {result['test_requests']} (Δ={args.delta_tokens}, α={args.alpha})")


def cmd_emulate(args: argparse.Namespace) -> None:
    """``baton emulate``: serve one emulated engine until interrupted."""
    from baton.emulator.run import build_emulator, serve
    serve(build_emulator(args))


def cmd_profile(args: argparse.Namespace) -> None:
    """``baton profile``: measure a live engine, write the profile and report the fit."""
    import asyncio

    from baton.perf.fitted import FittedModel
    from baton.profiling.fit import fit_errors, repeat_spread
    from baton.profiling.grid import ProfileGrid, write_profile
    from baton.profiling.live import profile_engine
    if args.kind == "qoe":
        return _profile_qoe(args)
    if not args.engine:
        raise ConfigError("--engine URL is needed (or --kind qoe)")
    for flag in ("max_num_batched_tokens", "max_num_seqs"):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: expected a positive integer")
    grid = (ProfileGrid.quick if args.quick else ProfileGrid)(
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs)
    facts, rows = asyncio.run(profile_engine(args.engine, args.model, grid, args.seed,
                                             lambda msg: print(msg, flush=True)))
    if facts.kv_capacity_tokens is None or facts.kv_bytes_per_token is None:
        print(f"note: {args.engine} does not export vllm:cache_config_info; set kv_capacity_tokens and "
              f"kv_bytes_per_token in the .json beside the profile", file=sys.stderr)
    out = Path(args.out)
    side = write_profile(out, rows, facts, {"max_num_batched_tokens": grid.max_num_batched_tokens,
                                            "baton_version": __version__})
    print(f"wrote {len(rows)} rows to {out} and the engine's facts to {side}")
    if facts.kv_capacity_tokens and facts.kv_bytes_per_token:
        model = FittedModel.from_profile(out)
        for kind, err in fit_errors(rows, model).items():
            print(f"fit on {kind} rows: {err['rows']} rows, MAPE {err['mape']:.1%}, worst {err['max']:.1%}")
    for kind, spread in repeat_spread(rows).items():
        print(f"repeats of one {kind} point differ by {spread['median']:.1%} at the median, {spread['max']:.1%} at "
              f"worst ({spread['points']} points): a fit cannot be closer than this machine repeats itself")


def _profile_qoe(args: argparse.Namespace) -> None:
    """CascadeInfer's QoE profile on a preset: coefficients and held-out error, as JSON."""
    from baton.profiling.qoe import profile_qoe
    profile = profile_qoe(args.preset, seed=args.seed)
    out = Path(args.out if args.out != "baton-out/profile.csv" else "baton-out/qoe.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    figures = {"preset": args.preset, "coefficients": dict(zip(("const", "batch", "sum_prompt", "sum_prompt_sq",
                                                                "sum_context"), profile.model.d)),
               "rows": int(len(profile.latency_s)), "cases": int(len(set(profile.cases.tolist()))),
               "held_out_mape": profile.held_out_mape, "train_mape": profile.train_mape}
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"QoE model of {args.preset}: {figures['rows']} requests in {figures['cases']} (bucket, batch) cases; "
          f"mean relative error {profile.held_out_mape:.1%} on the held-out 30% ({profile.train_mape:.1%} fitted); "
          f"wrote {out}")


def cmd_serve(args: argparse.Namespace) -> None:
    """``baton serve``: the live gateway."""
    from baton.gateway.config import check_workers, load_config
    from baton.gateway.run import serve
    config = load_config(args.config)
    for key in ("host", "port", "policy", "workers"):
        if getattr(args, key) is not None:
            setattr(config, key, getattr(args, key))
    check_workers(config)
    serve(config)


def cmd_epp(args: argparse.Namespace) -> None:
    """``baton epp``: the endpoint picker (or, with ``--envoy-config``, Envoy's bootstrap for it)."""
    from baton.gateway.config import load_config
    config = load_config(args.config)
    for key in ("host", "port", "policy", "epp_port"):
        if getattr(args, key) is not None:
            setattr(config, key, getattr(args, key))
    if args.envoy_config:
        from baton.gateway.envoy import write_bootstrap
        write_bootstrap(Path(args.envoy_config), config, args.envoy_port, args.fail_open)
        print(f"wrote {args.envoy_config}: Envoy on {config.host}:{args.envoy_port}, picker at "
              f"{config.host}:{config.epp_port}, {'fail-open' if args.fail_open else 'fail-close'}")
        return
    from baton.gateway.epp_run import serve_epp
    serve_epp(config)


def cmd_sidecar(args: argparse.Namespace) -> None:
    """``baton sidecar``: PD legs beside one decode engine, for an endpoint picker."""
    from baton.gateway.config import load_config
    from baton.gateway.sidecar import serve_sidecar
    serve_sidecar(load_config(args.config), args.engine, args.host, args.port, args.engine_url)


def cmd_reproduce(args: argparse.Namespace) -> None:
    """Every figure of a paper: claim, Baton's mean relative change and its 95% interval."""
    from baton.experiments.reproduce import ROOT, check_traces, claims_of, run_claim, with_traces
    from baton.report import Report, write_report
    from baton.report.plots import claims_figure
    if args.repeats is not None and args.repeats < 2:
        raise ConfigError(f"--repeats: at least 2 are needed for an interval, got {args.repeats}")
    started = time.monotonic()
    claims = with_traces(claims_of(args.paper, Path(args.dir) if args.dir else ROOT, args.full), args.traces)
    check_traces(claims, args.trace)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    clear_owned(Path(args.out))
    write_run_json(Path(args.out), claims[0].experiment, [c.name for c in claims],
                   {"paper": args.paper, "repeats": args.repeats, "full": args.full, "trace": args.trace})
    outcomes, cache = [], {}
    note = None if args.quiet else (lambda text: print(f"  {text}", file=sys.stderr, flush=True))
    cap = args.max_repeats
    if cap is not None and cap < (args.repeats or 2):
        raise ConfigError(f"--max-repeats: expected at least --repeats ({args.repeats or 2}), got {cap}")
    for claim in claims:
        outcomes.append(run_claim(claim, args.repeats, args.trace, note, cache, max_repeats=cap))
        if claim.match is not None:  # the paper's baseline figure matched first, beside the default
            outcomes.append(run_claim(claim, args.repeats, args.trace, note, cache, matched=True, max_repeats=cap))
    for o in outcomes:
        if o.dropped:  # never silently: the figure rests on fewer repeats than asked for
            print(f"warning: {o.claim.name}: {o.dropped} of {o.dropped + len(o.ratios)} repeats have no "
                  f"{o.claim.metric} for one of the policies (for a rate: none of {list(o.claim.rates)} reached "
                  f"the target attainment, or the last rate that did had no steady window: a burst); Baton's "
                  f"figure rests on the others", file=sys.stderr)
    rows = [[_claim_label(o), o.claim.figure, f"{o.claim.metric}: {o.claim.policy} vs {o.claim.baseline}",
             f"{o.claim.claim * 100:+.1f}%", _pct_ci(o), _verdict_text(o)] for o in outcomes]
    head = ["figure", "what", "metric", "paper", "Baton (95% CI)", "verdict"]
    meta = [f"{len(outcomes)} figures of {args.paper}; Baton's value is the relative change of the geometric "
            f"mean ratio over the repeats (each running both policies on the same workload), its interval a "
            f"Student-t 95% interval on the log ratio; verdicts: reproduced (interval excludes 0 and contains the "
            f"claim), direction only (excludes 0, same sign, misses the claim), not reproduced, inconclusive "
            f"(includes 0 and the claim)"]
    mechanisms = [[_claim_label(o), o.verdict, o.claim.notes or "-"] for o in outcomes]
    path = write_report(args.out, Report(f"baton reproduce {args.paper}", figures=[claims_figure(outcomes)],
                                         meta=meta, extra_tables=[("Claims", head, rows),
                                                                  ("Why", ["figure", "verdict", "mechanism"],
                                                                   mechanisms)]))
    payload = {"claims": [{"name": o.claim.name + (" (matched)" if o.calibration else ""),
                           "paper": o.claim.name.split("/")[0] if "/" in o.claim.name else args.paper, **o.json(),
                           "verdict_text": _verdict_text(o)} for o in outcomes]}
    (Path(args.out) / "reproduce.json").write_text(json.dumps(payload, indent=2))
    if args.record:
        verdicts = [c["verdict"] for c in payload["claims"]]
        _record(f"reproduce-{args.paper}", {**payload, "verdict_counts": {v: verdicts.count(v) for v in
                ("reproduced", "direction only", "not reproduced", "inconclusive")}}, started)
    if args.json:
        emit_json(payload)
    else:
        out = console()
        out.print(f"{args.paper}: the paper's claims against Baton", style="bold")
        for text, described in claim_lines([_claim_line(o) for o in outcomes], out.width):
            out.print(text, style="dim" if described else None, highlight=False, markup=False, crop=False)
        print(f"report: {path}")


def _claim_label(outcome) -> str:
    """The claim's name; a matched run says where its knob went and what the baseline gave."""
    c, m = outcome.calibration, outcome.claim.match
    if c is None:
        return outcome.claim.name + (" (default)" if m is not None else "")
    return (f"{outcome.claim.name} (matched: {c.knob} = {c.value:g}; {m.policy or outcome.claim.baseline} "
            f"{m.metric} {c.figure:.4g} vs the paper's {m.target:g})")


def _claim_line(outcome) -> ClaimLine:
    """A claim for the terminal: its numbers on one line, what it is about under them."""
    c, m = outcome.calibration, outcome.claim.match
    name = outcome.claim.name + (" (matched)" if c else " (default)" if m is not None else "")
    about = [outcome.claim.figure, f"{outcome.claim.metric}: {outcome.claim.policy} vs {outcome.claim.baseline}"]
    if c is not None:
        about.append(f"matched: {c.knob} = {c.value:g}; {m.policy or outcome.claim.baseline} {m.metric} "
                     f"{c.figure:.4g} vs the paper's {m.target:g}")
    verdict = _verdict_text(outcome)
    if verdict != outcome.judged.verdict:
        about.append(verdict)
    return ClaimLine(name, f"{outcome.claim.claim * 100:+.1f}%", _pct_ci(outcome), outcome.judged.verdict,
                     "; ".join(about))


def _verdict_text(outcome) -> str:
    v = outcome.judged
    looked = f"; {len(outcome.ratios)} repeats after {outcome.first_look}" if outcome.first_look else ""
    looked += f"; {outcome.capped} capped" if outcome.capped else ""  # a rate in the ratio is a lower bound
    if v.verdict == "inconclusive" and v.repeats_to_decide:
        return f"inconclusive (about {v.repeats_to_decide} repeats would decide{looked})"
    return f"{v.verdict}{f' ({looked[2:]})' if looked else ''}"


def _pct_ci(outcome) -> str:
    lo, hi = outcome.ci95
    mid = f"{outcome.baton * 100:+.1f}%"
    return mid if math.isnan(lo) else f"{mid} [{lo * 100:+.1f}, {hi * 100:+.1f}]"
