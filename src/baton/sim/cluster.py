"""Cluster description: how many instances of each role, on which preset, with which links."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from baton.core.errors import ConfigError
from baton.core.instance import Role
from baton.sim.engine import EngineConfig


@dataclass(slots=True, frozen=True)
class ClusterSpec:
    """An xPyD cluster (plus optional mixed instances).

    ``nic_gbps`` is each instance's NIC bandwidth in gigabits per second and
    ``nic_latency_s`` its one-way latency. ``layerwise_tail`` is the share of a KV
    transfer still to send when an early-bound prefill ends (its last layers).
    """

    prefill: int = 2
    decode: int = 2
    mixed: int = 0
    preset: str = "llama-3.1-8b@a100-80g"
    engine: EngineConfig = field(default_factory=EngineConfig)
    nic_gbps: float = 100.0
    nic_latency_s: float = 20e-6
    layerwise_tail: float = 1.0 / 32.0

    @property
    def size(self) -> int:
        return self.prefill + self.decode + self.mixed

    def roles(self) -> list[Role]:
        return [Role.PREFILL] * self.prefill + [Role.DECODE] * self.decode + [Role.MIXED] * self.mixed

    @property
    def nic_bytes_per_s(self) -> float:
        return self.nic_gbps * 1e9 / 8.0


def _typed(value: Any, kind: type, key: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}")
    if kind in (int, float) and value < 0:
        raise ConfigError(f"{key}: expected a non-negative number, got {value!r}")
    return value


def cluster_from_dict(data: Mapping[str, Any], where: str = "cluster") -> ClusterSpec:
    """Build a ``ClusterSpec`` from a YAML mapping; errors name the offending key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    types = {"prefill": int, "decode": int, "mixed": int, "preset": str, "nic_gbps": float,
             "nic_latency_s": float, "layerwise_tail": float}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "engine":
            kwargs["engine"] = _engine(value, f"{where}.engine")
        elif key in types:
            kwargs[key] = _typed(value, types[key], f"{where}.{key}")
        else:
            raise ConfigError(f"{where}.{key}: unknown key; expected one of: "
                              f"{', '.join(sorted([*types, 'engine']))}")
    spec = ClusterSpec(**kwargs)
    if spec.size == 0:
        raise ConfigError(f"{where}: the cluster has no instances")
    return spec


def _engine(data: Any, where: str) -> EngineConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    names = {f.name for f in fields(EngineConfig)}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{where}.{key}: unknown key; expected one of: {', '.join(sorted(names))}")
        if _typed(value, int, f"{where}.{key}") == 0:
            raise ConfigError(f"{where}.{key}: expected a positive integer, got 0")
    return EngineConfig(**dict(data))
