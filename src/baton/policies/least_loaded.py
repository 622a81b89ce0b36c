"""Load-based baselines: least token load, least KV usage, least outstanding requests,
least running requests (ILS when bound early), power-of-two choices. Prefills go to the instance with the least queued prefill
work. The decode instance is chosen when the prefill ends, or on arrival with
``early_binding`` (the instantaneous-load baselines SIBYL compares against)."""

from __future__ import annotations

from typing import Any

from baton.core.decisions import ArrivalPlan
from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.policies.base import BindingParams, PolicyContext, Stage, params_for
from baton.policies.selection import argmin, argmin_of


class LeastLoaded(Stage):
    """Decode to the instance with the least token load (contexts + incoming + queued)."""

    name = "least-loaded"
    Params = BindingParams

    def __init__(self, context: PolicyContext, params: BindingParams | None = None, **values: Any) -> None:
        super().__init__(context)
        self.early_binding = params_for(LeastLoaded, params, values).early_binding

    def _bind(self, view: ClusterView, request: RequestState, plan: ArrivalPlan, prefill: int | None) -> ArrivalPlan:
        """The plan with ``prefill``; with early binding, the decode instance chosen now."""
        decode = plan.decode_instance
        if self.early_binding and decode is None and prefill is not None:
            decode = self.choose_decode(view, request)
        return ArrivalPlan(prefill, decode, plan.prefill_chunk_limit_tokens)

    def prefill_key(self, view: ClusterView, instance_id: int) -> float:
        return view.prefill_load(instance_id)

    def decode_key(self, view: ClusterView, instance_id: int) -> float:
        return view.token_load(instance_id)

    def decode_keys(self, view: ClusterView, ids: list[int]):
        """``decode_key`` of every id, in one columnar read where the key allows it."""
        if type(self).decode_key is LeastLoaded.decode_key:
            return view.token_loads(ids)
        return [self.decode_key(view, i) for i in ids]

    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        if plan.prefill_instance is not None:
            return plan
        ids = view.prefill_ids
        if type(self).prefill_key is LeastLoaded.prefill_key:
            choice = argmin_of(ids, view.prefill_loads(ids))
        else:
            choice = argmin(ids, lambda i: self.prefill_key(view, i))
        return self._bind(view, request, plan, choice)

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        ids = view.decode_ids
        if type(self).decode_key is LeastLoaded.decode_key:
            return view.least_token_load(ids)
        return argmin_of(ids, self.decode_keys(view, ids)) if ids else None


class LeastKV(LeastLoaded):
    """Decode to the instance with the lowest KV-cache usage (ILS)."""

    name = "least-kv"

    def decode_key(self, view: ClusterView, instance_id: int) -> float:
        inst = view.instance(instance_id)
        incoming = view.incoming_tokens(instance_id) / (inst.block_size_tokens * max(1, inst.kv_blocks_total))
        return view.kv_usage(instance_id) + incoming


class LeastRequests(LeastLoaded):
    """Decode to the instance with the fewest outstanding requests the router booked
    there (queued, bound early while their prefill runs elsewhere, incoming, decoding):
    "least outstanding requests". Requests bound early count from their binding, not
    from when their KV starts to move: a runtime sees that moment differently (the
    simulator's layer-wise transfer starts with the prefill, a live gateway's pull after
    it), so counting from it made the same policy place differently live."""

    name = "least-requests"

    def decode_key(self, view: ClusterView, instance_id: int) -> float:
        return view.own_requests(instance_id) + view.bound_requests(instance_id)


class LeastRunning(LeastLoaded):
    """Decode to the instance whose engine reports the fewest running requests, with no
    bookings of the router's own: SIBYL's ILS as the paper's proxy deploys it (it polls
    /metrics; requests still in prefill elsewhere are not counted)."""

    name = "least-running"

    def decode_key(self, view: ClusterView, instance_id: int) -> float:
        return view.running_requests(instance_id)


class PowerOfTwo(LeastLoaded):
    """Sample two eligible instances at random; take the one with less token load."""

    name = "power-of-two"

    def _pick(self, ids: list[int], key) -> int | None:
        if len(ids) <= 2:
            return argmin(ids, key)
        a, b = self.context.rng.choice(len(ids), size=2, replace=False)
        return argmin(sorted((ids[int(a)], ids[int(b)])), key)

    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        if plan.prefill_instance is not None:
            return plan
        return self._bind(view, request, plan, self._pick(view.prefill_ids, lambda i: self.prefill_key(view, i)))

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        return self._pick(view.decode_ids, lambda i: self.decode_key(view, i))


STAGES = {s.name: s for s in (LeastLoaded, LeastKV, LeastRequests, LeastRunning, PowerOfTwo)}
