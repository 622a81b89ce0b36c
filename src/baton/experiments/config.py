"""Experiment configuration from YAML and flags; every error names the key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from baton.core.errors import ConfigError
from baton.core.info import InfoModel, info_from_dict
from baton.yamlfile import read_yaml
from baton.core.request import Request
from baton.metrics import SLO
from baton.perf.presets import model_route, parse_model_route, route_prefix
from baton.sim.cluster import ClusterSpec, cluster_from_dict
from baton.workload import SourceEngine, SyntheticSpec, first, generate, load_trace, scale_to_rate, source_engine
from baton.workload.sessions import SessionsSpec, generate_sessions


@dataclass(slots=True)
class WorkloadConfig:
    """A trace file, or a synthetic spec; plus optional rate scaling and truncation."""

    trace: str | None = None
    format: str | None = None
    synthetic: SyntheticSpec = field(default_factory=SyntheticSpec)
    sessions: SessionsSpec | None = None  # the multi-turn sessions generator instead (workload/sessions.py)
    requests: int | None = None
    rate_rps: float | None = None
    arrivals: str | None = None  # poisson:R | uniform:R, for traces without arrival times
    columns: dict[str, str] | None = None  # time/prompt/output column names (any CSV or JSONL)
    time_unit: str = "s"
    tokenizer: str | None = None  # a local tokenizer.json (or its folder) for text traces
    # one-line notes the loader gave (rows dropped, lengths estimated), for the run's output
    notes: list[str] = field(default_factory=list, compare=False, repr=False)

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
        """Every request of the trace, unscaled (for disjoint windows)."""
        return self._read(seed)

    def load(self, seed: int) -> list[Request]:
        """The workload's requests: a trace's first ``requests``, or exactly ``requests``
        synthetic ones (``requests`` sets the synthetic count, it never caps it)."""
        if self.trace:
            reqs = self._read(seed)
        elif self.sessions is not None:
            reqs = generate_sessions(self.sessions, np.random.default_rng(seed))
        else:
            spec = self.synthetic if self.requests is None else replace(self.synthetic, requests=self.requests)
            reqs = generate(spec, np.random.default_rng(seed))
        if self.requests is not None and (self.trace or self.sessions is not None):
            reqs = first(reqs, self.requests)
        if self.rate_rps is not None:
            reqs = scale_to_rate(reqs, self.rate_rps)
        return reqs


@dataclass(slots=True)
class Experiment:
    """Everything one simulation needs."""

    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    policy: Any = "least-loaded"
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    slo: SLO = field(default_factory=SLO)
    seed: int = 0
    view: InfoModel = field(default_factory=InfoModel)
    warmup_s: float | None = None  # None: 10% of the arrival span


def _spec(cls: Any, data: Any, where: str) -> Any:
    """A dataclass of ints, floats and strings from a mapping; errors name the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    kinds = {f.name: f.type for f in fields(cls)}
    out = {}
    for key, value in data.items():
        if key not in kinds:
            raise ConfigError(f"{where}.{key}: unknown key; expected one of: {', '.join(kinds)}")
        want = {"int": int, "float": (int, float), "str": str}[str(kinds[key])]
        if not isinstance(value, want) or isinstance(value, bool):
            raise ConfigError(f"{where}.{key}: expected {kinds[key]}, got {value!r}")
        out[key] = float(value) if str(kinds[key]) == "float" else value
    return cls(**out)


def _synthetic(data: Any, where: str) -> SyntheticSpec:
    return _spec(SyntheticSpec, data, where)


_COMMON_KEYS = ("requests", "rate_rps", "kind")


def _sessions(data: Mapping) -> SessionsSpec:
    spec = _spec(SessionsSpec, {k: v for k, v in data.items() if k not in _COMMON_KEYS}, "workload")
    spec.check()
    return spec


def _workload(data: Any) -> WorkloadConfig:
    if not isinstance(data, Mapping):
        raise ConfigError("workload: expected a mapping")
    cfg = WorkloadConfig()
    kind = data.get("kind", "synthetic")
    if kind not in ("synthetic", "trace", "sessions"):
        raise ConfigError(f"workload.kind: expected synthetic, trace or sessions, got {kind!r}")
    if kind == "sessions":
        cfg.sessions = _sessions(data)
        data = {k: v for k, v in data.items() if k in _COMMON_KEYS}
    for key, value in data.items():
        if key == "kind":
            continue
        if key == "synthetic":
            cfg.synthetic = _synthetic(value, "workload.synthetic")
        elif key in ("trace", "format", "arrivals", "tokenizer"):
            if not isinstance(value, str):
                raise ConfigError(f"workload.{key}: expected a string, got {value!r}")
            setattr(cfg, key, value)
        elif key == "requests":
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"workload.requests: expected a positive integer, got {value!r}")
            cfg.requests = value
        elif key == "rate_rps":
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"workload.rate_rps: expected a positive number, got {value!r}")
            cfg.rate_rps = float(value)
        else:
            raise ConfigError(f"workload.{key}: unknown key; expected kind, trace, format, arrivals, tokenizer, "
                              f"synthetic, requests or rate_rps")
    return cfg


def _slo(data: Any) -> SLO:
    if not isinstance(data, Mapping):
        raise ConfigError("slo: expected a mapping")
    for key, value in data.items():
        if key not in ("ttft_s", "tpot_s"):
            raise ConfigError(f"slo.{key}: unknown key; expected ttft_s or tpot_s")
        if not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"slo.{key}: expected a positive number, got {value!r}")
    return SLO(**{k: float(v) for k, v in data.items()})


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
    exp = Experiment()
    for key, value in data.items():
        if key == "cluster":
            exp.cluster = cluster_from_dict(value)
        elif key == "policy":
            exp.policy = value
        elif key == "workload":
            exp.workload = _workload(value)
        elif key == "slo":
            exp.slo = _slo(value)
        elif key == "view":
            exp.view = info_from_dict(value)
        elif key == "warmup_s":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"warmup_s: expected a non-negative number, got {value!r}")
            exp.warmup_s = float(value)
        elif key == "seed":
            if not isinstance(value, int):
                raise ConfigError(f"seed: expected an integer, got {value!r}")
            exp.seed = value
        else:
            raise ConfigError(f"{key}: unknown top-level key; expected cluster, policy, workload, slo, view, "
                              "warmup_s or seed")
    return exp


def with_cluster(exp: Experiment, **changes: Any) -> Experiment:
    """A copy with some cluster fields replaced (flags over YAML)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    return replace(exp, cluster=replace(exp.cluster, **changes)) if changes else exp
