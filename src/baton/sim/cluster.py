"""Cluster description: how many instances of each role, on which preset, with which links."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from baton.core.errors import ConfigError
from baton.core.instance import Role
from baton.perf.presets import PROFILE_PREFIX, ROUTE_PREFIX, model_route
from baton.engine_model.flags import engine_from_dict
from baton.engine_model.flags import typed as _typed
from baton.engine_model.work import EngineConfig


@dataclass(slots=True, frozen=True)
class ClusterSpec:
    """An xPyD cluster (plus optional mixed instances).

    ``preset`` names the performance model (``baton.perf.presets.build``: a preset, a
    ``hf:PATH@GPU:tpN`` model route, or a profile CSV). ``nic_gbps`` is each instance's
    NIC bandwidth in gigabits per second and
    ``nic_latency_s`` its one-way latency. ``layerwise_tail`` is the share of a KV
    transfer still to send when an early-bound prefill ends (its last layers).
    """

    prefill: int = 2
    decode: int = 2
    mixed: int = 0
    preset: str = "llama-3.1-8b@a100-80g"
    engine: EngineConfig = field(default_factory=EngineConfig)
    prefill_engine: EngineConfig | None = None
    decode_engine: EngineConfig | None = None
    nic_gbps: float = 100.0
    nic_latency_s: float = 20e-6
    layerwise_tail: float = 1.0 / 32.0

    @property
    def size(self) -> int:
        return self.prefill + self.decode + self.mixed

    def roles(self) -> list[Role]:
        return [Role.PREFILL] * self.prefill + [Role.DECODE] * self.decode + [Role.MIXED] * self.mixed

    def instance_names(self) -> list[str]:
        """One name per instance id: its starting role and its index among them
        (``prefill-0``, ``decode-0``, ``mixed-0``), as a deployment would name them; a
        name stays with its instance when the instance changes role."""
        return ([f"prefill-{i}" for i in range(self.prefill)] + [f"decode-{i}" for i in range(self.decode)]
                + [f"mixed-{i}" for i in range(self.mixed)])

    def engine_for(self, role: Role) -> EngineConfig:
        """The flags an instance starting in ``role`` runs with (mixed: ``engine``)."""
        if role is Role.PREFILL and self.prefill_engine is not None:
            return self.prefill_engine
        if role is Role.DECODE and self.decode_engine is not None:
            return self.decode_engine
        return self.engine

    def max_model_len(self, model_limit_tokens: int | None) -> int | None:
        """The longest prompt + output the cluster serves (tokens): the smallest of the
        engines' ``max_model_len`` flags, each defaulting to the model's own limit."""
        lens = [n for n in (self.engine_for(r).max_model_len or model_limit_tokens for r in self.roles()) if n]
        return min(lens) if lens else None

    @property
    def nic_bytes_per_s(self) -> float:
        return self.nic_gbps * 1e9 / 8.0


def cluster_from_dict(data: Mapping[str, Any], where: str = "cluster") -> ClusterSpec:
    """Build a ``ClusterSpec`` from a YAML mapping; errors name the offending key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    types = {"prefill": int, "decode": int, "mixed": int, "preset": str, "nic_gbps": float,
             "nic_latency_s": float, "layerwise_tail": float}
    kwargs: dict[str, Any] = {}
    engines = ("engine", "prefill_engine", "decode_engine", "model")
    for key, value in data.items():
        if key in engines:
            continue
        if key in types:
            kwargs[key] = _typed(value, types[key], f"{where}.{key}")
        else:
            raise ConfigError(f"{where}.{key}: unknown key; expected one of: "
                              f"{', '.join(sorted([*types, *engines]))}")
    # cluster.engine applies to every role; prefill_engine/decode_engine override it
    if "model" in data:
        if "preset" in data:
            raise ConfigError(f"{where}: set either preset or model, not both")
        kwargs["preset"] = model_from_dict(data["model"], f"{where}.model")
    base = engine_from_dict(data.get("engine", {}), f"{where}.engine")
    kwargs["engine"] = base
    for key in engines[1:3]:
        if key in data:
            kwargs[key] = engine_from_dict(data[key], f"{where}.{key}", base)
    spec = ClusterSpec(**kwargs)
    check_counts(spec, where)
    check_engines(spec, where)
    return spec


def model_from_dict(data: Any, where: str) -> str:
    """``{config: PATH, gpu: NAME, tp: N}`` as a preset string (``hf:PATH@GPU:tpN``), or
    ``{profile: DIR, ...}`` (``vidur:DIR@GPU:tpN``: Vidur operator profiles and the model's
    config.json in DIR); a relative path is resolved by whoever knows the YAML's folder."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping with config (or profile), gpu and tp")
    unknown = sorted(set(data) - {"config", "profile", "gpu", "tp"})
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key; expected config, profile, gpu or tp")
    if ("config" in data) == ("profile" in data):
        raise ConfigError(f"{where}: give exactly one of config (a Hugging Face config.json) or "
                          "profile (a folder of Vidur profiles with the model's config.json)")
    source = "config" if "config" in data else "profile"
    if "gpu" not in data:
        raise ConfigError(f"{where}.gpu: required (a GPU name from `baton list gpus`)")
    path, gpu = _typed(data[source], str, f"{where}.{source}"), _typed(data["gpu"], str, f"{where}.gpu")
    tp = _typed(data.get("tp", 1), int, f"{where}.tp")
    try:
        return model_route(path, gpu, tp, ROUTE_PREFIX if source == "config" else PROFILE_PREFIX)
    except ConfigError as err:
        raise ConfigError(f"{where}.{err}") from None


def check_counts(spec: ClusterSpec, where: str = "cluster") -> None:
    """A cluster needs an instance that can prefill and one that can decode."""
    if spec.mixed == 0 and (spec.prefill == 0 or spec.decode == 0):
        raise ConfigError(f"{where}: the cluster needs an instance that can prefill and one that can "
                          f"decode (prefill {spec.prefill}, decode {spec.decode}, mixed {spec.mixed})")



def check_engines(spec: ClusterSpec, where: str = "cluster") -> None:
    """KV blocks move between roles, so every role must use the same block size."""
    sizes = {spec.engine_for(r).block_size for r in Role}
    if len(sizes) > 1:
        raise ConfigError(f"{where}: prefill and decode engines must use the same block_size, "
                          f"got {sorted(sizes)}")
