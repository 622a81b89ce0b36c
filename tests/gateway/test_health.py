"""What the gateway says about itself when engines are down: /health's reason and each
engine's last failure, no phantom model in /v1/models, /version."""

from __future__ import annotations

from baton import __version__
from tests.gateway.test_chaos import FAST
from tests.live import free_port, get, servers, start_fake, start_gateway, wait_until


def test_health_names_the_reason_and_models_lists_no_phantom_while_every_engine_is_down(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gw = start_gateway(tmp_path, {**FAST, "engines": [{"name": "gone", "url": dead, "role": "mixed"}],
                                  "policy": "colocated"})
    with servers(gw):
        assert wait_until(lambda: get(gw.url + "/health")[1].get("unhealthy"), timeout_s=10)
        status, body = get(gw.url + "/health")
        models = get(gw.url + "/v1/models")[1]
        version = get(gw.url + "/version")[1]
        log = gw.log.read_text()
    assert status == 503 and body["reason"] == "no engine is healthy"
    assert body["unhealthy"] == {"gone": "/metrics: connection refused"}
    assert models["data"] == []
    assert version == {"version": __version__, "policy": "colocated"}
    assert "engine gone is unhealthy after 3 failures in a row (last: /metrics: connection refused)" in log


def test_health_names_the_missing_side(tmp_path):
    a = start_fake(tmp_path)
    dead = f"http://127.0.0.1:{free_port()}"
    engines = [{"name": "p", "url": a.url, "role": "prefill"}, {"name": "d", "url": dead, "role": "decode"}]
    gw = start_gateway(tmp_path, {**FAST, "engines": engines, "policy": "least-loaded"})
    with servers(a, gw):
        assert wait_until(lambda: get(gw.url + "/health")[1].get("unhealthy"), timeout_s=10)
        status, body = get(gw.url + "/health")
        assert wait_until(lambda: get(gw.url + "/v1/models")[1]["data"] != [])
        models = [m["id"] for m in get(gw.url + "/v1/models")[1]["data"]]
    assert status == 503 and body["reason"] == "no healthy instance decodes"
    assert body["healthy_instances"] == 1 and list(body["unhealthy"]) == ["d"]
    assert models == ["baton-emulated"]  # the healthy engine's name only
