"""Flags shared by the commands, and the experiment they describe."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from dataclasses import fields, replace

import baton.core.settings as settings
from baton.core.errors import ConfigError
from baton.core.info import InfoModel
from baton.experiments import Experiment, WorkloadConfig, load_experiment, with_cluster
from baton.metrics import SLO
from baton.perf.presets import model_route
from baton.engine_model.flags import add_engine_flags, engine_flags_given
from baton.sim.cluster import ClusterSpec, check_counts, engine_from_dict
from baton.workload.loaders import parse_columns
from baton.workload.sessions import SessionsSpec


def add_workload_flags(p: argparse.ArgumentParser, rate_list: bool = False) -> None:
    p.add_argument("--config", help="experiment YAML (cluster, policy, workload, slo, seed)")
    settings.add_flags(p, WorkloadConfig, ("trace", "format", "requests", "skip", "arrivals"))
    p.add_argument("--columns", metavar="time=COL,prompt=COL,output=COL",
                   help="read any CSV or JSONL trace through these column names")
    p.add_argument("--time-unit", choices=["s", "ms"], default="s", help="unit of the --columns time column")
    settings.add_flags(p, WorkloadConfig, ("tokenizer",))
    p.add_argument("--workload", choices=["synthetic", "sessions"],
                   help="without --trace: the synthetic workload (default) or multi-turn sessions with "
                        "shared system prompts (prefix reuse; the flags below)")
    s = p.add_argument_group("--workload sessions (workload/sessions.py; YAML workload: {kind: sessions, ...})")
    settings.add_flags(s, SessionsSpec)
    if rate_list:
        p.add_argument("--rate", required=True, help="request rates to sweep, e.g. 2,4,8,16 (req/s)")
    else:
        p.add_argument("--rate", type=float, help="rescale arrivals to R requests/s on average")


def add_common(p: argparse.ArgumentParser, rate_list: bool = False) -> None:
    add_workload_flags(p, rate_list)
    settings.add_flags(p, ClusterSpec)  # --prefill, --decode, --mixed, --preset
    m = p.add_argument_group("a model without a preset (instead of --preset)")
    m.add_argument("--model", metavar="CONFIG_JSON", help="a Hugging Face config.json (or its folder)")
    m.add_argument("--gpu", help="the GPU type it runs on (baton list gpus)")
    m.add_argument("--tp", type=int, help="tensor-parallel degree (default 1)")
    v = p.add_argument_group("what policies see (baton.core.info)")
    settings.add_flags(v, InfoModel)  # --view, --scrape-interval, --scrape-delay
    add_engine_flags(p.add_argument_group("engine flags (as vLLM's; every role, over the YAML's cluster.engine)"))
    settings.add_flags(p, SLO)  # --ttft-slo, --tpot-slo
    settings.add_flags(p, Experiment)  # --seed, --warmup-s
    p.add_argument("--out", default="baton-out", help="output directory (default: baton-out)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--wide", action="store_true", help="every column in the table (the default fits 100 columns)")
    p.add_argument("--records-format", choices=["csv", "parquet"], default="csv",
                   help="per-request records as CSV or Parquet (Parquet needs pyarrow: pip install -e '.[parquet]')")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"--{name}: expected a positive number, got {value}")


def parse_rates(text: str) -> list[float]:
    """``2,4,8`` or ``2 4 8`` -> [2.0, 4.0, 8.0]."""
    try:
        rates = [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(f"--rate: expected numbers separated by commas, got {text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise ConfigError(f"--rate: expected positive request rates, got {text!r}")
    return rates


def experiment_from(args: argparse.Namespace, base: Experiment | None = None) -> Experiment:
    """The experiment from --config (or ``base``), with flags taking precedence."""
    if not isinstance(args.rate, str):
        _positive("rate", args.rate)
    exp = load_experiment(args.config) if args.config else (base or Experiment())
    prefill, decode = args.prefill, args.decode
    if args.mixed is not None and prefill is None and decode is None and not args.config:
        prefill = decode = 0  # --mixed N alone: a colocated cluster of N instances
    exp = with_cluster(exp, prefill=prefill, decode=decode, mixed=args.mixed, preset=preset_flag(args))
    check_counts(exp.cluster)
    exp = _with_engine_flags(exp, args)
    exp = _with_view_flags(exp, args)
    if args.trace:
        exp.workload = WorkloadConfig(trace=args.trace, format=args.format)
    exp.workload = _with_sessions(exp.workload, args)
    if getattr(args, "arrivals", None):
        exp.workload.arrivals = args.arrivals
    if getattr(args, "tokenizer", None):
        exp.workload.tokenizer = args.tokenizer
    if getattr(args, "columns", None):
        exp.workload.columns = parse_columns(args.columns)
        exp.workload.time_unit = args.time_unit
    if args.requests is not None:
        exp.workload.requests = args.requests
    if getattr(args, "skip", None) is not None:
        exp.workload.skip = args.skip
    if args.rate is not None and not isinstance(args.rate, str):
        exp.workload.rate_rps = args.rate
    if args.ttft_slo is not None or args.tpot_slo is not None:
        exp.slo = SLO(args.ttft_slo or exp.slo.ttft_s, args.tpot_slo or exp.slo.tpot_s)
    if args.seed is not None:
        exp.seed = args.seed
    if getattr(args, "warmup_s", None) is not None:
        exp.warmup_s = args.warmup_s
    return exp


def _with_sessions(workload: WorkloadConfig, args: argparse.Namespace) -> WorkloadConfig:
    """--workload sessions and its parameters (over a YAML's sessions spec)."""
    given = {f.name: getattr(args, f.name) for f in fields(SessionsSpec) if getattr(args, f.name, None) is not None}
    if getattr(args, "workload", None) == "synthetic":
        workload.sessions = None
    if getattr(args, "workload", None) == "sessions" or (given and workload.sessions is not None):
        if args.trace:
            raise ConfigError("--workload sessions: generates its requests; it takes no --trace")
        workload.sessions = replace(workload.sessions or SessionsSpec(), **given)
        workload.sessions.check()
    elif given:
        raise ConfigError(f"--{next(iter(given)).replace('_', '-')}: a sessions parameter; add --workload sessions")
    return workload


def preset_flag(args: argparse.Namespace) -> str | None:
    """--preset, or --model/--gpu/--tp as a preset string (``hf:PATH@GPU:tpN``; a relative
    PATH is relative to where baton runs); None: the YAML's or the default."""
    model, gpu, tp = getattr(args, "model", None), getattr(args, "gpu", None), getattr(args, "tp", None)
    if model is None:
        if gpu is not None or tp is not None:
            raise ConfigError("--gpu/--tp: only with --model CONFIG_JSON (a preset names its own GPU and TP)")
        return args.preset
    if args.preset is not None:
        raise ConfigError("--model and --preset: choose one (--model CONFIG_JSON --gpu NAME --tp N "
                          "simulates a model without a preset)")
    if gpu is None:
        raise ConfigError("--model: needs --gpu NAME (baton list gpus)")
    try:
        return model_route(str(Path(model).expanduser().resolve()), gpu, 1 if tp is None else tp)
    except ConfigError as err:
        raise ConfigError(f"--{err}") from None


def _with_engine_flags(exp: Experiment, args: argparse.Namespace) -> Experiment:
    """Engine flags apply to every role: the base engine and any per-role override."""
    values = engine_flags_given(args)
    if not values:
        return exp
    c = exp.cluster
    over = {name: engine_from_dict(values, "engine flag", getattr(c, name))
            for name in ("engine", "prefill_engine", "decode_engine") if getattr(c, name) is not None}
    return replace(exp, cluster=replace(c, **over))


def _with_view_flags(exp: Experiment, args: argparse.Namespace) -> Experiment:
    """--view / --scrape-interval / --scrape-delay over the YAML's ``view``."""
    changes: dict = {}
    if getattr(args, "view", None) is not None:
        changes["mode"] = args.view
    for flag, key in (("scrape_interval", "scrape_interval_s"), ("scrape_delay", "delay_s")):
        value = getattr(args, flag, None)
        if value is not None:
            changes[key] = value
    if not changes:
        return exp
    try:
        return replace(exp, view=replace(exp.view, **changes))
    except ConfigError as err:
        raise ConfigError(str(err).replace("view.scrape_interval_s", "--scrape-interval")
                          .replace("view.delay_s", "--scrape-delay")) from None


def check_common(args: argparse.Namespace) -> None:
    """Flag values argparse accepts but that make no sense: one-line errors, exit 2."""
    settings.flag_errors(args)
    rate = getattr(args, "rate", None)
    if isinstance(rate, float) and not (rate > 0 and math.isfinite(rate)):
        raise ConfigError(f"--rate: expected a positive finite number, got {rate}")
    out = getattr(args, "out", None)
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"--out: {out} exists and is a file, not a directory")
