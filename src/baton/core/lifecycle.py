"""A request's phase changes and the timestamps that go with them, written once for both
runtimes: the simulator (and its handoff and migration helpers) and the gateway's
``LiveCluster`` call these and set a request's phase nowhere else. Bookings are
``core.bookings``'; token counts stay with each runtime (engine iterations there, relayed
tokens here). Times are the runtime's clock in seconds.

The phases, in order (``Phase``): WAITING (arrived) -> PREFILL (its prefill started, or
it waits to recompute after a preemption) -> TRANSFER (its KV on the way to the decode
instance: a PD handoff or a migration) -> DECODE (its KV on the decode instance: in the
batch or joining it) -> FINISHED or REJECTED. A colocated request skips TRANSFER; a
preempted or migrated-by-recompute one goes back to PREFILL; a migration that is refused
goes back to DECODE where it was. ``tests/core/test_bookings.py`` checks both runtimes
walk a request through the same phases with the same bookings."""

from __future__ import annotations

from baton.core.request import Phase, RequestState


def prefill_started(st: RequestState, instance_id: int | None, now_s: float) -> None:
    """Its prefill began on ``instance_id`` (None: unknown here; the first start counts,
    a retry does not)."""
    if st.prefill_start_s is None:
        st.prefill_start_s = now_s
    st.phase = Phase.PREFILL
    if instance_id is not None:
        st.visit(instance_id)


def back_to_prefill(st: RequestState) -> None:
    """Its KV is gone (preempted, or a handoff or migration turned into a recompute): it
    waits to prefill its context again."""
    st.phase = Phase.PREFILL


def transferring(st: RequestState) -> None:
    """Its KV is on the way to its decode instance (a handoff or a migration)."""
    st.phase = Phase.TRANSFER


def decoding(st: RequestState, instance_id: int, now_s: float) -> None:
    """Its KV is on ``instance_id``, which decodes it (the first time sets its decode start)."""
    st.phase, st.decode_instance = Phase.DECODE, instance_id
    if st.decode_start_s is None:
        st.decode_start_s = now_s
    st.visit(instance_id)


def ended(st: RequestState, now_s: float, reason: str | None = None) -> None:
    """It finished (``reason`` None) or was rejected or failed for ``reason``."""
    st.phase = Phase.REJECTED if reason else Phase.FINISHED
    st.reject_reason, st.finish_s = reason, now_s
