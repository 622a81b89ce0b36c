"""Iteration boundaries inside multi-iteration prefill segments.

An engine plans several chunked-prefill iterations as one segment (``prefill_run``), but
what each chunk changes outside the engine (queued prefill tokens, prefix-cache blocks) is
what policies read, and per-iteration mode shows it at each boundary. Before the simulator
handles an event at time t, every engine whose segment crossed a boundary by t publishes
the iterations done (``Engine.sync``), so a decision at t reads the state per-iteration mode
would show. Only boundaries that precede some event cost anything.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from baton.engine_model.engine import Engine


class Boundaries:
    """The next unpublished boundary of each engine running a multi-iteration prefill."""

    def __init__(self, engines: Mapping[int, Engine]) -> None:
        self.engines = engines
        self.heap: list[tuple[float, int]] = []
        self._next_s: dict[int, float] = {}

    def planned(self, instance_id: int) -> None:
        """An engine just planned a segment: follow it if it lists several prefill iterations."""
        eng = self.engines[instance_id]
        seg = eng.state.segment
        if eng.run is None or seg is None:
            return
        self._follow(instance_id, seg.ends_s[0])

    def _follow(self, instance_id: int, t_s: float) -> None:
        self._next_s[instance_id] = t_s
        heapq.heappush(self.heap, (t_s, instance_id))

    def catch_up(self, now_s: float) -> None:
        """Publish every followed engine's iterations done by ``now_s``."""
        heap = self.heap
        while heap and heap[0][0] <= now_s:
            t_s, iid = heapq.heappop(heap)
            if self._next_s.get(iid) != t_s:
                continue  # replanned since: its newer entry is in the heap
            nxt = self.engines[iid].sync(now_s)
            if nxt is None:
                del self._next_s[iid]
            else:
                self._follow(iid, nxt)
