"""Engines from an InferencePool's pods (``gateway.discovery``): a gateway whose config
names no engine watches a Kubernetes API (a small real HTTP server here that serves pod
lists and watch events as the API server does) and routes to the ready pods only, as they
come, go, stop being ready and change role; a watch that ends or an API that fails costs
nothing but time."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from aiohttp import web

from baton.gateway.config import parse_config
from baton.gateway.discovery import engine_for
from baton.gateway.pool import parse_discovery
from baton.core.errors import ConfigError
from baton.core.instance import Role

pytest.importorskip("kubernetes_asyncio")

TOKEN = "admin-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NS = "serving"


class FakeKube:
    """The pods endpoint of a Kubernetes API server: lists with a resourceVersion, and
    watches that stream each change after it, one JSON event a line, until their timeout."""

    def __init__(self) -> None:
        self.pods: dict[str, dict] = {}
        self.events: list[tuple[int, str, dict]] = []
        self.rv, self.failing, self.watches = 1, False, 0
        self.changed = asyncio.Condition()

    async def put(self, name: str, ip: str, ready: bool = True, role: str = "both", app: str = "vllm") -> None:
        self.rv += 1
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": NS, "resourceVersion": str(self.rv),
                            "labels": {"app": app, "llm-d.ai/role": role}},
               "status": {"phase": "Running", "podIP": ip,
                          "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
        self.events.append((self.rv, "MODIFIED" if name in self.pods else "ADDED", pod))
        self.pods[name] = pod
        async with self.changed:
            self.changed.notify_all()

    async def delete(self, name: str) -> None:
        self.rv += 1
        self.events.append((self.rv, "DELETED", self.pods.pop(name)))
        async with self.changed:
            self.changed.notify_all()

    @staticmethod
    def _selected(pod: dict, selector: str) -> bool:
        labels = pod["metadata"]["labels"]
        return all(labels.get(k) == v for k, v in (term.split("=", 1) for term in selector.split(",") if term))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.failing:
            return web.json_response({"kind": "Status", "code": 500, "message": "etcd is down"}, status=500)
        selector = request.query.get("labelSelector", "")
        if request.query.get("watch") not in ("true", "True", "1"):
            items = [p for p in self.pods.values() if self._selected(p, selector)]
            return web.json_response({"apiVersion": "v1", "kind": "PodList",
                                      "metadata": {"resourceVersion": str(self.rv)}, "items": items})
        self.watches += 1
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        since, loop = int(request.query.get("resourceVersion", "0")), asyncio.get_running_loop()
        deadline = loop.time() + float(request.query.get("timeoutSeconds", "30"))
        while loop.time() < deadline and not self.failing:
            for rv, kind, pod in [e for e in self.events if e[0] > since]:
                since = rv
                if self._selected(pod, selector):
                    await resp.write(json.dumps({"type": kind, "object": pod}).encode() + b"\n")
            async with self.changed:
                try:
                    await asyncio.wait_for(self.changed.wait(), max(0.01, deadline - loop.time()))
                except asyncio.TimeoutError:
                    pass
        await resp.write_eof()
        return resp


async def kube_api(kube: FakeKube) -> tuple[web.AppRunner, int]:
    """``kube``'s pods endpoint served on a free port."""
    api = web.Application()
    api.router.add_get(f"/api/v1/namespaces/{NS}/pods", kube.handle)
    return await serve(api)


async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    await web.SockSite(runner, sock).start()
    return runner, sock.getsockname()[1]


def test_the_gateway_routes_to_the_ready_pods_of_its_pool():
    asyncio.run(_pool())


