"""Placement bookings: what a placement decision does to the cluster's bookkeeping.

Both runtimes (the simulator and the gateway) apply these transitions to the same
``InstanceState``/``RequestState`` objects, so a policy reads the same ``ClusterView``
whichever runtime runs it. Only the placement fields and the two booking maps live here:

- *shadow*: a request bound early to a decode instance while its prefill still runs
  elsewhere (its prompt tokens count as load there, SIBYL's Type 2/3);
- *incoming*: KV on its way to an instance (a PD handoff or a migration), or waiting to
  join its batch.

Prefill queues and decode rows stay with each runtime: the simulator's engine advances
them per iteration, the gateway per relayed token. Token counts are in tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

from baton.core.instance import InstanceState
from baton.core.request import RequestState


def bind(instances: Mapping[int, InstanceState], st: RequestState, prefill: int, decode: int | None,
         chunk_limit_tokens: int | None) -> None:
    """Place a new request: prefill on ``prefill``; with ``decode`` set (early binding),
    its prompt is shadow load on the decode instance until its KV heads there."""
    st.prefill_instance, st.chunk_limit_tokens = prefill, chunk_limit_tokens
    if decode is None:
        return
    st.decode_instance, st.bound_early = decode, True
    if decode != prefill:
        instances[decode].add_shadow(st.req_id, st.request.prompt_tokens)


def deflect(instances: Mapping[int, InstanceState], st: RequestState, target: int,
            chunk_limit_tokens: int) -> None:
    """A queued prefill re-planned onto ``target``, which prefills it in chunks of at most
    ``chunk_limit_tokens`` and decodes it (no KV transfer). An early-bound decode booking
    elsewhere is dropped, or its shadow load would stay there for good."""
    src, d = st.prefill_instance, st.decode_instance
    if st.bound_early and d is not None and d != src:
        instances[d].drop_shadow(st.req_id)
    st.prefill_instance, st.chunk_limit_tokens = target, chunk_limit_tokens
    st.decode_instance, st.bound_early = target, True


def kv_heading_to(instances: Mapping[int, InstanceState], st: RequestState, dst: int, ctx_tokens: int) -> None:
    """The request's KV (``ctx_tokens`` of context) is on its way to ``dst``: a shadow
    booking there, or an early binding to another decode instance, turns into incoming KV."""
    d = st.decode_instance
    if d is not None and d != dst:
        instances[d].drop_shadow(st.req_id)
    instances[dst].drop_shadow(st.req_id)
    st.decode_instance = dst
    instances[dst].add_incoming(st.req_id, ctx_tokens)


def joining(instances: Mapping[int, InstanceState], st: RequestState, dst: int, ctx_tokens: int) -> None:
    """The request's KV (``ctx_tokens`` of context) is on ``dst`` and waits to join its batch:
    the incoming booking its transfer made stays (its size updated), or one is made; the
    engine drops it when the request joins."""
    inst = instances[dst]
    if inst.incoming.get(st.req_id) != ctx_tokens:
        inst.drop_incoming(st.req_id)
        inst.add_incoming(st.req_id, ctx_tokens)


def decode_on(st: RequestState, dst: int) -> None:
    """The request will decode on ``dst`` (chosen when its prefill ended, or colocated with
    it); nothing is booked there until its KV heads that way."""
    st.decode_instance = dst


def rebind_decode(instances: Mapping[int, InstanceState], st: RequestState, dst: int) -> None:
    """An early-bound decode moves to ``dst`` before its KV heads anywhere (a data plane's
    retry reached another decode instance): its shadow load moves with it."""
    d = st.decode_instance
    if st.bound_early and d is not None and d != st.prefill_instance:
        instances[d].drop_shadow(st.req_id)
    st.decode_instance, st.bound_early = dst, True
    if dst != st.prefill_instance:
        instances[dst].add_shadow(st.req_id, st.request.prompt_tokens)


def prefill_on(st: RequestState, prefill: int) -> None:
    """The request's prefill moves to ``prefill`` (a retry that landed elsewhere); the
    runtime moves its queue booking."""
    st.prefill_instance = prefill


def drop_bookings(instances: Mapping[int, InstanceState], st: RequestState) -> None:
    """The request leaves its decode instance (ends, fails, or moves away): its shadow and
    incoming bookings there go."""
    d = st.decode_instance
    if d is None:
        return
    instances[d].drop_shadow(st.req_id)
    instances[d].drop_incoming(st.req_id)
