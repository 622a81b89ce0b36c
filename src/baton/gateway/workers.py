"""``baton serve --workers N``: a supervisor, one control process and N relay workers.

- Control (``server.Gateway`` with a ``hub.ControlHub``) owns the policy, the bookings, the
  scrapes, the KV-event index, ticks, outlier detection and the admin API; it serves HTTP
  only on a private loopback port, which the relays pass ``/metrics``, ``/health`` and
  ``/admin/*`` through to.
- Relays (``relay.Relay``) accept on the gateway's port with SO_REUSEPORT and carry the
  streams.
- The supervisor (this module, the process ``baton serve`` started) starts them, tells
  control at once when a relay exits (so its requests are released: ``hub.relay_gone``)
  and starts a new one; a control that exits is started again and books the streams the
  relays still carry from their hellos. SIGTERM or SIGINT stops everything.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.gateway import ipc
from baton.gateway.config import GatewayConfig, relay_workers

log = logging.getLogger("baton.gateway")

POLL_S = 0.05           # how often the supervisor looks for exited children
RESTART_BACKOFF_S = 1.0  # a child that exits within this long of its start waits this long to start again
STOP_GRACE_S = 5.0       # SIGTERM, then SIGKILL after this long


def _loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _name_process(name: str) -> None:
    """Name this process in ``ps`` and ``/proc/<pid>/comm`` (Linux; at most 15 bytes):
    ``baton-control``, ``baton-relay-0``, ..."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _logging(config: GatewayConfig, who: str) -> None:
    logging.basicConfig(level=config.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s %(name)s [{who}]: %(message)s")


def control_main(config: GatewayConfig, address: str, port: int) -> None:
    """The control process: the whole gateway on a private port, and the hub."""
    from baton.gateway.listener import listener_settings, serve_app
    from baton.gateway.server import Gateway
    _name_process("baton-control")
    _logging(config, "control")
    gw = Gateway(config, hub_address=address)
    serve_app(gw.app(), "127.0.0.1", port, **listener_settings(config))


def relay_main(config: GatewayConfig, slot: int, generation: int, address: str, control_url: str) -> None:
    """One relay process on the gateway's port."""
    from baton.gateway.listener import listener_settings, serve_app
    from baton.gateway.relay import Relay
    _name_process(f"baton-relay-{slot}")
    _logging(config, f"relay {slot}")
    relay = Relay(config, slot, generation, address, control_url)
    serve_app(relay.app(), config.host, config.port, reuse_port=True, **listener_settings(config))


@dataclass(slots=True)
class Child:
    process: Any
    started_s: float
    slot: int | None  # None: control
    generation: int = 0

    @property
    def identity(self) -> str:
        return f"relay-{self.slot}-{self.generation}"


class Supervisor:
    """Starts and restarts control and the relays (see the module docstring)."""

    def __init__(self, config: GatewayConfig, workers: int) -> None:
        ipc.check_available()
        self.config, self.workers = config, workers
        self.folder = Path(tempfile.mkdtemp(prefix="baton-serve-"))
        self.address = f"ipc://{self.folder / 'control'}"
        self.control_port = _loopback_port()
        self.mp = multiprocessing.get_context("spawn")
        self.children: list[Child] = []
        self.generation = 0
        self.stopping = False

    def _start_control(self) -> Child:
        p = self.mp.Process(target=control_main, args=(self.config, self.address, self.control_port),
                            name="baton-control", daemon=False)
        p.start()
        return Child(p, time.monotonic(), None)

    def _start_relay(self, slot: int) -> Child:
        self.generation += 1
        p = self.mp.Process(target=relay_main, name=f"baton-relay-{slot}", daemon=False,
                            args=(self.config, slot, self.generation, self.address,
                                  f"http://127.0.0.1:{self.control_port}"))
        p.start()
        return Child(p, time.monotonic(), slot, self.generation)

    def run(self) -> int:
        import zmq
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        context = zmq.Context()
        notices = context.socket(zmq.DEALER)
        notices.setsockopt(zmq.IDENTITY, b"supervisor")
        notices.setsockopt(zmq.LINGER, 0)
        notices.connect(self.address)
        self.children = [self._start_control()] + [self._start_relay(i) for i in range(self.workers)]
        log.info("baton serve: %d relay workers on http://%s:%s, control on 127.0.0.1:%d", self.workers,
                 self.config.host, self.config.port, self.control_port)
        try:
            while not self.stopping:
                time.sleep(POLL_S)
                for i, child in enumerate(self.children):
                    if not child.process.is_alive() and not self.stopping:
                        self.children[i] = self._replace(child, notices)
        finally:
            self._terminate()
            notices.close(0)
            context.term()
        return 0

    def _replace(self, child: Child, notices) -> Child:
        who = "control" if child.slot is None else child.identity
        log.warning("baton serve: %s exited with %s; starting it again", who, child.process.exitcode)
        if child.slot is not None:  # its requests are released now, not after a silence
            notices.send(ipc.pack(["dead", child.identity]))
        if time.monotonic() - child.started_s < RESTART_BACKOFF_S:
            time.sleep(RESTART_BACKOFF_S)
        return self._start_control() if child.slot is None else self._start_relay(child.slot)

    def _stop(self, signum, _frame) -> None:
        self.stopping = True

    def _terminate(self) -> None:
        for child in self.children:
            if child.process.is_alive():
                child.process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for child in self.children:
            child.process.join(max(0.0, deadline - time.monotonic()))
            if child.process.is_alive():
                child.process.kill()
                child.process.join()


def serve_workers(config: GatewayConfig) -> int:
    """Run ``relay_workers(config)`` relays and a control until SIGTERM or SIGINT."""
    _logging(config, "supervisor")
    return Supervisor(config, relay_workers(config)).run()
