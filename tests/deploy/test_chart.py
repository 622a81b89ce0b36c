"""The Helm chart (``charts/baton``): rendered with ``helm template`` where Helm is
installed (on the PATH, or fetched by ``scripts/get_helm.sh``, which ``make test`` runs), else
by the small renderer below, which covers every template action the chart
uses (a test fails when a template uses any other); the core kinds checked against
Kubernetes' own schemas, the InferencePool against the GIE v1 fields, and the picker's
config, arguments, ports and selectors against Baton's own parser and each other."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from baton.cli.main import parser as build_parser
from baton.gateway.config import parse_config

CHART = Path(__file__).resolve().parents[2] / "charts" / "baton"
RELEASE = {"Name": "llama", "Namespace": "serving"}
ACTIONS = [  # every form of {{ ... }} the chart may use, and how it renders
    (re.compile(r"\{\{ \.(Values|Release|Chart)\.([\w.]+) \}\}"), "value"),
    (re.compile(r"\{\{ \.(Values|Release|Chart)\.([\w.]+) \| quote \}\}"), "quote"),
    (re.compile(r"\s*\{\{- toYaml \.(Values)\.([\w.]+) \| nindent (\d+) \}\}"), "toyaml"),
]


def _lookup(scope: dict, where: str, path: str) -> Any:
    value: Any = scope[where]
    for part in path.split("."):
        value = value[part]
    return value


def _scalar(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))  # Go prints a whole float64 without ".0", as Helm does
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def render(values: dict) -> list[dict]:
    """The chart's documents as Helm renders them (for the actions in ``ACTIONS``)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    scope = {"Values": values, "Release": RELEASE, "Chart": {"Name": chart["name"], "AppVersion": chart["appVersion"]}}
    docs = []
    for template in sorted((CHART / "templates").glob("*.yaml")):
        text = template.read_text()
        leftover = re.sub("|".join(p.pattern for p, _ in ACTIONS), "", text)
        assert "{{" not in leftover, f"{template.name}: a template action the test renderer does not cover"
        for pattern, kind in ACTIONS:
            def sub(m: re.Match, kind=kind) -> str:
                value = _lookup(scope, m.group(1), m.group(2))
                if kind == "quote":
                    return json.dumps(str(value))
                if kind == "toyaml":
                    pad = " " * int(m.group(3))
                    return "\n" + "\n".join(pad + line for line in yaml.safe_dump(value).rstrip().splitlines())
                return _scalar(value)
            text = pattern.sub(sub, text)
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def helm_binary() -> str | None:
    """A real Helm: on the PATH, else where ``scripts/get_helm.sh`` caches it."""
    cached = Path(os.environ.get("BATON_CACHE", Path.home() / ".cache" / "baton")) / "helm" / "helm"
    return shutil.which("helm") or (str(cached) if os.access(cached, os.X_OK) else None)


def helm_render() -> list[dict] | None:
    helm = helm_binary()
    if helm is None:
        return None
    out = subprocess.run([helm, "template", RELEASE["Name"], str(CHART), "--namespace", RELEASE["Namespace"]],
                         capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rendered = helm_render() or render(values)
    by_kind = {d["kind"]: d for d in rendered}
    assert len(by_kind) == len(rendered)
    return by_kind


def test_the_chart_has_the_pickers_parts(docs):
    assert set(docs) == {"ConfigMap", "Deployment", "Service", "ServiceAccount", "Role", "RoleBinding",
                         "InferencePool"}


def test_the_core_kinds_are_valid_against_kubernetes_schemas(docs):
    kv = pytest.importorskip("kubernetes_validate")
    for kind, doc in docs.items():
        if kind != "InferencePool":
            kv.validate(doc, "1.30", strict=True)  # raises on an unknown field or a wrong type


def test_the_inference_pool_names_the_picker_and_selects_the_model_servers(docs):
    pool, service = docs["InferencePool"], docs["Service"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    assert set(spec) == {"selector", "targetPorts", "endpointPickerRef"}
    assert spec["endpointPickerRef"]["name"] == service["metadata"]["name"]
    assert spec["endpointPickerRef"]["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    assert spec["endpointPickerRef"]["failureMode"] in ("FailOpen", "FailClose")
    assert [p["number"] for p in spec["targetPorts"]] == [8000]


def test_the_picker_runs_with_the_pools_discovery_and_its_own_rights(docs):
    config = parse_config(yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"]))
    pool = docs["InferencePool"]["spec"]
    assert config.engines == [] and config.discovery.selector == pool["selector"]["matchLabels"]
    assert config.discovery.port == pool["targetPorts"][0]["number"]
    assert config.discovery.namespace == RELEASE["Namespace"] and config.host == "0.0.0.0"
    pod = docs["Deployment"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert args.command == "epp" and Path(args.config).parent.as_posix() == container["volumeMounts"][0]["mountPath"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": config.epp_port, "http": config.port}
    assert docs["Service"]["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["serviceAccountName"] == docs["RoleBinding"]["subjects"][0]["name"]
    rules = docs["Role"]["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_helm_lints_the_chart_and_the_fallback_renderer_agrees_with_it():
    """Where Helm is present: ``helm lint`` passes, and the renderer used without Helm gives
    exactly Helm's documents (so the checks above mean the same either way)."""
    helm = helm_binary()
    if helm is None:
        pytest.skip("no helm (scripts/get_helm.sh fetches one)")
    lint = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    ours = sorted(render(yaml.safe_load((CHART / "values.yaml").read_text())), key=key)
    assert ours == sorted(helm_render(), key=key)
