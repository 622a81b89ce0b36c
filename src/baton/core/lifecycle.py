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

from baton.core.events import Completed, PrefillDone
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


def preempted(st: RequestState, generated_tokens: int, now_s: float) -> None:
    """Its KV was dropped where it ran; ``generated_tokens`` of output survive (recomputed
    with the prompt), and a decoding request's token gap is measured from now."""
    st.preemptions += 1
    if st.phase is Phase.DECODE:
        st.phase, st.generated_tokens = Phase.PREFILL, generated_tokens
        if st.first_token_s is not None:
            st.last_token_s = now_s  # preemption happens at an iteration boundary


def prefill_ended(st: RequestState, instance_id: int, now_s: float) -> PrefillDone:
    """Its prefill finished on ``instance_id``; the observation a policy gets."""
    st.prefill_end_s = now_s
    return PrefillDone(st.req_id, instance_id, now_s)


def first_token(st: RequestState, now_s: float) -> None:
    """The decode side's first iteration emitted its first token (a PD handoff's; the
    gaps after it the runtime measures in bulk)."""
    st.first_token_s = now_s


def token_emitted(st: RequestState, now_s: float, generated_tokens: int | None = None) -> None:
    """It emitted a token at ``now_s`` (its first sets its TTFT); ``generated_tokens``, when
    the runtime knows it, is its output so far."""
    if st.first_token_s is None:
        st.first_token_s = now_s
    st.last_token_s = now_s
    if generated_tokens is not None:
        st.generated_tokens = generated_tokens


def paused(st: RequestState, generated_tokens: int, now_s: float) -> None:
    """Its decode stopped where it ran with ``generated_tokens`` of output (a migration's
    last round); the gap to its next token runs from now."""
    st.generated_tokens, st.last_token_s = generated_tokens, now_s


def requeued(st: RequestState, instance_id: int) -> None:
    """Its KV is gone and it waits to recompute on ``instance_id`` (a migration by
    recompute), which then decodes it."""
    st.decode_instance = instance_id
    st.visit(instance_id)


def relayed(st: RequestState, generated_tokens: int) -> None:
    """``generated_tokens`` of its output were relayed before this runtime saw it (a flow
    adopted from another gateway process)."""
    st.generated_tokens = generated_tokens


def handoff_begun(st: RequestState, now_s: float) -> None:
    """Its prompt's KV is headed for the decode instance, which may first have to free
    blocks for it (the transfer starts once they are reserved)."""
    st.handoff_start_s = now_s


def transfer_started(st: RequestState, now_s: float) -> None:
    """Its prompt's KV began to move to the decode instance."""
    st.transfer_start_s = now_s


def transfer_ended(st: RequestState, now_s: float) -> None:
    """Its prompt's KV is on the decode instance."""
    st.transfer_end_s = now_s


def migrating(st: RequestState) -> None:
    """A migration of its decode began."""
    st.migrating = True


def migration_over(st: RequestState, moved: bool) -> None:
    """The migration ended: ``moved`` to its target, or it stays where it was."""
    st.migrating = False
    st.migrations += int(moved)


def completed(st: RequestState, now_s: float) -> Completed:
    """It finished with all its output; the observation a policy gets."""
    ended(st, now_s)
    st.generated_tokens = st.request.output_tokens
    return Completed(st.req_id, st.request.output_tokens, now_s)
