"""Placement bookings (``core.bookings``): the transitions themselves, and the same request
lifecycle through both runtimes, the simulator and the gateway's ``LiveCluster``, giving
the same bookings and the same phase (``core.lifecycle``) at every step (early binding ->
[deflection] -> [KV transfer] -> decoding -> end)."""

from __future__ import annotations

import numpy as np
import pytest

from baton.core import bookings
from baton.core.decisions import ArrivalPlan, Deflect
from baton.core.events import Completed
from baton.core.instance import InstanceState, Role
from baton.core.request import Phase, Request, RequestState
from baton.gateway.config import EngineSpec
from baton.gateway.live import LiveCluster
from baton.perf import build
from baton.policies import PolicyContext, Scheduler, Stage
from baton.sim import ClusterSpec, Simulator

LONG, REQ = 0, 1  # a long prompt that fills the prefill instance, then the request followed
PROMPT, OUTPUT, CHUNK = 1000, 20, 256


def instances(n=3):
    return {i: InstanceState(i, Role.PREFILL if i == 0 else Role.DECODE, 1000, 16) for i in range(n)}


@pytest.mark.parametrize("decode,shadow_on", [(None, {}), (0, {}), (1, {1: {7: 100}})])
def test_bind_books_shadow_load_only_on_another_decode_instance(decode, shadow_on):
    insts, st = instances(), RequestState(Request(7, 0.0, 100, 10))
    bookings.bind(insts, st, 0, decode, None)
    assert {i: s.shadow for i, s in insts.items() if s.shadow} == shadow_on
    assert st.prefill_instance == 0 and st.bound_early is (decode is not None)


def test_kv_heading_elsewhere_drops_the_early_binding_and_books_incoming():
    insts, st = instances(), RequestState(Request(7, 0.0, 100, 10))
    bookings.bind(insts, st, 0, 1, None)
    bookings.kv_heading_to(insts, st, 2, 110)
    assert insts[1].shadow_tokens == 0 and insts[2].incoming == {7: 110} and st.decode_instance == 2
    bookings.joining(insts, st, 2, 111)  # landed: the booking stays, sized to the context now
    assert insts[2].incoming == {7: 111} and insts[2].incoming_tokens == 111
    bookings.drop_bookings(insts, st)
    assert all(s.shadow_tokens == 0 and s.incoming_tokens == 0 for s in insts.values())


# --- one lifecycle, two runtimes -------------------------------------------------------------
def snapshot(instances_by_id, st) -> tuple:
    """The request's bookings a policy reads: its shadow and incoming tokens per instance,
    and its placement."""
    rid = st.req_id
    books = tuple((i, {rid: s.shadow[rid]} if rid in s.shadow else {}, {rid: s.incoming[rid]} if rid in s.incoming
                   else {}) for i, s in sorted(instances_by_id.items()))
    return books, (st.prefill_instance, st.decode_instance, st.bound_early, st.chunk_limit_tokens), st.phase


class Script(Stage):
    """The long prompt on 0 (decoded on 2); the request on 0, bound early to 1; with
    ``deflect``, re-planned onto 2 while it waits. Records (tick time, facts, bookings)."""

    tick_interval_s = 0.001
    replans_prefills = True

    def __init__(self, context, deflect: bool = False):
        super().__init__(context)
        self.deflect, self.deflected, self.rows = deflect, False, []

    def plan_arrival(self, view, request, plan):
        return ArrivalPlan(0, None if request.req_id == LONG else 1)

    def choose_decode(self, view, request):
        return 2

    def observe(self, view, observation):
        if isinstance(observation, Completed) and observation.req_id == REQ:
            self.tick(view)  # the run ends with it: no tick follows

    def tick(self, view):
        st = view.ended_request(REQ)
        if st is None:
            return []
        facts = {"phase": st.phase, "deflected": self.deflected, "moving": st.transfer_start_s is not None
                 and st.transfer_end_s is None and st.prefill_end_s is not None,
                 "generated": view.generated_tokens(REQ) if not st.done else 0}
        self.rows.append((facts, snapshot({i.instance_id: i for i in view.instances()}, st)))
        if self.deflect and not self.deflected and st.phase is Phase.WAITING:
            self.deflected = True
            return [Deflect(REQ, 2, CHUNK)]
        return []


def simulated(deflect: bool) -> dict[str, tuple]:
    perf = build("llama-3.1-8b@a100-80g")
    script = Script(PolicyContext(np.random.default_rng(0), perf), deflect)
    reqs = [Request(LONG, 0.0, 9000, 2), Request(REQ, 0.0005, PROMPT, OUTPUT)]
    # a slow link: the early-bound handoff is still moving after the prefill ends
    Simulator(ClusterSpec(prefill=1, decode=2, nic_gbps=1), perf, Scheduler("script", [script]), reqs).run()

    def first(pred):
        return next(snap for facts, snap in script.rows if pred(facts))
    steps = {"queued": first(lambda f: f["phase"] is Phase.WAITING and not f["deflected"]),
             "decoding": first(lambda f: f["phase"] is Phase.DECODE and f["generated"] >= 2),
             "ended": first(lambda f: f["phase"] is Phase.FINISHED)}
    if deflect:
        steps["deflected"] = first(lambda f: f["deflected"])  # the first look after it
    else:
        steps["moving"] = first(lambda f: f["moving"])
    return steps


def live(deflect: bool) -> dict[str, tuple]:
    clock = type("Clock", (), {"t": 0.0, "__call__": lambda self: self.t})()
    c = LiveCluster(clock, default_kv_blocks=1000, block_size=16)
    for i, role in enumerate((Role.PREFILL, Role.DECODE, Role.DECODE)):
        c.add_engine(EngineSpec(f"http://e:{i}", role, f"e{i}"))
    c.new_request(9000, 2)  # the long prompt's id (its legs do not matter here)
    st, steps = c.new_request(PROMPT, OUTPUT), {}
    assert st.req_id == REQ
    c.bind(st, 0, 1, None)
    steps["queued"] = snapshot(c.instances, st)
    if deflect:  # the flow's re-planned leg: one colocated leg on 2, sent
        c.deflect(st, 2, CHUNK)
        c.begin_prefill(st)
        steps["deflected"] = snapshot(c.instances, st)
        c.prefill_done(st)
    else:  # the prefill leg was sent and returned; the decode leg pulls the KV to 1
        c.begin_prefill(st)
        c.prefill_done(st)
        c.expect_decode(st, 1)
        steps["moving"] = snapshot(c.instances, st)
    c.start_decode(st)
    c.token(st, 2)
    steps["decoding"] = snapshot(c.instances, st)
    c.end(st)
    steps["ended"] = snapshot(c.instances, st)
    return steps


@pytest.mark.parametrize("deflect", [False, True], ids=["transfer", "deflect"])
def test_both_runtimes_book_a_lifecycle_alike(deflect):
    sim, gw = simulated(deflect), live(deflect)
    assert sim.keys() == gw.keys()
    for step in sim:
        assert sim[step] == gw[step], step
    assert sim["queued"][0][1][1] == {REQ: PROMPT}  # the early binding is shadow load on 1
    phases = [sim[step][2] for step in ("queued", "deflected" if deflect else "moving", "decoding", "ended")]
    assert phases == [Phase.WAITING, Phase.PREFILL if deflect else Phase.TRANSFER, Phase.DECODE, Phase.FINISHED]
    assert all(not shadow and not incoming for _, shadow, incoming in sim["ended"][0])
