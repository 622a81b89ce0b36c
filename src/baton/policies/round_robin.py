"""Round-robin: prefills and decodes each cycle through their eligible instances."""

from __future__ import annotations

from typing import Any

from baton.core.decisions import ArrivalPlan
from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.policies.base import BindingParams, PolicyContext, Stage, params_for


class RoundRobin(Stage):
    """Cycle through prefill instances on arrival and decode instances at handoff (or on
    arrival too, with ``early_binding``)."""

    name = "round-robin"
    Params = BindingParams

    def __init__(self, context: PolicyContext, params: BindingParams | None = None, **values: Any) -> None:
        super().__init__(context)
        self.early_binding = params_for(RoundRobin, params, values).early_binding
        self._next_prefill = 0
        self._next_decode = 0

    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        ids = view.prefill_ids
        if plan.prefill_instance is not None or not ids:
            return plan
        choice = ids[self._next_prefill % len(ids)]
        self._next_prefill += 1
        decode = plan.decode_instance
        if self.early_binding and decode is None:
            decode = self.choose_decode(view, request)
        return ArrivalPlan(choice, decode, plan.prefill_chunk_limit_tokens)

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        ids = view.decode_ids
        if not ids:
            return None
        choice = ids[self._next_decode % len(ids)]
        self._next_decode += 1
        return choice


STAGES = {"round-robin": RoundRobin}
