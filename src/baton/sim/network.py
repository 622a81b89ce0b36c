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
    """Active flows and their fair-shared rates (bytes/s); ``latency_s`` is added once.

    A flow's rate depends only on the flow counts at its two ends, so starting or ending
    a flow between ``src`` and ``dst`` re-rates only the flows leaving ``src`` or entering
    ``dst``; each flow's remaining bytes are settled when its rate changes (or it ends),
    not at every event: cost per event grows with the flows at two NICs, not in the cluster.
    """

    def __init__(self, nic_bytes_per_s: float, latency_s: float) -> None:
        self.nic_bytes_per_s = nic_bytes_per_s
        self.latency_s = latency_s
        self.flows: dict[int, Flow] = {}
        self._leaving: dict[int, dict[int, Flow]] = {}
        self._entering: dict[int, dict[int, Flow]] = {}
        self._next_id = 0
        self.bytes_moved = 0.0

    def start(self, now_s: float, src: int, dst: int, num_bytes: float,
              tag: Any) -> tuple[Flow, list[tuple[float, Flow]]]:
        """Start a flow; returns it and (completion time, flow) for every flow whose time changed."""
        self._next_id += 1
        flow = Flow(self._next_id, src, dst, float(num_bytes), tag, updated_s=now_s)
        self.flows[flow.flow_id] = flow
        self._leaving.setdefault(src, {})[flow.flow_id] = flow
        self._entering.setdefault(dst, {})[flow.flow_id] = flow
        self.bytes_moved += num_bytes
        return flow, self._rebalance(now_s, src, dst)

    def finish(self, now_s: float, flow_id: int) -> list[tuple[float, Flow]]:
        """Remove a finished or cancelled flow; returns rescheduled completions."""
        flow = self.flows.pop(flow_id, None)
        if flow is None:
            return []
        _settle(flow, now_s)
        del self._leaving[flow.src][flow_id], self._entering[flow.dst][flow_id]
        if flow.bytes_left > 1e-6:
            self.bytes_moved -= flow.bytes_left
        return self._rebalance(now_s, flow.src, flow.dst)

    def _rebalance(self, now_s: float, src: int, dst: int) -> list[tuple[float, Flow]]:
        affected = {**self._leaving.get(src, {}), **self._entering.get(dst, {})}
        changed = []
        for fid in sorted(affected):
            f = affected[fid]
            rate = self.nic_bytes_per_s / max(len(self._leaving[f.src]), len(self._entering[f.dst]))
            if rate != f.rate or f.version == 0:
                _settle(f, now_s)
                f.rate = rate
                f.version += 1
                changed.append((now_s + self.latency_s + f.bytes_left / rate, f))
        return changed


def _settle(flow: Flow, now_s: float) -> None:
    """Bring a flow's remaining bytes up to ``now_s`` at its current rate."""
    flow.bytes_left = max(0.0, flow.bytes_left - flow.rate * (now_s - flow.updated_s))
    flow.updated_s = now_s
