"""Cluster description: how many instances of each role, on which preset, with which links."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import baton.core.settings as settings
from baton.core.errors import ConfigError
from baton.core.settings import setting
from baton.core.instance import Role
from baton.perf.presets import PROFILE_PREFIX, ROUTE_PREFIX, model_route
from baton.engine_model.flags import engine_from_dict
from baton.engine_model.work import EngineConfig


def _tp(value: int) -> str | None:
    return None if value >= 1 else f"expected a tensor-parallel degree >= 1, got {value}"


@dataclass(slots=True, frozen=True)
class ModelSource:
    """A model by its Hugging Face ``config`` (a config.json) or ``profile`` (a folder of
    Vidur operator profiles with the model's config.json), on ``gpu`` with ``tp`` GPUs; a
    relative path is relative to the YAML file."""

    gpu: str = setting(doc="a GPU name from `baton list gpus`")
    config: str | None = setting(None, doc="a Hugging Face config.json")
    profile: str | None = setting(None, doc="a folder of Vidur operator profiles with the model's config.json")
    tp: int = setting(1, check=_tp, doc="tensor-parallel GPUs per instance")


@dataclass(slots=True, frozen=True)
class ClusterSpec:
    """An xPyD cluster (plus optional mixed instances).

    ``preset`` names the performance model (``baton.perf.presets.build``: a preset, a
    ``hf:PATH@GPU:tpN`` model route, or a profile CSV). ``nic_gbps`` is each instance's
    NIC bandwidth in gigabits per second and
    ``nic_latency_s`` its one-way latency. ``layerwise_tail`` is the share of a KV
    transfer still to send when an early-bound prefill ends (its last layers).
    """

    prefill: int = setting(2, ge=0, flag=True, doc="prefill instances")
    decode: int = setting(2, ge=0, flag=True, doc="decode instances")
    mixed: int = setting(0, ge=0, flag=True, doc="mixed instances (prefill and decode on one engine)")
    preset: str = setting("llama-3.1-8b@a100-80g", flag=True, doc="performance model: a preset (`baton list presets`), "
                                                      "hf:CONFIG@GPU:tpN, vidur:DIR@GPU:tpN or a profile CSV")
    engine: EngineConfig = setting(factory=EngineConfig, doc="every instance's engine flags")
    prefill_engine: EngineConfig | None = setting(None, doc="prefill instances' engine flags, over engine's")
    decode_engine: EngineConfig | None = setting(None, doc="decode instances' engine flags, over engine's")
    nic_gbps: float = setting(100.0, gt=0, unit="Gb/s", doc="each instance's NIC bandwidth for KV transfers")
    nic_latency_s: float = setting(20e-6, ge=0, unit="s", doc="each transfer's one-way latency")
    layerwise_tail: float = setting(1.0 / 32.0, ge=0, le=1, doc="share of a KV transfer still to send when an "
                                                                "early-bound prefill ends (its last layers)")
    model: ModelSource | None = setting(None, doc="instead of preset: a model's config.json (or Vidur profiles) "
                                                  "on a GPU")

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
    """Build a ``ClusterSpec`` from a YAML mapping; errors name the offending key.
    ``engine`` applies to every role; ``prefill_engine`` and ``decode_engine`` override it."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    base = engine_from_dict(data.get("engine") or {}, f"{where}.engine")
    built: dict[str, Any] = {"engine": base}
    for key in ("prefill_engine", "decode_engine"):
        if data.get(key) is not None:
            built[key] = engine_from_dict(data[key], f"{where}.{key}", base)
    spec = settings.parse(ClusterSpec, data, where, built=built)
    if spec.model is not None:
        if "preset" in data:
            raise ConfigError(f"{where}: set either preset or model, not both")
        spec = replace(spec, preset=model_preset(spec.model, f"{where}.model"), model=None)
    check_counts(spec, where)
    check_engines(spec, where)
    return spec


def model_from_dict(data: Any, where: str) -> str:
    """The ``model`` mapping of a cluster as a preset string (``model_preset``)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping with config (or profile), gpu and tp")
    return model_preset(settings.parse(ModelSource, data, where), where)


def model_preset(source: ModelSource, where: str) -> str:
    """``{config: PATH, gpu: NAME, tp: N}`` as a preset string (``hf:PATH@GPU:tpN``), or
    ``{profile: DIR, ...}`` (``vidur:DIR@GPU:tpN``); a relative path is resolved by whoever
    knows the YAML's folder."""
    if (source.config is None) == (source.profile is None):
        raise ConfigError(f"{where}: give exactly one of config (a Hugging Face config.json) or "
                          "profile (a folder of Vidur profiles with the model's config.json)")
    path = source.config if source.config is not None else source.profile
    try:
        return model_route(path, source.gpu, source.tp, ROUTE_PREFIX if source.config is not None else PROFILE_PREFIX)
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
