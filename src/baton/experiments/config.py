"""Experiment configuration from YAML and flags; every error names the key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import baton.core.settings as settings
from baton.core.errors import ConfigError
from baton.core.settings import setting
from baton.core.flow_control import FlowControlSettings
from baton.core.info import InfoModel
from baton.yamlfile import read_yaml
from baton.core.request import Request
from baton.metrics import SLO
from baton.policies.catalog import check_policy
from baton.perf.presets import model_route, parse_model_route, route_prefix
from baton.sim.cluster import ClusterSpec, cluster_from_dict
from baton.workload import FORMATS, SourceEngine, SyntheticSpec, first, generate, load_trace, scale_to_rate, source_engine
from baton.workload.transform import window
from baton.workload.classes import RequestClass, check_shares, with_classes
from baton.workload.sessions import SessionsSpec, generate_sessions


@dataclass(slots=True)
class WorkloadConfig:
    """A trace file, or a synthetic spec; plus optional rate scaling and truncation."""

    kind: str = setting("synthetic", choices=("synthetic", "trace", "sessions"),
                        doc="synthetic (the synthetic mapping), trace (a file) or sessions (multi-turn sessions: "
                            "their keys sit beside kind)")
    trace: str | None = setting(None, flag=True, doc="a trace file (in YAML, relative to the YAML file)")
    format: str | None = setting(None, flag=True, choices=tuple(sorted(FORMATS)),
                                 doc="the trace's format (default: detected from its content)")
    synthetic: SyntheticSpec = setting(factory=SyntheticSpec, doc="the synthetic workload")
    sessions: SessionsSpec | None = None  # the multi-turn sessions generator instead (workload/sessions.py)
    requests: int | None = setting(None, gt=0, flag=True, doc="a trace's first N requests, or exactly N synthetic ones")
    skip: int = setting(0, ge=0, flag=True, doc="leave out a trace's first N requests (a held-out window: the rest, "
                                                 "or with requests the next ones, shifted to arrive from 0)")
    rate_rps: float | None = setting(None, gt=0, unit="1/s", doc="rescale arrival times to this mean rate")
    arrivals: str | None = setting(None, flag=True, doc="poisson:R or uniform:R, for traces without arrival times")
    columns: dict[str, str] | None = None  # time/prompt/output column names (any CSV or JSONL; --columns)
    time_unit: str = "s"
    classes: tuple[RequestClass, ...] = setting((), doc="a mix of request classes (priority, tenant, SLOs) "
                                                         "drawn per request by share")
    tokenizer: str | None = setting(None, flag=True, doc="a local tokenizer.json (or its folder) for text traces")
    # one-line notes the loader gave (rows dropped, lengths estimated), for the run's output
    notes: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def drawn(self) -> bool:
        """Whether the requests are drawn from the synthetic spec (so any number can be
        had); not for a trace or the sessions generator (``kind`` alone does not say: a
        trace file is read whatever ``kind`` is)."""
        return not self.trace and self.sessions is None

    def _read(self, seed: int) -> list[Request]:
        said: list[str] = []
        reqs = load_trace(self.trace, self.format, self.arrivals, seed, self.columns, self.time_unit,
                          self.tokenizer, said)
        self.notes.extend(n for n in said if n not in self.notes)
        return reqs

    def source_engine(self) -> SourceEngine | None:
        """The engine settings the trace was produced under (``baton.workload.source_engine``),
        or None (a synthetic workload, a --columns trace, or none recorded)."""
        if not self.trace or self.columns is not None:
            return None
        return source_engine(self.trace, self.format)

    def whole_trace(self, seed: int = 0) -> list[Request]:
        """Every request of the trace after ``skip``, unscaled (for disjoint windows), with
        its classes."""
        return with_classes(self._skipped(self._read(seed)), self.classes, seed)

    def _skipped(self, reqs: list[Request]) -> list[Request]:
        """The trace's requests after its first ``skip``, shifted to arrive from 0 and
        numbered from 0 (all of them when ``skip`` is 0)."""
        if not self.skip:
            return reqs
        if self.skip >= len(reqs):
            raise ConfigError(f"skip {self.skip}: the trace {self.trace} has only {len(reqs)} requests")
        return window(reqs, self.skip, len(reqs))

    def load(self, seed: int) -> list[Request]:
        """The workload's requests: a trace's first ``requests`` (after ``skip``), or exactly
        ``requests`` synthetic ones (``requests`` sets the synthetic count, it never caps it)."""
        if self.skip and not self.trace:
            raise ConfigError(f"skip {self.skip}: only a trace's requests can be skipped (there is no trace)")
        if self.trace:
            reqs = self._skipped(self._read(seed))
        elif self.sessions is not None:
            reqs = generate_sessions(self.sessions, np.random.default_rng(seed))
        else:
            spec = self.synthetic if self.requests is None else replace(self.synthetic, requests=self.requests)
            reqs = generate(spec, np.random.default_rng(seed))
        if self.requests is not None and (self.trace or self.sessions is not None):
            reqs = first(reqs, self.requests)
        if self.rate_rps is not None:
            reqs = scale_to_rate(reqs, self.rate_rps)
        return with_classes(reqs, self.classes, seed)


@dataclass(slots=True)
class Experiment:
    """Everything one simulation needs."""

    cluster: ClusterSpec = setting(factory=ClusterSpec, doc="instances, roles, engines and links")
    policy: Any = setting("least-loaded", doc="a policy name (`baton list policies`) or {name, stages: [...]}")
    workload: WorkloadConfig = setting(factory=WorkloadConfig, doc="what arrives")
    slo: SLO = setting(factory=SLO, doc="latency targets for attainment and goodput")
    seed: int = setting(0, ge=0, flag=True, doc="seed of the workload and the policy's random generator")
    view: InfoModel = setting(factory=InfoModel, doc="what policies see of the cluster")
    flow_control: FlowControlSettings = setting(factory=FlowControlSettings,
                                                doc="priority bands, tenant fairness and shedding in front of "
                                                    "the policy")
    warmup_s: float | None = setting(None, ge=0, unit="s", flag=True, doc="requests arriving before this are left out of "
                                                                "the figures (default: 10% of the arrival span)")


_COMMON_KEYS = ("requests", "rate_rps", "kind", "classes")


def _workload(data: Any) -> WorkloadConfig:
    if not isinstance(data, Mapping):
        raise ConfigError("workload: expected a mapping")
    if data.get("kind") != "sessions":
        cfg = settings.parse(WorkloadConfig, data, "workload")
        check_shares(cfg.classes)
        return cfg
    ses_keys = tuple(x.key for x in settings.settings_of(SessionsSpec))
    cfg = settings.parse(WorkloadConfig, {k: v for k, v in data.items() if k in _COMMON_KEYS}, "workload",
                         extra_keys=ses_keys)
    check_shares(cfg.classes)
    cfg.sessions = settings.parse(SessionsSpec, {k: v for k, v in data.items() if k not in _COMMON_KEYS},
                                  "workload")
    return cfg


def load_experiment(path: str | Path) -> Experiment:
    """Read an experiment YAML file."""
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    if "figure" in data and isinstance(data.get("experiment"), Mapping):
        data = data["experiment"]  # a reproduction file: its regime works as an experiment
    exp = experiment_from_dict(data)
    exp.workload.trace = resolve_trace(exp.workload.trace, Path(path).parent)
    exp.workload.tokenizer = resolve_trace(exp.workload.tokenizer, Path(path).parent)
    exp.cluster = replace(exp.cluster, preset=resolve_preset(exp.cluster.preset, Path(path).parent))
    return exp


def resolve_preset(preset: str, folder: Path) -> str:
    """A profile CSV or a ``model:`` block's config.json named relative to the YAML is
    relative to its ``folder``, not to where baton runs."""
    prefix = route_prefix(preset)
    if prefix is not None:
        config, gpu, tp = parse_model_route(preset)
        return model_route(str((folder / Path(config).expanduser()).resolve()), gpu, tp, prefix)
    if preset.endswith(".csv") and not Path(preset).is_absolute():
        return str((folder / preset).resolve())
    return preset


def resolve_trace(trace: str | None, folder: Path) -> str | None:
    """A trace path from a YAML: ``~`` is the home folder (caches outside the repository),
    and a relative path is relative to the YAML's ``folder``, not to where baton runs."""
    if not trace:
        return trace
    path = Path(trace).expanduser()
    return str(path if path.is_absolute() else (folder / path).resolve())


def experiment_from_dict(data: Mapping[str, Any]) -> Experiment:
    """An experiment from a parsed YAML mapping; errors name the key."""
    if not isinstance(data, Mapping):
        raise ConfigError("expected a mapping at the top level")
    built = {}
    if data.get("cluster") is not None:
        built["cluster"] = cluster_from_dict(data["cluster"])
    if data.get("workload") is not None:
        built["workload"] = _workload(data["workload"])
    exp = settings.parse(Experiment, data, "", built=built)
    check_policy(exp.policy)
    return exp


def with_cluster(exp: Experiment, **changes: Any) -> Experiment:
    """A copy with some cluster fields replaced (flags over YAML)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    return replace(exp, cluster=replace(exp.cluster, **changes)) if changes else exp
