"""Llumnix-style load balancing with migration (the CascadeInfer paper's baseline, kept
simple): a request goes to the instance with the most *freeness*, free KV tokens per
running request; every ``interval_s`` the least free instance, if its freeness is below
``gap`` times the most free one's, live-migrates its shortest running request there (the
cheapest to move), at most one move per instance pair per round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.core.decisions import ArrivalPlan, Decision, Migrate, MigrationMode
from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, Stage, params_for


def freeness(view: ClusterView, i: int) -> float:
    inst = view.instance(i)
    free = inst.kv_blocks_free_at(view.now_s) * inst.block_size_tokens
    return free / (1 + inst.decodes.n + len(inst.incoming) + len(inst.prefill_queue))


@dataclass(frozen=True, slots=True)
class LlumnixParams:
    """Llumnix-style balancing's parameters."""

    interval_s: float = setting(1.0, gt=0, unit="s", doc="how often a migration round runs")
    gap: float = setting(0.5, gt=0, le=1, doc="a round migrates only when the least free instance's freeness is "
                                              "below this share of the most free one's")


class Llumnix(Stage):
    """Freeness placement and migration from the least to the most free instance."""

    splices_streams = True  # returns Migrate
    name = "llumnix"
    needs_bookings = True
    Params = LlumnixParams

    def __init__(self, context: PolicyContext, params: LlumnixParams | None = None, **values: Any) -> None:
        super().__init__(context)
        p = self.params = params_for(Llumnix, params, values)
        self.tick_interval_s, self.gap = p.interval_s, p.gap

    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        ids = view.decode_ids
        inst = max(ids, key=lambda i: (freeness(view, i), -i))
        return ArrivalPlan(inst, inst, None, plan.reject_reason, plan.role_changes)

    def tick(self, view: ClusterView) -> list[Decision]:
        ids = view.decode_ids
        if len(ids) < 2:
            return []
        src = min(ids, key=lambda i: (freeness(view, i), i))
        dst = max(ids, key=lambda i: (freeness(view, i), -i))
        if src == dst or view.instance(dst).incoming or freeness(view, src) >= self.gap * freeness(view, dst):
            return []
        rids, ctx, _ = view.decode_snapshot(src)
        if not len(rids):
            return []
        k = int(ctx.argmin())
        return [Migrate(int(rids[k]), dst, MigrationMode.LIVE)]


STAGES = {"llumnix": Llumnix}
