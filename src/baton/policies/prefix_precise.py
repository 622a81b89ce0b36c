"""llm-d's precise prefix-cache scorer, blended with load scorers.

Per instance, the score is a weighted sum of three scores in [0, 1]: the share of the
prompt's blocks its engine holds as a leading run (from the engines' own caches: the
simulator's engine model, or the KV events live), 1 - KV-cache usage, and the min-max
normalised queue (1 for the shortest). The weights default to llm-d's production profile,
prefix 2 : KV utilisation 1 : queue 1. The queue is the router's own count of requests
outstanding on the instance: llm-d reads the engines' waiting queues, scraped every 50 ms;
scraped once a second (Baton's default) they are stale for a whole burst, every instance
looks idle, and every new prefix lands on the lowest id. A request's blocks count as cached on the
instance it was sent to for ``predict_ttl_s`` seconds (Dynamo's predict-on-route entries),
so siblings sent before the engine's first BlockStored follow it.
"""

from __future__ import annotations

import numpy as np

from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext
from baton.policies.prefix_scoring import PrefixStage, Predictions, lower_is_better_of, nonnegative
from baton.policies.selection import argmax_of


class PrefixPrecise(PrefixStage):
    """Prefill on the instance with the best blend of cached prefix, free KV and short queue."""

    name = "prefix-precise"

    def __init__(self, context: PolicyContext, prefix_weight: float = 2.0, kv_weight: float = 1.0,
                 queue_weight: float = 1.0, predict_ttl_s: float = 5.0, bind_decode: bool = True) -> None:
        super().__init__(context, bind_decode)
        nonnegative(prefix_weight=prefix_weight, kv_weight=kv_weight, queue_weight=queue_weight,
                    predict_ttl_s=predict_ttl_s)
        self.weights = (prefix_weight, kv_weight, queue_weight)
        self.predicted = Predictions(predict_ttl_s)

    def cached_blocks(self, view: ClusterView, request: RequestState) -> dict[int, int]:
        keys = request.block_keys
        return self.merged(view.prefix_matches(keys), self.predicted.matches(view.now_s, keys))

    def pick_prefill(self, view: ClusterView, request: RequestState) -> tuple[int | None, int]:
        ids = view.prefill_ids
        cached = self.cached_blocks(view, request)
        choice = argmax_of(ids, self.scores(view, ids, cached, len(request.block_keys)))
        return choice, cached.get(choice, 0)

    def scores(self, view: ClusterView, ids: list[int], cached: dict[int, int], blocks: int) -> np.ndarray:
        """The blend per instance of ``ids``: ``cached`` leading blocks of a prompt of
        ``blocks`` blocks, free KV and the queue score."""
        wp, wk, wq = self.weights
        free = 1.0 - view.kv_usages(ids)
        # wp x match + wk x free + wq x queue, in that order (x * 1.0 is x: weights of 1 skip a pass)
        score = self.add_matched(ids, free if wk == 1.0 else wk * free, cached, wp / max(1, blocks))
        queue = lower_is_better_of(view.own_request_counts(ids))
        score += queue if wq == 1.0 else wq * queue
        return score

    def record_placement(self, view: ClusterView, request: RequestState, instance_id: int) -> None:
        self.predicted.add(view.now_s, instance_id, request.block_keys)

STAGES = {PrefixPrecise.name: PrefixPrecise}
