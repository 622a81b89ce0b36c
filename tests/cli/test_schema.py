"""``baton config schema``: JSON Schema generated from the settings types accepts every config
the repository ships and rejects what the parsers reject."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from baton.cli.schema import schema_for
from baton.policies.catalog import POLICIES

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p for p in (ROOT / "examples").glob("*.yaml") if not p.name.startswith("gateway"))


def validator(what: str, name: str | None = None) -> jsonschema.Draft202012Validator:
    schema = dict(schema_for(what, name))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_example_experiment_is_valid_under_the_schema(path):
    validator("experiment").validate(yaml.safe_load(path.read_text()))


def test_the_example_gateway_config_is_valid_and_a_typo_is_not():
    v = validator("gateway")
    cfg = yaml.safe_load((ROOT / "examples" / "gateway-1p2d.yaml").read_text())
    v.validate(cfg)
    for bad in ({**cfg, "max_inflite": 3}, {**cfg, "port": "80"}, {**cfg, "policy": "sibil"},
                {**cfg, "engines": [{**cfg["engines"][0], "role": "boss"}]},
                {**cfg, "policy": {"stages": [{"stage": "sibyl", "tick_s": 0}]}}):
        assert not v.is_valid(bad), bad


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_named_policy_has_a_schema_its_own_values_satisfy(name):
    schema = schema_for("policy", name)
    jsonschema.Draft202012Validator.check_schema(dict(schema))
    validator("policy").validate({"name": name, "stages": POLICIES[name]})


def test_the_command_prints_json_and_names_an_unknown_policy():
    out = subprocess.run([sys.executable, "-m", "baton.cli.main", "config", "schema", "gateway"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["title"] == "Baton gateway config"
    out = subprocess.run([sys.executable, "-m", "baton.cli.main", "config", "schema", "policy", "sibil"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "did you mean 'sibyl'" in out.stderr and "Traceback" not in out.stderr
