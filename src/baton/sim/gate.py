"""Flow control in the simulator (``core.flow_control``): an arrival is held while the
cluster is saturated and placed when it has room, in band order and fairly across tenants;
one held past its time to live, or pushed out of a full queue, ends rejected as ``shed``.
The gate is pumped after every segment end, on every arrival and at every sample."""

from __future__ import annotations

from collections.abc import Callable

from baton.core.flow_control import FlowControl, FlowControlSettings
from baton.core.request import RequestState
from baton.core.view import ClusterView


class Gate:
    """The simulator's flow control: ``arrive``, ``pump``, ``completed``."""

    def __init__(self, settings: FlowControlSettings, view: ClusterView, ttft_slo_s: float,
                 place: Callable[[RequestState], None], shed: Callable[[RequestState], None]) -> None:
        self.control = FlowControl(settings)
        self.view, self.ttft_slo_s, self.place, self.shed = view, ttft_slo_s, place, shed
        self.shed_count = 0

    def arrive(self, st: RequestState) -> None:
        """Hold a new request, shed what no longer fits, and place what the cluster takes."""
        for out in self.control.offer(st, self.view.now_s, self.ttft_slo_s):
            self._shed(out)
        self.pump()

    def pump(self) -> None:
        """Shed what expired, then place what the cluster has room for now."""
        for out in self.control.expired(self.view.now_s):
            self._shed(out)
        for st in self.control.ready(self.view):
            self.place(st)

    def completed(self, st: RequestState) -> None:
        """A request placed through the gate finished (its tenant is charged its output)."""
        self.control.completed(st)

    def _shed(self, st: RequestState) -> None:
        self.shed_count += 1
        self.shed(st)


def gate_for(settings: FlowControlSettings | None, view: ClusterView, ttft_slo_s: float,
             place: Callable[[RequestState], None], reject: Callable[[RequestState, str], None]) -> Gate | None:
    """The simulator's gate, or None without flow control; ``ttft_slo_s`` is the deadline
    EDF gives a request without its own SLO."""
    if settings is None or not settings.enabled:
        return None
    return Gate(settings, view, ttft_slo_s, place, lambda st: reject(st, "shed"))
