"""The ``discovery`` section of a gateway config: which pods of an InferencePool are the
gateway's engines (``gateway.discovery`` watches them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from baton.core.errors import ConfigError
from baton.core.instance import Role
from baton.gateway.engine_types import ENGINE_TYPES

ROLES = {"prefill": Role.PREFILL, "decode": Role.DECODE, "both": Role.MIXED, "mixed": Role.MIXED}


@dataclass(slots=True)
class DiscoverySettings:
    """Where the pool's pods are and how a pod becomes an engine (config key ``discovery``)."""

    selector: dict[str, str]
    port: int
    namespace: str = "default"
    role_label: str = "llm-d.ai/role"
    default_role: Role = Role.MIXED
    engine_type: str = "vllm"
    sidecar_port: int | None = None  # baton epp: each decode pod's `baton sidecar`
    api: str | None = None  # the API server's URL (kubectl proxy, tests); None: in-cluster, else kubeconfig
    watch_timeout_s: int = 300
    retry_s: float = 2.0
    extra: dict[str, Any] = field(default_factory=dict)


def _fail(where: str, what: str) -> ConfigError:
    return ConfigError(f"discovery.{where}: {what}")


def parse_discovery(raw: Any) -> DiscoverySettings | None:
    """The ``discovery`` mapping (None when absent)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError("discovery: expected a mapping with selector and port")
    known = {"selector", "port", "namespace", "role_label", "default_role", "type", "sidecar_port", "api",
             "watch_timeout_s", "retry_s"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _fail(unknown[0], "unknown key")
    selector = raw.get("selector")
    if not (isinstance(selector, Mapping) and selector and all(isinstance(k, str) and isinstance(v, str)
                                                                for k, v in selector.items())):
        raise _fail("selector", "expected the pool's labels, e.g. {app: vllm}")
    for key in ("port", "sidecar_port", "watch_timeout_s"):
        v = raw.get(key)
        if (v is not None or key == "port") and not (isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536
                                                     or key == "watch_timeout_s" and isinstance(v, int) and v > 0):
            raise _fail(key, f"expected a positive integer (a port: below 65536), got {v!r}")
    role = raw.get("default_role", "mixed")
    if role not in ROLES:
        raise _fail("default_role", f"expected prefill, decode, both or mixed, got {role!r}")
    etype = raw.get("type", "vllm")
    if etype not in ENGINE_TYPES:
        raise _fail("type", f"expected one of {', '.join(ENGINE_TYPES)}")
    retry = raw.get("retry_s", 2.0)
    if not isinstance(retry, (int, float)) or isinstance(retry, bool) or retry <= 0:
        raise _fail("retry_s", "must be positive")
    for key in ("namespace", "role_label", "api"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise _fail(key, "expected a string")
    return DiscoverySettings(dict(selector), raw["port"], raw.get("namespace", "default"),
                             raw.get("role_label", "llm-d.ai/role"), ROLES[role], etype, raw.get("sidecar_port"),
                             raw.get("api"), raw.get("watch_timeout_s", 300), float(retry))
