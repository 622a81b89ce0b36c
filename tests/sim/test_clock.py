"""The simulator's event queue (sim/clock.py): pops in (time, kind, insertion) order, with
the arrivals' stream and the SAMPLE slot merged as if every event sat in one heap."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from baton.sim.clock import ARRIVAL, PERIODIC, SAMPLE, SCRAPE, SEG_END, TICK, EventQueue


class OneHeap:
    """The reference: every event in one heap, arrivals pushed first."""

    def __init__(self, arrivals):
        self.heap, self.seq = [], 0
        for i, t in enumerate(arrivals):
            self.push(t, ARRIVAL, (i,))

    def push(self, t, kind, payload):
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, payload))

    def pop(self):
        t, kind, _, payload = heapq.heappop(self.heap)
        return t, kind, payload


@pytest.mark.parametrize("seed", range(20))
def test_the_queue_pops_what_one_heap_would(seed):
    """Random pushes on a coarse time grid (so ties between kinds, arrivals and the one
    pending SAMPLE are common), a SAMPLE re-pushed whenever one pops, as the simulator does,
    and sometimes a second SAMPLE beside it."""
    rng = np.random.default_rng(seed)
    arrivals = sorted(rng.integers(0, 30, 25).astype(float).tolist())
    q, ref = EventQueue(), OneHeap(arrivals)
    q.arrive_at(arrivals)
    for target in (q, ref):
        target.push(0.0, SAMPLE, ())
    popped = []
    for step in range(120):
        if q or ref.heap:
            got, want = q.pop(), ref.pop()
            assert got == want, (step, popped[-5:])
            popped.append(got)
            t, kind, _ = got
            if kind == SAMPLE and t < 40:
                for target in (q, ref):
                    target.push(t + 2.0, SAMPLE, ())
        kind = int(rng.choice([SEG_END, TICK, SCRAPE, SAMPLE])) if rng.random() < 0.7 else None
        if kind is not None:
            t = float(popped[-1][0] + rng.integers(0, 4)) if popped else 0.0
            for target in (q, ref):
                target.push(t, kind, (step,))
    while ref.heap:
        assert q.pop() == ref.pop()
    assert not q


def test_periodic_events_are_not_work():
    q = EventQueue()
    q.arrive_at([1.0])
    q.push(0.5, SAMPLE, ())
    q.push(0.7, SEG_END, (0, 1))
    assert SAMPLE in PERIODIC and q.work == 2
    assert [q.pop()[1] for _ in range(3)] == [SAMPLE, SEG_END, ARRIVAL] and not q and q.work == 0
