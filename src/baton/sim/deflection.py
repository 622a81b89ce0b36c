"""Executing ``Deflect``: a request whose prefill is still queued moves to a decode-capable
instance, which prefills it in limited chunks between its decode iterations and decodes it
there (no KV transfer)."""

from __future__ import annotations

from baton.core import bookings
from baton.core.decisions import Deflect
from baton.core.request import Phase
from baton.engine_model.work import PrefillItem, PrefillKind
from baton.sim.port import SimPort


def deflect(port: SimPort, decision: Deflect) -> bool:
    """Move the queued prefill; False (nothing done) once it has started, or if the target
    is unusable. A request bound early elsewhere is re-bound to the target. A ``Deflect``
    naming the instance a deflected prefill already runs on changes its chunk limit
    (the batch it shares changed), started or not."""
    st = port.states.get(decision.req_id)
    if st is not None and st.prefill_instance == decision.instance and st.chunk_limit_tokens is not None:
        return _retune(port, decision)
    if st is None or st.phase is not Phase.WAITING or st.prefill_instance is None:
        return False
    src, dst = st.prefill_instance, decision.instance
    eng = port.engines[src]
    item = eng.prefills.get(decision.req_id)
    target = port.instances.get(dst)
    if item is None or item.admitted or item.done_tokens or item.kind is not PrefillKind.FRESH or dst == src \
            or target is None or not target.healthy or decision.chunk_limit_tokens <= 0:
        return False
    del eng.prefills[decision.req_id]
    eng.state.drop_prefill(decision.req_id)
    eng.count_requests()
    bookings.deflect(port.instances, st, dst, decision.chunk_limit_tokens)
    port.engines[dst].add_prefill(PrefillItem(st.req_id, item.total_tokens, PrefillKind.FRESH, item.stop_at, 0,
                                             decision.chunk_limit_tokens))
    port.counters.deflections += 1
    port.retry_receives(src)
    port.kick(dst)
    return True


def _retune(port: SimPort, decision: Deflect) -> bool:
    item = port.engines[decision.instance].prefills.get(decision.req_id)
    if item is None or decision.chunk_limit_tokens <= 0:
        return False
    item.chunk_limit = decision.chunk_limit_tokens
    port.states[decision.req_id].chunk_limit_tokens = decision.chunk_limit_tokens
    if item.admitted:  # its next chunk is the new limit's: a segment planned past it ends at the boundary
        port.kick(decision.instance)
    return True
