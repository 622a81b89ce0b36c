"""The simulator's clock: pending events in time order.

Event kinds double as priorities at equal times: iteration boundaries first, so that
anything arriving at a boundary sees the finished iteration and joins the next one.
Periodic kinds recur on their own and are not progress: a queue whose only events are
periodic has no work left (the simulator calls that a stall)."""

from __future__ import annotations

import heapq

SEG_END, FLOW_DONE, XFER_DONE, ARRIVAL, TICK, SAMPLE, SCRAPE, PUBLISH = range(8)
PERIODIC = frozenset({TICK, SAMPLE, SCRAPE, PUBLISH})


class EventQueue:
    """Events (time s, kind, payload), popped by time, then kind, then insertion order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, tuple]] = []
        self._seq = 0
        self.work = 0  # pending events that are not periodic

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, t: float, kind: int, payload: tuple) -> None:
        self._seq += 1
        if kind not in PERIODIC:
            self.work += 1
        heapq.heappush(self._heap, (t, kind, self._seq, kind, payload))

    def pop(self) -> tuple[float, int, tuple]:
        t, _, _, kind, payload = heapq.heappop(self._heap)
        if kind not in PERIODIC:
            self.work -= 1
        return t, kind, payload
