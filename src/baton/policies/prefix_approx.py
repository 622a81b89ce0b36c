"""The Gateway API Inference Extension's approximate prefix-cache scorer: no engine events;
the router remembers where it sent which prompt blocks (an LRU of blocks per instance, sized
to the instance's KV capacity in blocks, or ``lru_capacity_blocks``; kept as runs of a shared
tree, ``core/prefix_block_tree.py``) and scores each instance by
the share of the prompt's leading blocks it sent there, blended with the queue and KV
utilisation scorers at its default weights, prefix 3 : queue 2 : KV utilisation 2 (the queue
from the router's own outstanding requests, as in ``prefix_precise``). An instance past the
balance thresholds or with its KV nearly full gets no prefix credit (``bounded_matches``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.core.prefix_block_tree import BlockLruTree
from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, params_for
from baton.policies.prefix_scoring import BoundedPrefixParams, PrefixStage, bounded_matches, lower_is_better_of
from baton.policies.selection import argmax_of


@dataclass(frozen=True, slots=True)
class PrefixApproxParams(BoundedPrefixParams):
    """The approximate prefix scorer's weights (its defaults) and history size."""

    prefix_weight: float = setting(3.0, ge=0, doc="weight of the prefix score: the share of the prompt's leading "
                                                  "blocks the router sent to the instance")
    queue_weight: float = setting(2.0, ge=0, doc="weight of the queue score: the router's outstanding requests "
                                                 "there, min-max normalised, 1 for the fewest")
    kv_weight: float = setting(2.0, ge=0, doc="weight of the free-KV score: 1 - the instance's KV-cache usage")
    lru_capacity_blocks: int | None = setting(None, ge=1, unit="blocks",
                                              doc="blocks the router remembers sending each instance, least "
                                                  "recently used dropped first; unset: its KV capacity")


class PrefixApprox(PrefixStage):
    """Prefill where the router's own history, free KV and a short queue score best."""

    name = "prefix-approx"
    Params = PrefixApproxParams

    def __init__(self, context: PolicyContext, params: PrefixApproxParams | None = None, **values: Any) -> None:
        p = self.params = params_for(PrefixApprox, params, values)
        super().__init__(context, p)
        self.weights = (p.prefix_weight, p.queue_weight, p.kv_weight)
        self.capacity = p.lru_capacity_blocks
        self.history = BlockLruTree()

    def cached_blocks(self, view: ClusterView, request: RequestState) -> dict[int, int]:
        return self.history.matches(request.block_keys)

    def pick_prefill(self, view: ClusterView, request: RequestState) -> tuple[int | None, int]:
        ids, keys = view.prefill_ids, request.block_keys
        sent = self.cached_blocks(view, request)
        wp, wq, wk = self.weights
        wp /= max(1, len(keys))
        usages, counts = view.kv_usages(ids), view.own_request_counts(ids)
        credited = bounded_matches(self.params, self._where(ids), sent, usages, counts)
        queue = lower_is_better_of(counts)
        # wp x match + wq x queue + wk x free, in that order (the prefix term where matched)
        score = self.add_matched(ids, wq * queue, credited, wp)
        choice = argmax_of(ids, score + wk * (1.0 - usages))
        return choice, sent.get(choice, 0)

    def record_placement(self, view: ClusterView, request: RequestState, instance_id: int) -> None:
        self.history.record(instance_id, request.block_keys,
                            self.capacity or max(1, view.instance(instance_id).kv_blocks_total))

STAGES = {PrefixApprox.name: PrefixApprox}
