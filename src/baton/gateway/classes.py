"""Request classes live: a request's priority band, tenant and own SLOs (``core.request``),
from the config (config key ``classes``) and, where it allows, from the client's headers.

Where a class comes from, first found wins:

- objective: the ``x-baton-objective`` header (GIE's ``x-gateway-inference-objective`` too)
  where ``client_headers`` is ``objective`` or ``all``; else the objective of the tenant the
  API key belongs to; else the one mapped from the model name (``models``); else
  ``default_objective``; else band 0 with the gateway's SLOs;
- tenant: the tenant the API key belongs to (a client cannot claim another); else the
  ``x-baton-tenant`` header (GIE's ``x-gateway-inference-fairness-id``) where
  ``client_headers: all``; else none (one flow);
- ``x-baton-priority``, ``x-baton-ttft-slo-ms`` and ``x-baton-tpot-slo-ms`` override the
  objective's where ``client_headers: all``.

A class header the config does not allow, an unknown objective or a malformed value is a
400 that names the header: never a silent default. Label values on ``/metrics`` are bounded
(``labels``): configured tenants and bands by name, the rest as ``other``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from baton.core.errors import ConfigError
from baton.core.settings import setting
from baton.gateway.auth import key_id
from baton.protocol.errors import ApiError

CLIENT_HEADERS = ("none", "objective", "all")
OBJECTIVE_HEADERS = ("x-baton-objective", "x-gateway-inference-objective")
TENANT_HEADERS = ("x-baton-tenant", "x-gateway-inference-fairness-id")
VALUE_HEADERS = ("x-baton-priority", "x-baton-ttft-slo-ms", "x-baton-tpot-slo-ms")
ALL_HEADERS = OBJECTIVE_HEADERS + TENANT_HEADERS + VALUE_HEADERS
MAX_PRIORITY = 1000
_TENANT = re.compile(r"[A-Za-z0-9._:-]{1,64}")
MAX_LABELS = 16  # distinct band or tenant label values on /metrics beyond the configured ones


@dataclass(frozen=True, slots=True)
class Objective:
    """A named class of requests (GIE's InferenceObjective): its band and SLOs."""

    priority: int = setting(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY,
                            doc="its priority band: higher bands leave flow control first")
    ttft_slo_ms: float | None = setting(None, gt=0, unit="ms", doc="its time-to-first-token SLO (none: ttft_slo_s)")
    tpot_slo_ms: float | None = setting(None, gt=0, unit="ms", doc="its time-per-output-token SLO (none: tpot_slo_s)")


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant: whose requests these are (flow control's fairness, per-tenant figures)."""

    api_keys: tuple[str, ...] = setting((), secret=True, doc="its client keys (accepted as api_keys too): a "
                                                              "request presenting one is this tenant's")
    objective: str | None = setting(None, doc="the objective of its requests (none: by model name)")


def _tenant_name(name: str) -> str | None:
    return None if _TENANT.fullmatch(name) else "expected 1-64 letters, digits or ._:-"


@dataclass(frozen=True, slots=True)
class ClassSettings:
    """Request classes (config key ``classes``): named objectives, tenants by API key, and
    which class headers a client may send."""

    client_headers: str = setting("none", choices=CLIENT_HEADERS,
                                  doc="class headers a client may send: none (a 400 if it does), objective "
                                      "(x-baton-objective only) or all (priority, tenant and SLOs too)")
    objectives: dict[str, Objective] = setting(factory=dict, doc="named objectives: priority and SLOs")
    models: dict[str, str] = setting(factory=dict, doc="model name -> the objective its requests get")
    tenants: dict[str, Tenant] = setting(factory=dict, doc="tenants by name, each with its API keys")
    default_objective: str | None = setting(None, doc="the objective of a request nothing else classes")

    def check(self) -> None:
        """ConfigError naming an objective that is used but not defined, or a bad tenant."""
        uses = [(f"classes.models.{m}", o) for m, o in self.models.items()]
        uses += [(f"classes.tenants.{t}.objective", s.objective) for t, s in self.tenants.items() if s.objective]
        uses += [("classes.default_objective", self.default_objective)] if self.default_objective else []
        for where, name in uses:
            if name not in self.objectives:
                known = ", ".join(sorted(self.objectives)) or "none defined"
                raise ConfigError(f"{where}: unknown objective {name!r} (classes.objectives: {known})")
        seen: dict[str, str] = {}
        for name, tenant in self.tenants.items():
            if (problem := _tenant_name(name)) is not None:
                raise ConfigError(f"classes.tenants.{name}: {problem}")
            for key in tenant.api_keys:
                if key in seen and seen[key] != name:
                    raise ConfigError(f"classes.tenants.{name}.api_keys: a key of tenant {seen[key]} too")
                seen[key] = name

    def api_keys(self) -> tuple[str, ...]:
        """Every tenant's keys."""
        return tuple(k for t in self.tenants.values() for k in t.api_keys)


class RequestClass(NamedTuple):
    """A request's class: band, tenant ("" none) and own SLOs (seconds; None: the run's)."""

    priority: int = 0
    tenant: str = ""
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None


class Classes:
    """Classes requests from their headers, API key and model (see the module docstring)."""

    def __init__(self, settings: ClassSettings) -> None:
        self.settings = settings
        self.tenant_of = {key_id(k.encode()): name for name, t in settings.tenants.items() for k in t.api_keys}
        self.bands = Labels({str(o.priority) for o in settings.objectives.values()} | {"0"})
        self.tenants = Labels(set(settings.tenants) | {""})
        # nothing in the config classes a request: only a header could (the common case, fast)
        self.plain = not (settings.objectives or settings.models or settings.tenants or settings.default_objective)

    def of(self, headers: Mapping[str, str], client: str, model: str | None) -> RequestClass:
        """The class of a request with ``headers`` (any case) from ``client`` (``key_id``
        of its API key, or anything else) asking for ``model``; ApiError 400 otherwise."""
        given = {h: headers[h] for h in ALL_HEADERS if h in headers}
        if not given and self.plain:
            return DEFAULT
        self._allowed(given)
        key_tenant = self.tenant_of.get(client)
        name = _first(given, OBJECTIVE_HEADERS)
        if name is None:
            tenant_objective = self.settings.tenants[key_tenant].objective if key_tenant else None
            name = tenant_objective or self.settings.models.get(model or "") or self.settings.default_objective
        elif name not in self.settings.objectives:
            raise ApiError(400, f"unknown objective {name!r} (known: {', '.join(sorted(self.settings.objectives))})",
                           param="x-baton-objective", code="unknown_objective")
        obj = self.settings.objectives[name] if name is not None else Objective()
        tenant = self._tenant(given, key_tenant)
        priority = _integer(given, "x-baton-priority", obj.priority)
        ttft_ms = _milliseconds(given, "x-baton-ttft-slo-ms", obj.ttft_slo_ms)
        tpot_ms = _milliseconds(given, "x-baton-tpot-slo-ms", obj.tpot_slo_ms)
        return RequestClass(priority, tenant, ttft_ms / 1000 if ttft_ms else None, tpot_ms / 1000 if tpot_ms else None)

    def _allowed(self, given: Mapping[str, str]) -> None:
        mode = self.settings.client_headers
        allowed = ALL_HEADERS if mode == "all" else OBJECTIVE_HEADERS if mode == "objective" else ()
        for header in given:
            if header not in allowed:
                raise ApiError(400, f"header {header}: this gateway does not take it from clients "
                                    f"(classes.client_headers: {mode})", param=header, code="class_header_forbidden")

    @staticmethod
    def _tenant(given: Mapping[str, str], key_tenant: str | None) -> str:
        claimed = _first(given, TENANT_HEADERS)
        if claimed is not None and _tenant_name(claimed):
            raise ApiError(400, f"header x-baton-tenant: {_tenant_name(claimed)}, got {claimed[:80]!r}",
                           param="x-baton-tenant", code="invalid_tenant")
        if key_tenant is not None:
            if claimed is not None and claimed != key_tenant:
                raise ApiError(400, "header x-baton-tenant: the API key belongs to another tenant",
                               param="x-baton-tenant", code="invalid_tenant")
            return key_tenant
        return claimed or ""


DEFAULT = RequestClass()


def _first(given: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    values = [given[n].strip() for n in names if n in given]
    if len(set(values)) > 1:
        raise ApiError(400, f"headers {' and '.join(n for n in names if n in given)} disagree", param=names[0],
                       code="conflicting_headers")
    return values[0] if values else None


def _integer(given: Mapping[str, str], header: str, default: int) -> int:
    if header not in given:
        return default
    try:
        value = int(given[header].strip())
    except ValueError:
        value = None
    if value is None or abs(value) > MAX_PRIORITY:
        raise ApiError(400, f"header {header}: expected an integer from {-MAX_PRIORITY} to {MAX_PRIORITY}, "
                            f"got {given[header][:40]!r}", param=header, code="invalid_priority")
    return value


def _milliseconds(given: Mapping[str, str], header: str, default: float | None) -> float | None:
    if header not in given:
        return default
    try:
        value = float(given[header].strip())
    except ValueError:
        value = float("nan")
    if not 0 < value < 1e9:  # NaN fails too
        raise ApiError(400, f"header {header}: expected a positive number of milliseconds, "
                            f"got {given[header][:40]!r}", param=header, code="invalid_slo")
    return value


class Labels:
    """Label values with bounded cardinality: the configured ones, then up to
    ``MAX_LABELS`` more as first seen, the rest ``other``."""

    def __init__(self, known: set[str]) -> None:
        self.known = set(known)
        self.extra: set[str] = set()

    def __call__(self, value: object) -> str:
        text = str(value)
        if text in self.known or text in self.extra:
            return text or "none"
        if len(self.extra) < MAX_LABELS:
            self.extra.add(text)
            return text or "none"
        return "other"
