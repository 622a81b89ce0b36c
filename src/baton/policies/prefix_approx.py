"""The Gateway API Inference Extension's approximate prefix-cache scorer: no engine events;
the router remembers where it sent which prompt blocks (an LRU of blocks per instance, sized
to the instance's KV capacity in blocks, or ``lru_capacity_blocks``; kept as runs of a shared
tree, ``core/prefix_block_tree.py``) and scores each instance by
the share of the prompt's leading blocks it sent there, blended with the queue and KV
utilisation scorers at its default weights, prefix 3 : queue 2 : KV utilisation 2 (the queue
from the router's own outstanding requests, as in ``prefix_precise``).
"""

from __future__ import annotations

from baton.core.prefix_block_tree import BlockLruTree
from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext
from baton.policies.prefix_scoring import PrefixStage, lower_is_better_of, nonnegative
from baton.policies.selection import argmax_of


class PrefixApprox(PrefixStage):
    """Prefill where the router's own history, free KV and a short queue score best."""

    name = "prefix-approx"

    def __init__(self, context: PolicyContext, prefix_weight: float = 3.0, queue_weight: float = 2.0,
                 kv_weight: float = 2.0, lru_capacity_blocks: int | None = None, bind_decode: bool = True) -> None:
        super().__init__(context, bind_decode)
        nonnegative(prefix_weight=prefix_weight, queue_weight=queue_weight, kv_weight=kv_weight)
        if lru_capacity_blocks is not None and lru_capacity_blocks < 1:
            raise ValueError("lru_capacity_blocks must be >= 1")
        self.weights = (prefix_weight, queue_weight, kv_weight)
        self.capacity = lru_capacity_blocks
        self.history = BlockLruTree()

    def cached_blocks(self, view: ClusterView, request: RequestState) -> dict[int, int]:
        return self.history.matches(request.block_keys)

    def pick_prefill(self, view: ClusterView, request: RequestState) -> tuple[int | None, int]:
        ids, keys = view.prefill_ids, request.block_keys
        sent = self.cached_blocks(view, request)
        wp, wq, wk = self.weights
        wp /= max(1, len(keys))
        queue = lower_is_better_of(view.own_request_counts(ids))
        # wp x match + wq x queue + wk x free, in that order (the prefix term where matched)
        score = self.add_matched(ids, wq * queue, sent, wp)
        choice = argmax_of(ids, score + wk * (1.0 - view.kv_usages(ids)))
        return choice, sent.get(choice, 0)

    def record_placement(self, view: ClusterView, request: RequestState, instance_id: int) -> None:
        self.history.record(instance_id, request.block_keys,
                            self.capacity or max(1, view.instance(instance_id).kv_blocks_total))

STAGES = {PrefixApprox.name: PrefixApprox}
