"""The simulator's KV flows on the network: started, stopped, and their end events (a
part of ``Simulator``, split off for size)."""

from __future__ import annotations

from baton.sim.clock import FLOW_DONE, XFER_DONE
from baton.sim.network import Flow
from baton.sim.port import FlowKind, FlowTag


class FlowEvents:
    """Flow bookkeeping of ``Simulator`` (``net``, ``events``, ``counters``, ``now``,
    ``migrator``, ``handoffs`` are the simulator's)."""

    def start_flow(self, src: int, dst: int, nbytes: float, tag: FlowTag) -> int:
        """Start a KV flow; migration flows count towards ``migration_bytes``."""
        if tag.kind is FlowKind.MIGRATION:
            self.counters.migration_bytes += nbytes
        started, changed = self.net.start(self.now, src, dst, nbytes, tag)
        self._reschedule(changed)
        return started.flow_id

    def stop_flow(self, flow_id: int) -> float:
        """End a flow now, through or not; returns the bytes it never sent."""
        if flow_id not in self.net.flows:
            return 0.0
        moved = self.net.bytes_moved
        self._reschedule(self.net.finish(self.now, flow_id))
        return moved - self.net.bytes_moved

    def _reschedule(self, changed: list[tuple[float, Flow]]) -> None:
        """Flows whose rates changed end at new times (older events go stale by version)."""
        for t, flow in changed:
            self.events.push(t, FLOW_DONE, (flow.flow_id, flow.version))

    def _on_flow_done(self, flow_id: int, version: int) -> None:
        flow = self.net.flows.get(flow_id)
        if flow is None or flow.version != version:
            return
        self._reschedule(self.net.finish(self.now, flow_id))
        if flow.tag.kind is FlowKind.MIGRATION:
            return self.migrator.flow_done(flow.tag)
        if self.handoffs.bytes_done(flow.tag.req_id):
            self.events.push(self.now, XFER_DONE, (flow.tag.req_id,))
