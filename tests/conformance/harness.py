"""In-process servers and a client for the conformance suite.

Emulators and the gateway run as aiohttp applications on the test's own event loop, each
on a socket bound to a free 127.0.0.1 port (no subprocesses: a case starts in
milliseconds). Everything the suite reads from the gateway goes over HTTP (``/metrics``,
``/admin/*``). Internals are touched in three small helpers at the top and nowhere else:
``gateway_app`` (the gateway's construction: one line to adapt if it moves),
``slowed_preset`` (registers a slowed preset by name) and ``lean_emulator``.

Log records of the gateway (``baton.gateway`` and below) are kept per case: a case's
task sets ``CASE``, and every task and callback the servers start from it (request
handlers, ticks, scrapes) inherits that context, so a record names the case it came from.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import socket
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from baton.emulator.engine_loop import LoopConfig
from baton.emulator.server import Emulator, EmulatorConfig
from baton.gateway.config import parse_config
from baton.perf import presets
from baton.engine_model.work import EngineConfig
from baton.perf.model import PerfModel
from baton.perf.scaled import ScaledPerf

ADMIN_TOKEN = "conformance-admin-token"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
HTTP_TIMEOUT_S = 10.0  # any admin or metrics read
SHUTDOWN_TIMEOUT_S = 2.0
CASE: contextvars.ContextVar[str | None] = contextvars.ContextVar("conformance_case", default=None)


def gateway_app(config: dict[str, Any]) -> web.Application:
    """Internals, touch 1 of 3 (the only one of the gateway): build the gateway's aiohttp
    app from a config mapping (the keys of examples/gateway-1p2d.yaml)."""
    from baton.gateway.server import Gateway
    return Gateway(parse_config(config, "conformance")).app()


@dataclass(frozen=True)
class _Slowed:
    base: str
    scale: float

    def build(self) -> PerfModel:
        return ScaledPerf(presets.build(self.base), self.scale)


def slowed_preset(base: str, scale: float) -> str:
    """Internals, touch 2 of 3: the name of ``base`` slowed ``scale`` times, registered
    with the presets so that the gateway, the emulators and the simulator all build the
    same model from its name."""
    if scale == 1:
        return base
    name = f"{base}/x{scale:g}"
    presets.PRESETS.setdefault(name, _Slowed(base, scale))  # type: ignore[arg-type]
    return name


def lean_emulator(emulator: Emulator) -> Emulator:
    """Internals, touch 3 of 3: an emulator whose /metrics has only the gauges and
    counters the gateway reads (running, waiting, KV usage, preemptions, ...), without
    vLLM's six latency histograms. Parsing those costs the gateway ~10 ms of CPU per
    scrape (prometheus_client's text parser), half of this suite's CPU."""
    from baton.emulator.server import _EngineMetrics
    emulator.registry = CollectorRegistry()
    emulator.registry.register(_EngineMetrics(emulator.engine, emulator.config.model,
                                              emulator.perf.kv_bytes_per_token))
    emulator.engine.timings = None
    return emulator


# --- log capture -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LogLine:
    case: str | None
    logger: str
    level: int
    message: str
    traceback: str  # "" without one

    @property
    def gateway(self) -> bool:
        """Written by the gateway, or a traceback through its code (aiohttp's and
        asyncio's loggers also report for the emulators)."""
        return self.logger.startswith(("baton.gateway", "baton.epp")) or "/baton/gateway/" in self.traceback

    def __str__(self) -> str:
        return f"{logging.getLevelName(self.level)} {self.logger}: {self.message}\n{self.traceback[-1500:]}"


class CaseLogs(logging.Handler):
    """Keeps WARNING and above from the gateway's loggers (and aiohttp's and asyncio's),
    tagged with the case whose context wrote them."""

    LOGGERS = ("baton.gateway", "baton.epp", "asyncio", "aiohttp")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[LogLine] = []

    def emit(self, record: logging.LogRecord) -> None:
        tb = "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else (record.exc_text or "")
        self.lines.append(LogLine(CASE.get(), record.name, record.levelno, record.getMessage(), tb))

    def __enter__(self) -> CaseLogs:
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)

    def of(self, case: str) -> list[LogLine]:
        return [line for line in self.lines if line.case == case]


# --- servers -----------------------------------------------------------------------------------
def _bound_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def _free_port() -> int:
    with _bound_socket() as sock:
        return sock.getsockname()[1]


async def _serve(app: web.Application, sock: socket.socket) -> web.AppRunner:
    runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_TIMEOUT_S, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


def _emulator(port: int, preset: str, batched_tokens: int, kv_port: int | None = None) -> Emulator:
    perf = presets.build(preset)
    engine = EngineConfig(batched_tokens, 256, 16)
    loop = LoopConfig(engine, perf.kv_tokens_for(engine.memory_flags()) // engine.block_size)
    events = (f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{kv_port}"}}'
              if kv_port else None)
    return lean_emulator(Emulator(EmulatorConfig(port=port, kv_events=events), loop, perf))


@dataclass(slots=True)
class Cluster:
    """A running gateway (``url``: its admin API and metrics) in front of emulators
    (``engines``, in config order); ``started``: the event-loop time at which the gateway
    was built (its clock's zero); ``front``: where clients send requests (the gateway, or
    the Envoy in front of an endpoint picker)."""

    url: str
    engines: list[str]
    started: float
    front: str = ""


RUNTIMES = ("gateway", "epp", "workers")
RELAYS = 2  # the "workers" runtime: baton serve --workers 2


async def _workers(config: dict[str, Any], sock: socket.socket, stack) -> str:
    """``baton serve --workers 2`` in-process: control (its HTTP side on ``sock``) and two
    relays sharing one port (SO_REUSEPORT) and talking to it over ZMQ ``ipc://``, as the
    supervisor's processes do; the relays' URL. Stopped by ``stack``, the relays first."""
    import tempfile

    from baton.gateway.relay import Relay
    from baton.gateway.server import Gateway
    address = f"ipc://{tempfile.mkdtemp(prefix='baton-conformance-workers-')}/control"
    parsed = parse_config({**config, "workers": RELAYS}, "conformance")
    gw = Gateway(parsed, hub_address=address)
    runner = await _serve(gw.app(), sock)
    stack.push_async_callback(runner.cleanup)
    port = _free_port()
    for slot in range(RELAYS):
        shared = socket.socket()
        shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        shared.bind(("127.0.0.1", port))
        relay = await _serve(Relay(parsed, slot, slot + 1, address, f"http://127.0.0.1:{sock.getsockname()[1]}").app(),
                             shared)
        stack.push_async_callback(relay.cleanup)

    async def joined() -> bool:
        return sum(info.introduced for info in gw.hub.relays.values()) == RELAYS
    if not await until(joined, 10.0):
        raise RuntimeError("the relays did not join control")
    return f"http://127.0.0.1:{port}"


async def _epp(config: dict[str, Any], sock: socket.socket, stack) -> str:
    """``baton epp`` in-process (its HTTP side on ``sock``, ext_proc on a free port) and a
    real Envoy in front of it (the bootstrap ``baton epp --envoy-config`` writes, fail-close);
    Envoy's URL. Everything is stopped by ``stack`` (an AsyncExitStack)."""
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as grpc_ep

    from baton.gateway.epp import check_policy
    from baton.gateway.epp_run import picker_servicer
    from baton.gateway.server import Gateway
    from baton.gateway.sidecar import Sidecar
    decoders = [e["name"] for e in config["engines"] if e["role"] == "decode"]
    socks = {name: _bound_socket() for name in decoders}
    engines = [{**e, **({"sidecar": f"http://127.0.0.1:{socks[e['name']].getsockname()[1]}"}
                        if e["name"] in socks else {})} for e in config["engines"]]
    parsed = parse_config({**config, "engines": engines, "epp_port": _free_port()}, "conformance")
    for name, side_sock in socks.items():  # a sidecar beside each decode engine, as llm-d runs them
        side = await _serve(Sidecar(parsed, name).app(), side_sock)
        stack.push_async_callback(side.cleanup)
    gw = Gateway(parsed)
    check_policy(gw)
    runner = await _serve(gw.app(), sock)
    stack.push_async_callback(runner.cleanup)
    server = grpc.aio.server()
    grpc_ep.add_ExternalProcessorServicer_to_server(picker_servicer(gw), server)
    server.add_insecure_port(f"127.0.0.1:{parsed.epp_port}")
    await server.start()
    stack.push_async_callback(server.stop, 0.5)
    for _attempt in range(3):  # a free port can be taken before Envoy binds it: then again on others
        port, admin = _free_port(), _free_port()
        proc = await _start_envoy(parsed, port, admin, stack)
        if proc.returncode is None:
            break
    if proc.returncode is not None:
        raise RuntimeError(f"envoy exited with {proc.returncode}")
    return f"http://127.0.0.1:{port}"


async def _start_envoy(parsed, port: int, admin: int, stack):
    """A real Envoy with ``baton epp --envoy-config``'s bootstrap on ``port``, once ready
    (or exited: its ``returncode`` says so)."""
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    import yaml

    from baton.gateway.envoy import bootstrap
    folder = Path(tempfile.mkdtemp(prefix="baton-conformance-envoy-"))
    (folder / "envoy.yaml").write_text(yaml.safe_dump(bootstrap(parsed, port, False, admin)))
    envoy = shutil.which("envoy") or str(Path(sys.executable).with_name("envoy"))
    proc = await asyncio.create_subprocess_exec(envoy, "-c", str(folder / "envoy.yaml"), "--disable-hot-restart",
                                                "--concurrency", "1", "-l", "error",
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)

    async def stop_envoy() -> None:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
    stack.push_async_callback(stop_envoy)
    async with aiohttp.ClientSession() as session:
        async def ready() -> bool:
            try:
                async with session.get(f"http://127.0.0.1:{admin}/ready") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return proc.returncode is not None
        await until(ready, 30.0, 0.05)

    return proc


@asynccontextmanager
async def cluster(engines: list[tuple[str, str, int]], gateway: dict[str, Any],
                  preset: str, kv_events: bool = False, runtime: str = "gateway") -> AsyncIterator[Cluster]:
    """Emulators for ``engines`` (name, role, max batched tokens) and a gateway in front of
    them (``runtime`` "epp": an endpoint picker behind a real Envoy), subscribed to the
    emulators' KV events if ``kv_events``; everything is shut down on exit, the gateway
    first."""
    from contextlib import AsyncExitStack
    runners: list[web.AppRunner] = []
    async with AsyncExitStack() as front_stack:
        try:
            specs, urls = [], []
            for name, role, batched in engines:
                sock = _bound_socket()
                port = sock.getsockname()[1]
                kv_port = _free_port() if kv_events else None
                runners.append(await _serve(_emulator(port, preset, batched, kv_port).app(), sock))
                urls.append(f"http://127.0.0.1:{port}")
                specs.append({"name": name, "url": urls[-1], "role": role,
                              **({"kv_events": f"tcp://127.0.0.1:{kv_port}"} if kv_port else {})})
            sock = _bound_socket()
            config = {**gateway, "engines": specs, "preset": preset, "admin_token": ADMIN_TOKEN}
            started = asyncio.get_running_loop().time()
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            if runtime == "epp":
                front = await _epp(config, sock, front_stack)
            elif runtime == "workers":
                front = await _workers(config, sock, front_stack)
            else:
                runners.insert(0, await _serve(gateway_app(config), sock))
                front = url
            yield Cluster(url, urls, started, front)
        finally:
            await front_stack.aclose()  # the picker and Envoy first: they hold connections to the engines
            for runner in runners:  # the gateway first: it holds connections to the engines
                await runner.cleanup()


# --- reading ---------------------------------------------------------------------------------------
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url, headers=AUTH, timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as resp:
        resp.raise_for_status()
        return await resp.json()


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text page: (name, sorted labels) -> value (a small
    parser: prometheus_client's costs tens of milliseconds per engine page)."""
    out: Samples = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


async def scrape(session: aiohttp.ClientSession, url: str) -> Samples:
    """Every sample of a server's ``/metrics``."""
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as resp:
        resp.raise_for_status()
        return parse_samples(await resp.text())


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when absent)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """The samples of ``name`` keyed by one label's value."""
    return {dict(ls)[label]: v for (n, ls), v in samples.items() if n == name and label in dict(ls)}


async def until(check, timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll the coroutine function ``check`` until it returns true or time runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if await check():
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(interval_s)
