"""Colocated serving, like plain vLLM: every instance prefills and decodes its own
requests with chunked prefill; requests go to the least-loaded instance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.core.decisions import ArrivalPlan, ChangeRole, Decision
from baton.core.instance import Role
from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import NoParams, PolicyContext, Stage, params_for
from baton.policies.round_robin import RoundRobin


@dataclass(frozen=True, slots=True)
class ColocatedParams:
    """Colocated serving's parameters."""

    routing: str = setting("least-loaded", choices=("least-loaded", "round-robin"),
                           doc="least-loaded: the least token-loaded instance; round-robin: the next in turn "
                               "(Vidur's global scheduler)")


class Colocated(Stage):
    """Make every instance mixed at start; bind prefill and decode to one instance, the
    least token-loaded (``routing: least-loaded``) or the next in turn (``round-robin``,
    as Vidur's global scheduler does)."""

    name = "colocated"
    Params = ColocatedParams

    def __init__(self, context: PolicyContext, params: ColocatedParams | None = None, **values: Any) -> None:
        super().__init__(context)
        self.routing, self._turn = params_for(Colocated, params, values).routing, 0

    def start(self, view: ClusterView) -> list[Decision]:
        return [ChangeRole(inst.instance_id, Role.MIXED) for inst in view.instances()
                if inst.role is not Role.MIXED]

    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        if plan.prefill_instance is not None:
            return plan
        ids = view.decode_ids
        if self.routing == "round-robin" and ids:
            choice = ids[self._turn % len(ids)]
            self._turn += 1
        else:
            choice = view.least_token_load(ids)
        return ArrivalPlan(choice, choice, plan.prefill_chunk_limit_tokens)


class StaticPairing(RoundRobin):
    """Static xPyD disaggregation: prefill round-robin; each prefill instance hands off
    to a fixed group of decode instances, round-robin inside the group."""

    name = "static-xpyd"
    Params = NoParams

    def __init__(self, context: PolicyContext, params: NoParams | None = None, **values: Any) -> None:
        params_for(StaticPairing, params, values)
        super().__init__(context)
        self._next_in_group: dict[int, int] = {}

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        p_ids, d_ids = view.prefill_ids, view.decode_ids
        src = request.prefill_instance
        if not d_ids or src is None:
            return None
        rank = p_ids.index(src) if src in p_ids else src
        group = [d for j, d in enumerate(d_ids) if j % max(1, len(p_ids)) == rank % max(1, len(p_ids))]
        group = group or d_ids
        turn = self._next_in_group.get(src, 0)
        self._next_in_group[src] = turn + 1
        return group[turn % len(group)]


STAGES = {s.name: s for s in (Colocated, StaticPairing)}
