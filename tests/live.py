"""Helpers for tests that run real servers on 127.0.0.1: emulators and the gateway as
subprocesses (so that they can be killed), and a small blocking HTTP client."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

STARTUP_TIMEOUT_S = 30.0
BIN = [sys.executable, "-m", "baton.cli.main"]


def _outgoing_ports() -> range:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    return range(lo, hi + 1)


_PORTS = random.Random()  # the tests' own generator: a test's seeding never moves it
_GIVEN: set[int] = set()  # handed out in this process: two servers of one test never share a port


def free_port() -> int:
    """A port nothing listens on, outside the range the kernel gives outgoing connections:
    a port from binding to 0 lies in it, and any client's connection may take it before the
    server binds it ("address already in use", seen in the full suite)."""
    out = _outgoing_ports()
    pool = range(20000, out.start) if out.start - 20000 >= 2000 else range(out.stop, 65536)
    if len(_GIVEN) > len(pool) // 2:
        _GIVEN.clear()
    for _ in range(200):
        port = _PORTS.choice(pool)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:  # a crowded machine: the kernel's choice, as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A subprocess serving HTTP on ``port``; ``stop()`` always reaps it."""

    def __init__(self, args: list[str], port: int, log: Path, env: dict[str, str] | None = None,
                 cmd: list[str] | None = None) -> None:
        self.port, self.log = port, log
        self._logf = open(log, "wb")
        self._argv, self._env = (cmd or BIN) + args, {**os.environ, **(env or {})}
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen:
        return subprocess.Popen(self._argv, stdout=self._logf, stderr=subprocess.STDOUT, env=self._env,
                                start_new_session=True, cwd=Path(__file__).resolve().parents[1])

    def restart(self) -> None:
        """SIGKILL, then the same command on the same port again (a crash, then a restart)."""
        self.kill()
        self.proc = self._spawn()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, path: str = "/health") -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                status, _ = get(self.url + path, timeout=1.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server on {self.port} not ready: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: the engine dies without closing its streams politely."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def pause(self) -> None:
        """SIGSTOP: the engine hangs with its connections open."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume() if self.proc.poll() is None else None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        self._logf.close()


def start_emulator(tmp: Path, *args: str) -> Server:
    port = free_port()
    return Server(["emulate", "--port", str(port), *args], port, tmp / f"emulator-{port}.log")


def start_fake(tmp: Path) -> Server:
    """The misbehaving engine of tests/gateway/fake_engine.py."""
    port = free_port()
    return Server(["--port", str(port)], port, tmp / f"fake-{port}.log",
                  cmd=[sys.executable, "-m", "tests.gateway.fake_engine"])


def start_gateway(tmp: Path, config: dict[str, Any], env: dict[str, str] | None = None) -> Server:
    """``baton serve`` on a free port; ``$BATON_GATEWAY_WORKERS`` (``make real-vllm
    WORKERS=2``) runs it with relay workers, except where the config says otherwise or an
    engine has a hidden-state feed (which needs one process)."""
    port = free_port()
    workers = os.environ.get("BATON_GATEWAY_WORKERS")
    if workers and "workers" not in config and not any(e.get("hidden_states") for e in config["engines"]):
        config = {**config, "workers": int(workers)}
    path = tmp / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump({**config, "port": port}))
    return Server(["serve", "--config", str(path)], port, tmp / f"gateway-{port}.log", env)


@contextmanager
def servers(*procs: Server) -> Iterator[None]:
    try:
        for p in procs:
            p.wait_ready()
        yield
    finally:
        for p in procs:
            p.stop()


def _conn(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, port = hostport.split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout), "/" + path


def request(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
            timeout: float = 30.0, raw: bytes | None = None) -> tuple[int, Any]:
    conn, path = _conn(url, timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(payload)
    except ValueError:
        return resp.status, payload.decode(errors="replace")


def get(url: str, timeout: float = 30.0, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    return request("GET", url, headers=headers, timeout=timeout)


def post(url: str, body: Any, timeout: float = 30.0, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    return request("POST", url, body, headers, timeout)


class Stream:
    """A streamed completion read event by event; ``close()`` drops the connection."""

    def __init__(self, url: str, body: dict[str, Any], timeout: float = 30.0,
                 headers: dict[str, str] | None = None) -> None:
        self.conn, path = _conn(url, timeout)
        self.conn.request("POST", path, body=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json", **(headers or {})})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status

    def raw_events(self) -> Iterator[bytes]:
        """Each event's data bytes as sent, up to and including ``[DONE]``."""
        while True:
            line = self.resp.fp.readline()
            if not line:
                return
            if line.startswith(b"data: "):
                data = line[6:].strip()
                yield data
                if data == b"[DONE]":
                    return

    def events(self) -> Iterator[dict[str, Any]]:
        for data in self.raw_events():
            if data == b"[DONE]":
                return
            yield json.loads(data)

    def close(self) -> None:
        self.conn.sock.close() if self.conn.sock else None
        self.conn.close()


def chunk_texts(events: list[dict[str, Any]]) -> str:
    out = []
    for e in events:
        for c in e.get("choices", []):
            out.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
    return "".join(out)


def metric(url: str, name: str, headers: dict[str, str] | None = None) -> float:
    """Sum of a metric's samples on a Prometheus endpoint (0 when absent)."""
    _, text = get(url + "/metrics", headers=headers)
    total = 0.0
    for line in str(text).splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_until(pred, timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval_s)
    return pred()


def decision_log(url: str, token: str = "admin-token-for-tests") -> list[tuple[str, int, int]]:
    """``/admin/decisions`` as (kind, request id, instance id) tuples, after checking that
    every entry names its instance and carries its times."""
    entries = get(url + "/admin/decisions", headers={"Authorization": f"Bearer {token}"})[1]["decisions"]
    for e in entries:
        assert isinstance(e["instance"], str) and e["instance"] and e["time_s"] >= 0 and e["unix_time_s"] > 1.7e9, e
    return [(e["kind"], e["req_id"], e["instance_id"]) for e in entries]