async def _pool() -> None:
    from baton.emulator.server import Emulator, EmulatorConfig
    from baton.emulator.engine_loop import LoopConfig
    from baton.gateway.server import Gateway
    from baton.perf import presets
    kube = FakeKube()
    runners = []
    try:
        runner, api_port = await kube_api(kube)
        runners.append(runner)
        perf = presets.build("llama-3.1-8b@a100-80g")
        first, port = await serve(Emulator(EmulatorConfig(port=0), LoopConfig.of(4096, 16, 2048, 64), perf).app())
        second, _ = await serve(Emulator(EmulatorConfig(port=0), LoopConfig.of(4096, 16, 2048, 64), perf).app(),
                                "127.0.0.2", port)  # a pool's pods share the target port
        runners += [first, second]
        await kube.put("pod-a", "127.0.0.1")
        await kube.put("pod-b", "127.0.0.2", ready=False)
        await kube.put("other", "127.0.0.3", app="other")  # outside the pool's selector
        config = parse_config({"policy": "colocated-rr", "admin_token": TOKEN, "scrape_interval_s": 0.2,
                               "discovery": {"namespace": NS, "selector": {"app": "vllm"}, "port": port,
                                             "api": f"http://127.0.0.1:{api_port}", "watch_timeout_s": 1,
                                             "retry_s": 0.2}})
        gw = Gateway(config)
        runner, gw_port = await serve(gw.app())
        runners.insert(0, runner)
        url = f"http://127.0.0.1:{gw_port}"
        async with aiohttp.ClientSession() as session:
            await _steps(session, url, kube, gw)
    finally:
        for runner in runners:
            await runner.cleanup()


async def _instances(session, url) -> dict[str, str]:
    async with session.get(url + "/admin/instances", headers=AUTH) as resp:
        return {i["name"]: i["role"] for i in (await resp.json())["instances"] if i["healthy"]}


async def _until(check, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _served_by(session, url, n: int = 6) -> set[str]:
    for _ in range(n):
        async with session.post(url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}) as resp:
            assert resp.status == 200, await resp.text()
    async with session.get(url + "/admin/decisions", headers=AUTH) as resp:
        return {d["instance"] for d in (await resp.json())["decisions"][-n:]}


async def _steps(session, url, kube: FakeKube, gw) -> None:
    await _until(lambda: _is(session, url, {"pod-a": "mixed"}))
    assert await _served_by(session, url) == {"pod-a"}
    await kube.put("pod-b", "127.0.0.2")  # ready now
    await _until(lambda: _is(session, url, {"pod-a": "mixed", "pod-b": "mixed"}))
    assert await _served_by(session, url) == {"pod-a", "pod-b"}
    await kube.put("pod-a", "127.0.0.1", ready=False)  # not ready: no new work, its requests finish
    await _until(lambda: _is(session, url, {"pod-b": "mixed"}))
    assert await _served_by(session, url) == {"pod-b"}
    await kube.put("pod-b", "127.0.0.2", role="decode")  # its role label changed
    await _until(lambda: _is(session, url, {"pod-b": "decode"}))
    watches = kube.watches
    await _until(lambda: _true(kube.watches >= watches + 2), 5)  # watches end (1 s) and start again
    kube.failing = True  # the API fails; what was discovered stays
    await kube.put("pod-a", "127.0.0.1")
    await kube.delete("pod-b")
    await asyncio.sleep(0.6)
    assert await _instances(session, url) == {"pod-b": "decode"}
    kube.failing = False  # a fresh list catches up with what happened meanwhile
    await _until(lambda: _is(session, url, {"pod-a": "mixed"}))
    assert await _served_by(session, url) == {"pod-a"}
    assert gw.discovery.changes >= 6


async def _is(session, url, want: dict[str, str]) -> bool:
    return await _instances(session, url) == want


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize("raw,where", [
    ({"port": 8000}, "selector"), ({"selector": {"app": "v"}}, "port"),
    ({"selector": {"app": "v"}, "port": 70000}, "port"), ({"selector": {"app": "v"}, "port": 80, "zone": 1}, "zone"),
    ({"selector": {"app": "v"}, "port": 80, "default_role": "leader"}, "default_role"),
    ({"selector": {"app": "v"}, "port": 80, "retry_s": 0}, "retry_s"),
])
def test_a_bad_discovery_section_is_named(raw, where):
    with pytest.raises(ConfigError, match=f"discovery.{where}"):
        parse_discovery(raw)


