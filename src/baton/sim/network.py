"""KV-transfer links: each instance has a NIC (full duplex); concurrent flows share it.

A flow's rate is min(source NIC / flows leaving the source, destination NIC / flows
entering the destination). Rates are recomputed whenever a flow starts or ends, and
the simulator reschedules completion events by version number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Flow:
    """Bytes moving from ``src`` to ``dst``; ``tag`` tells the simulator what it is for
    (the network never reads it)."""

    flow_id: int
    src: int
    dst: int
    bytes_left: float
    tag: Any
    rate: float = 0.0
    updated_s: float = 0.0
    version: int = 0


class Network:
    """Active flows and their fair-shared rates (bytes/s); ``latency_s`` is added once."""

    def __init__(self, nic_bytes_per_s: float, latency_s: float) -> None:
        self.nic_bytes_per_s = nic_bytes_per_s
        self.latency_s = latency_s
        self.flows: dict[int, Flow] = {}
        self._next_id = 0
        self.bytes_moved = 0.0

    def start(self, now_s: float, src: int, dst: int, num_bytes: float,
              tag: Any) -> tuple[Flow, list[tuple[float, Flow]]]:
        """Start a flow; returns it and (completion time, flow) for every flow whose time changed."""
        self._settle(now_s)
        self._next_id += 1
        flow = Flow(self._next_id, src, dst, float(num_bytes), tag, updated_s=now_s)
        self.flows[flow.flow_id] = flow
        self.bytes_moved += num_bytes
        return flow, self._rebalance(now_s)

    def finish(self, now_s: float, flow_id: int) -> list[tuple[float, Flow]]:
        """Remove a finished or cancelled flow; returns rescheduled completions."""
        self._settle(now_s)
        flow = self.flows.pop(flow_id, None)
        if flow is not None and flow.bytes_left > 1e-6:
            self.bytes_moved -= flow.bytes_left
        return self._rebalance(now_s)

    def _settle(self, now_s: float) -> None:
        for f in self.flows.values():
            f.bytes_left = max(0.0, f.bytes_left - f.rate * (now_s - f.updated_s))
            f.updated_s = now_s

    def _rebalance(self, now_s: float) -> list[tuple[float, Flow]]:
        out_count: dict[int, int] = {}
        in_count: dict[int, int] = {}
        for f in self.flows.values():
            out_count[f.src] = out_count.get(f.src, 0) + 1
            in_count[f.dst] = in_count.get(f.dst, 0) + 1
        changed = []
        for f in self.flows.values():
            rate = self.nic_bytes_per_s / max(out_count[f.src], in_count[f.dst])
            if rate != f.rate or f.version == 0:
                f.rate = rate
                f.version += 1
                changed.append((now_s + self.latency_s + f.bytes_left / rate, f))
        return changed
