"""The container files: the Kubernetes example against Kubernetes' own schemas, every
gateway config they carry against Baton's parser, and, where a Docker daemon runs, the
image built and the compose stack answering a completion."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from baton.cli.main import parser as build_parser
from baton.gateway.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "examples" / "kubernetes" / "baton-gateway.yaml"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_kubernetes_example_is_valid_against_the_schemas():
    kv = pytest.importorskip("kubernetes_validate")
    docs = _docs(K8S)
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Deployment", "Service"]
    for doc in docs:
        kv.validate(doc, "1.30", strict=True)  # raises on an unknown field or a wrong type


def test_kubernetes_example_serves_its_config_and_selects_its_pods():
    docs = {d["kind"]: d for d in _docs(K8S)}
    config = parse_config(yaml.safe_load(docs["ConfigMap"]["data"]["gateway.yaml"]))
    assert [e.role.value for e in config.engines] == ["prefill", "decode", "decode"]
    pod = docs["Deployment"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert args.command == "serve" and Path(args.config).parent.as_posix() == container["volumeMounts"][0]["mountPath"]
    assert args.port == container["ports"][0]["containerPort"]
    assert docs["Service"]["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert {p["httpGet"]["path"] for p in (container["readinessProbe"], container["livenessProbe"])} == \
        {"/health", "/version"}


def test_compose_stack_points_the_gateway_at_its_emulators():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    mount = services["gateway"]["volumes"][0].split(":")
    config = parse_config(yaml.safe_load((ROOT / mount[0]).read_text()))
    for engine in config.engines:
        service = services[engine.url.split("//")[1].split(":")[0]]
        args = build_parser().parse_args(service["command"])
        assert args.command == "emulate" and engine.url.endswith(f":{args.port}") and args.host == "0.0.0.0"


def test_dockerfile_runs_baton_as_a_non_root_user_with_a_health_check():
    text = (ROOT / "Dockerfile").read_text()
    assert "USER 10001" in text and "HEALTHCHECK" in text and 'ENTRYPOINT ["baton"]' in text
    assert text.splitlines()[[i for i, ln in enumerate(text.splitlines()) if ln.startswith("FROM")][0]].startswith(
        "FROM python:3.11-slim")


def _docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not _docker_works(), reason="no Docker daemon here")
def test_compose_stack_answers_a_completion(tmp_path):
    compose = ["docker", "compose", "-f", str(ROOT / "compose.yaml"), "-p", "batontest"]
    up = subprocess.run([*compose, "up", "-d", "--build", "--wait"], capture_output=True, text=True, timeout=900)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        size = subprocess.run(["docker", "image", "inspect", "baton:latest", "--format", "{{.Size}}"],
                              capture_output=True, text=True).stdout.strip()
        print(f"image baton:latest: {int(size) / 1e6:.0f} MB")
        body = json.dumps({"prompt": "Hello there", "max_tokens": 8}).encode()
        deadline = time.monotonic() + 60
        while True:
            try:
                req = urllib.request.Request("http://127.0.0.1:8000/v1/completions", body,
                                             {"Content-Type": "application/json"})
                out = json.loads(urllib.request.urlopen(req, timeout=10).read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        assert out["usage"]["completion_tokens"] == 8 and out["choices"][0]["finish_reason"] == "length"
    finally:
        subprocess.run([*compose, "down", "-v"], capture_output=True, timeout=300)