def test_a_pod_is_an_engine_only_while_ready_and_addressed():
    from kubernetes_asyncio.client import V1Pod, V1ObjectMeta, V1PodStatus, V1PodCondition
    s = parse_discovery({"selector": {"app": "v"}, "port": 8000, "sidecar_port": 8001})

    def pod(ip, ready="True", labels=None, deleting=None):
        return V1Pod(metadata=V1ObjectMeta(name="p", labels=labels or {}, deletion_timestamp=deleting),
                     status=V1PodStatus(pod_ip=ip, conditions=[V1PodCondition(type="Ready", status=ready)]))
    spec = engine_for(pod("10.0.0.7", labels={"llm-d.ai/role": "decode"}), s)
    assert (spec.url, spec.role, spec.name, spec.sidecar) == ("http://10.0.0.7:8000", Role.DECODE, "p",
                                                            "http://10.0.0.7:8001")
    assert engine_for(pod("fd00::7"), s).url == "http://[fd00::7]:8000"
    assert engine_for(pod("10.0.0.7"), s).role is Role.MIXED  # no role label: default_role
    assert engine_for(pod("10.0.0.7", labels={"llm-d.ai/role": "prefill"}), s).sidecar is None  # decodes nothing
    assert engine_for(pod(None), s) is None and engine_for(pod("10.0.0.7", "False"), s) is None
    assert engine_for(pod("10.0.0.7", deleting="2026-01-01T00:00:00Z"), s) is None


def test_a_config_with_discovery_needs_no_engines():
    cfg = parse_config({"discovery": {"selector": {"app": "v"}, "port": 8000}})
    assert cfg.engines == [] and cfg.discovery.selector == {"app": "v"}
    with pytest.raises(ConfigError, match="engines"):
        parse_config({"policy": "colocated"})


def test_a_sidecar_lets_a_picker_name_only_the_pools_other_ready_pods():
    asyncio.run(_sidecar())


async def _sidecar() -> None:
    from baton.gateway.sidecar import Sidecar
    kube = FakeKube()
    runner, api_port = await kube_api(kube)
    try:
        await kube.put("pod-p", "127.0.0.2", role="prefill")
        await kube.put("pod-d", "127.0.0.3", role="decode")  # the sidecar's own pod
        await kube.put("pod-q", "127.0.0.4", role="prefill", ready=False)
        config = parse_config({"discovery": {"namespace": NS, "selector": {"app": "vllm"}, "port": 8000,
                                             "api": f"http://127.0.0.1:{api_port}", "retry_s": 0.2}})
        sidecar = Sidecar(config, "pod-d")
        assert sidecar.engine.url == "http://127.0.0.1:8000" and not sidecar.allowed
        side, port = await serve(sidecar.app())
        try:
            await _until(lambda: _true(set(sidecar.allowed) == {"127.0.0.2:8000"}))
            await kube.put("pod-q", "127.0.0.4", role="prefill")
            await _until(lambda: _true(set(sidecar.allowed) == {"127.0.0.2:8000", "127.0.0.4:8000"}))
            await kube.delete("pod-p")
            await _until(lambda: _true(set(sidecar.allowed) == {"127.0.0.4:8000"}))
            async with aiohttp.ClientSession() as session:  # a pod that left is no prefill peer any more
                async with session.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "x"},
                                        headers={"x-prefiller-host-port": "127.0.0.2:8000"}) as resp:
                    assert resp.status == 403 and (await resp.json())["error"]["code"] == "prefiller_not_allowed"
        finally:
            await side.cleanup()
    finally:
        await runner.cleanup()
