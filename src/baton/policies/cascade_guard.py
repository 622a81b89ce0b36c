"""What keeps CascadeInfer's re-plans from hurting the pipeline they re-plan.

The paper re-plans every period from the last period's statistics. Baton's audit found
three ways that goes wrong (a first plan built from a second of ramp-up put one instance in
the first stage, which then queued 2,283 prefills; plans changed on noise and every change
costs migrations). ``PlanGuard`` is the rule set between the planner and the stages:

- **Capacity.** Every stage that takes arrivals keeps the instances their prefills need:
  the period's arrival prompt tokens per second in its range over ``prefill_share`` of one
  instance's prefill throughput (the rest of its time decodes), rounded up. A plan short of
  that takes instances from the stages with the most to spare; when the stages cannot all
  be served, the pipeline becomes one stage.
- **Gain over cost, with hysteresis.** The current stages (a refined bound read at its
  nearest tier edge) are costed on the same statistics as the new plan; the new plan is
  taken only when its predicted gain exceeds the migrations it causes (every decoding
  sequence whose stage changes moves its KV: its context x KV bytes / link bandwidth,
  spread over ``mean_output_tokens``, the units of the plan's cut costs) plus
  ``hysteresis`` x the current cost.

The warm-up (no plan before ``warmup_s``) is the stage's own (``Cascade``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from baton.policies.cascade_plan import PlanCost, StagePlan

Stages = list[tuple[int, int, int]]  # (first tier, end tier, instances) per stage


def current_stages(cost: PlanCost, bounds: list[float], counts: list[int]) -> Stages:
    """The stages now as tier ranges: each finite bound at its nearest tier edge (on a log
    scale, edges being powers of two), kept increasing; the last ends at the last tier."""
    out: Stages = []
    a = 0
    for s, (bound, k) in enumerate(zip(bounds, counts)):
        later = len(bounds) - s - 1  # stages after this one need a tier each
        if math.isinf(bound) or later == 0:
            b = cost.tiers
        else:
            b = min(range(1, cost.tiers), key=lambda j: abs(math.log2(cost.edges[j]) - math.log2(max(bound, 1.0))))
            b = min(max(b, a + 1), cost.tiers - later)
        out.append((a, b, k))
        a = b
    return out


@dataclass(slots=True)
class PlanGuard:
    """Admits, repairs or refuses a new plan (see the module docstring); counts each outcome."""

    hysteresis: float | None = 0.05  # None: any plan the planner makes is taken
    prefill_share: float | None = 0.5  # None: no capacity rule
    counts: dict[str, int] = field(default_factory=lambda: {"adopted": 0, "kept": 0, "repaired": 0, "merged": 0})

    def admit(self, plan: StagePlan, cost: PlanCost, current: Stages, decoding_ctx: np.ndarray,
              arrivals: "Arrivals", instances: int) -> StagePlan | None:
        """The plan to switch to, or None to keep the current stages."""
        stages = self._tiers(plan, cost)
        if self.prefill_share:
            stages = self._repair(stages, cost, arrivals, instances)
        new = cost.plan_of(stages)
        if [(b, k) for _, b, k in stages] == [(b, k) for _, b, k in current]:
            self.counts["kept"] += 1
            return None
        now = cost.plan_of(current)
        moves = self.move_cost(cost, now.bounds, new.bounds, decoding_ctx)
        if self.hysteresis is not None and now.cost - new.cost <= moves + self.hysteresis * now.cost:
            self.counts["kept"] += 1
            return None
        self.counts["adopted"] += 1
        return new

    @staticmethod
    def _tiers(plan: StagePlan, cost: PlanCost) -> Stages:
        out, a = [], 0
        for bound, k in zip(plan.bounds, plan.instances):
            b = cost.edges.index(bound)
            out.append((a, b, k))
            a = b
        return out

    def _repair(self, stages: Stages, cost: PlanCost, arrivals: "Arrivals", instances: int) -> Stages:
        """Give every stage the instances its arrivals' prefills need (or merge to one)."""
        p = arrivals.prompt_tokens
        capacity = arrivals.instance_prefill_tokens_per_s * (self.prefill_share or 1.0) * arrivals.period_s
        need = [max(1, math.ceil(float(p[(p >= cost.edges[a]) & (p < cost.edges[b])].sum()) / capacity))
                for a, b, _ in stages]
        if sum(need) > instances:
            self.counts["merged"] += 1 if len(stages) > 1 else 0
            return [(0, cost.tiers, instances)]
        ks = [k for *_, k in stages]
        repaired = False
        for s in range(len(stages)):
            while ks[s] < need[s]:
                donor = max(range(len(ks)), key=lambda d: (ks[d] - need[d], d))
                ks[donor] -= 1
                ks[s] += 1
                repaired = True
        self.counts["repaired"] += int(repaired)
        return [(a, b, k) for (a, b, _), k in zip(stages, ks)]

    @staticmethod
    def move_cost(cost: PlanCost, old: tuple[float, ...], new: tuple[float, ...], ctx: np.ndarray) -> float:
        """KV moves a switch causes, in the plan's cost units."""
        if not len(ctx):
            return 0.0
        before = np.searchsorted(np.array(old), ctx, side="right")
        after = np.searchsorted(np.array(new), ctx, side="right")
        moved = ctx[before != after]
        return float(moved.sum()) * cost.kv_bytes / cost.link / cost.mean_output


@dataclass(slots=True, frozen=True)
class Arrivals:
    """The period's arrivals: their prompt lengths (tokens), the period's length (s) and
    one instance's prefill throughput (tokens/s)."""

    prompt_tokens: np.ndarray
    period_s: float
    instance_prefill_tokens_per_s: float
