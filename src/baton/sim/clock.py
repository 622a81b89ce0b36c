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
    """Events (time s, kind, payload), popped by time, then kind, then insertion order.

    The workload's arrivals (``arrive_at``, known and sorted before the run starts) stay
    out of the heap, a sorted stream merged at each pop in the order they would have
    popped from it (pushed first, they come first among equals of their kind): the heap
    then holds only the few pending engine, flow and periodic events, so every push and
    pop costs log(a dozen) comparisons, not log(the workload).

    The one pending SAMPLE (the load series' next point, every simulated second: on a
    long trace about as many events as the engines' own) waits in a slot of its own
    beside the heap with the key it would have had in it, and each pop compares it once:
    the same order, without a heap push and pop per sample."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, tuple]] = []
        self._seq = 0
        self._work = 0  # pending heap events that are not periodic
        self._arrivals: list[float] = []
        self._next = 0  # the next arrival's index
        self._sample: tuple[float, int, int, int, tuple] | None = None  # the pending SAMPLE, keyed as in the heap

    def arrive_at(self, times_s: list[float]) -> None:
        """ARRIVAL events at these times (ascending), the i-th with payload ``(i,)``."""
        if any(b < a for a, b in zip(times_s, times_s[1:])):
            raise ValueError("arrival times must be in ascending order")
        self._arrivals, self._next = list(times_s), 0

    @property
    def work(self) -> int:
        """Pending events that are not periodic (arrivals to come included)."""
        return self._work + len(self._arrivals) - self._next

    def __bool__(self) -> bool:
        return bool(self._heap) or self._next < len(self._arrivals) or self._sample is not None

    def push(self, t: float, kind: int, payload: tuple) -> None:
        self._seq += 1
        if kind not in PERIODIC:
            self._work += 1
        elif kind == SAMPLE and self._sample is None:
            self._sample = (t, kind, self._seq, kind, payload)
            return
        heapq.heappush(self._heap, (t, kind, self._seq, kind, payload))

    def pop(self) -> tuple[float, int, tuple]:
        sample = self._sample
        if sample is not None and (not self._heap or sample < self._heap[0]) and (
                self._next >= len(self._arrivals) or sample[0] < self._arrivals[self._next]):
            self._sample = None  # an arrival at the same time goes first (ARRIVAL < SAMPLE)
            return sample[0], sample[3], sample[4]
        i = self._next
        if i < len(self._arrivals):
            t = self._arrivals[i]
            heap = self._heap
            if not heap or t < heap[0][0] or (t == heap[0][0] and ARRIVAL <= heap[0][1]):
                self._next = i + 1
                return t, ARRIVAL, (i,)
        t, _, _, kind, payload = heapq.heappop(self._heap)
        if kind not in PERIODIC:
            self._work -= 1
        return t, kind, payload
