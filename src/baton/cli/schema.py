"""``baton config schema``: the JSON Schema of the gateway config, the experiment config, or a
policy's stages, generated from the settings types (``core.settings``): for editors (YAML
language servers), Helm values and CI checks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import baton.core.settings as settings
from baton.core.errors import ConfigError, did_you_mean
from baton.experiments.config import Experiment, WorkloadConfig
from baton.gateway.config import GatewayConfig
from baton.policies.catalog import POLICIES, STAGE_TYPES
from baton.workload.sessions import SessionsSpec


def stage_schema(name: str) -> dict[str, Any]:
    """One stage entry of a policy's ``stages`` list: ``stage: NAME`` and its parameters."""
    cls = STAGE_TYPES[name]
    schema = settings.json_schema(cls.Params)
    schema["properties"] = {"stage": {"const": name}, **schema["properties"]}
    schema["required"] = ["stage"]
    schema["description"] = " ".join((cls.__doc__ or name).split())
    return schema


def policy_schema() -> dict[str, Any]:
    """The ``policy`` key: a named policy, or a name and a list of stages."""
    stages = {"oneOf": [stage_schema(n) for n in sorted(STAGE_TYPES)]}
    return {"anyOf": [
        {"enum": sorted(POLICIES), "description": "a named policy (`baton list policies`)"},
        {"type": "object", "additionalProperties": False, "required": ["stages"],
         "properties": {"name": {"type": "string"}, "stages": {"type": "array", "minItems": 1, "items": stages}}},
    ]}


def gateway_schema() -> dict[str, Any]:
    """``baton serve``'s and ``baton epp``'s YAML file."""
    schema = settings.json_schema(GatewayConfig, "Baton gateway config")
    schema["properties"]["policy"] = {**policy_schema(), "description": "the routing policy"}
    schema.pop("required", None)  # engines or a discovery section
    return schema


def experiment_schema() -> dict[str, Any]:
    """``baton simulate``'s (compare, sweep, demo) ``--config`` file."""
    schema = settings.json_schema(Experiment, "Baton experiment config")
    schema["properties"]["policy"] = {**policy_schema(), "description": "the policy simulated"}
    workload = schema["properties"]["workload"]
    for key, prop in settings.json_schema(SessionsSpec)["properties"].items():
        workload["properties"][key] = {**prop, "description": f"kind: sessions only. {prop['description']}"}
    workload["description"] = " ".join((WorkloadConfig.__doc__ or "").split())
    return schema


def named_policy_schema(name: str) -> dict[str, Any]:
    """A named policy: its stages, with the parameters each takes and the values it sets."""
    if name not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}{did_you_mean(name, POLICIES)}; `baton list policies` lists them")
    items = []
    for spec in POLICIES[name]:
        stage = stage_schema(spec["stage"])
        for key, value in spec.items():
            if key != "stage":
                stage["properties"][key] = {**stage["properties"][key], "default": value}
        items.append(stage)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"Baton policy {name}",
            "type": "object", "properties": {"name": {"const": name},
                                             "stages": {"type": "array", "prefixItems": items}}}


def schema_for(what: str, name: str | None = None) -> Mapping[str, Any]:
    """The schema ``baton config schema WHAT [NAME]`` prints."""
    if what == "gateway":
        return gateway_schema()
    if what == "experiment":
        return experiment_schema()
    if name is None:
        return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Baton policy",
                **policy_schema()}
    return named_policy_schema(name)


def cmd_config(args: Any) -> None:
    """Print the JSON Schema asked for."""
    print(json.dumps(schema_for(args.what, args.name), indent=2, default=str))
