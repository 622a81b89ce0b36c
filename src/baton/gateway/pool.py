"""The ``discovery`` section of a gateway config: which pods of an InferencePool are the
gateway's engines (``gateway.discovery`` watches them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import baton.core.settings as settings
from baton.core.errors import ConfigError
from baton.core.settings import setting
from baton.core.instance import Role
from baton.gateway.engine_types import ENGINE_TYPES

ROLES = {"prefill": Role.PREFILL, "decode": Role.DECODE, "both": Role.MIXED, "mixed": Role.MIXED}


def _selector(value: dict[str, str]) -> str | None:
    return None if value else "expected the pool's labels, e.g. {app: vllm}"


@dataclass(slots=True)
class DiscoverySettings:
    """Where the pool's pods are and how a pod becomes an engine (config key ``discovery``)."""

    selector: dict[str, str] = setting(doc="the pool's pod labels, e.g. {app: vllm}", check=_selector)
    port: int = setting(gt=0, le=65535, doc="the engines' port on each pod")
    namespace: str = setting("default", doc="the pods' namespace")
    role_label: str = setting("llm-d.ai/role", doc="the pod label whose value (prefill, decode, both) is its role")
    default_role: str = setting("mixed", choices=tuple(ROLES), doc="the role of a pod without that label")
    engine_type: str = setting("vllm", key="type", choices=tuple(ENGINE_TYPES), doc="the engines' kind")
    sidecar_port: int | None = setting(None, gt=0, le=65535, doc="baton epp: each decode pod's `baton sidecar` port")
    api: str | None = setting(None, doc="the API server's URL (kubectl proxy, tests); default: in-cluster, "
                                        "else kubeconfig")
    watch_timeout_s: int = setting(300, gt=0, unit="s", doc="one watch call's length before it is renewed")
    retry_s: float = setting(2.0, gt=0, unit="s", doc="wait before retrying a failed list or watch")
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def role(self) -> Role:
        """The role of a pod without the role label."""
        return ROLES[self.default_role]


def parse_discovery(raw: Any) -> DiscoverySettings | None:
    """The ``discovery`` mapping (None when absent)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError("discovery: expected a mapping with selector and port")
    return settings.parse(DiscoverySettings, raw, "discovery")
