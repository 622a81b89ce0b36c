"""The documentation site: its reference pages are what the code generates (every setting,
flag, policy and metric, and nothing that does not exist), the YAML it shows is valid under
the schema, and ``mkdocs build --strict`` passes (no broken link or anchor, no page left
out of the navigation)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from baton.cli.reference import render
from baton.cli.schema import schema_for
from baton.core.settings import settings_of
from baton.experiments.config import Experiment
from baton.gateway.config import GatewayConfig
from baton.policies.catalog import POLICIES, STAGE_TYPES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_reference_pages_are_up_to_date():
    for path, text in render().items():
        committed = (DOCS / path).read_text() if (DOCS / path).exists() else ""
        assert committed == text, f"docs/{path} is out of date: run python scripts/gen_reference.py"


def _keys(cls: type, prefix: str = "") -> set[str]:
    """Every YAML key path of a settings type (nested settings types walked)."""
    out = set()
    for s in settings_of(cls):
        out.add(prefix + s.key)
        kinds = [s.kind, *getattr(s.kind, "__args__", ())]
        for kind in kinds:
            if isinstance(kind, type) and settings_of(kind) if hasattr(kind, "__dataclass_fields__") else False:
                out |= _keys(kind, prefix + s.key + ".")
    return out


def _documented(page: str) -> set[str]:
    """The keys a reference page's tables name (first column)."""
    return set(re.findall(r"^\| `([^`]+)` \|", (DOCS / "reference" / page).read_text(), re.M))


@pytest.mark.parametrize("cls,page", [(GatewayConfig, "gateway.md"), (Experiment, "experiment.md")])
def test_every_setting_is_documented_and_every_documented_key_exists(cls, page):
    documented = {k.replace("[]", "").replace(".<name>", "") for k in _documented(page)}
    known = _keys(cls)
    if cls is GatewayConfig:  # engines[] are settings of their own
        from baton.gateway.engine_spec import EngineSpec
        known |= _keys(EngineSpec, "engines.")
    else:  # each role's engine overrides and the sessions workload's keys
        from baton.engine_model.work import EngineConfig
        from baton.workload.sessions import SessionsSpec
        known |= _keys(EngineConfig, "cluster.engine.") | _keys(SessionsSpec, "workload.")
        # the reference documents the engine keys once, under cluster.engine, for all three
        known = {k for k in known if not k.startswith(("cluster.prefill_engine.", "cluster.decode_engine."))}
    assert known - documented == set(), "settings missing from the reference"
    assert documented - known == set(), "documented keys that do not exist"


def test_every_policy_and_stage_parameter_is_documented():
    text = (DOCS / "reference" / "policies.md").read_text()
    for name in POLICIES:
        assert f"| `{name}` |" in text
    for name, cls in STAGE_TYPES.items():
        section = text.split(f"### {name}\n", 1)[1].split("\n### ", 1)[0]
        assert set(re.findall(r"^\| `([^`]+)` \|", section, re.M)) == {s.key for s in settings_of(cls.Params)}, name


def _yaml_blocks() -> list[tuple[str, str]]:
    blocks = []
    for page in sorted(DOCS.rglob("*.md")):
        for body in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S):
            blocks.append((str(page.relative_to(DOCS)), body))
    return blocks


@pytest.mark.parametrize("page,body", _yaml_blocks(), ids=[p for p, _ in _yaml_blocks()])
def test_yaml_shown_in_the_docs_is_valid_with_its_commented_keys(page, body):
    # a commented-out key (`# key: value  # why`) is documentation too: it must exist
    text = re.sub(r"^#( ?)(\s*[a-z_]+:(?!//))", r"\2", body, flags=re.M)
    doc = yaml.safe_load(text)
    what = "gateway" if {"engines", "epp_port", "discovery"} & set(doc) else "experiment"
    errors = [e for e in jsonschema.Draft202012Validator(dict(schema_for(what))).iter_errors(doc)
              if e.validator != "required"]
    assert not errors, [f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors]


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is not installed (pip install -e '.[docs]'; make test installs it)")
def test_the_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    out = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                                                                           "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "gateway" / "index.html").exists()
