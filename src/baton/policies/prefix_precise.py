"""llm-d's precise prefix-cache scorer, blended with load scorers.

Per instance, the score is a weighted sum of three scores in [0, 1]: the share of the
prompt's blocks its engine holds as a leading run (from the engines' own caches: the
simulator's engine model, or the KV events live), 1 - KV-cache usage, and the min-max
normalised queue (1 for the shortest). The weights default to llm-d's production profile,
prefix 2 : KV utilisation 1 : queue 1. The queue is the router's own count of requests
outstanding on the instance: llm-d reads the engines' waiting queues, scraped every 50 ms;
scraped once a second (Baton's default) they are stale for a whole burst, every instance
looks idle, and every new prefix lands on the lowest id. A full match scores 2, as much as
the load scores can ever take back, so an instance past SGLang's balance thresholds
(``balance_abs``, ``balance_rel``) or with its KV nearly full (``saturated_kv_usage``) gets
no prefix credit (``bounded_matches``): one popular prefix no longer piles onto one engine. A request's blocks count as cached on the
instance it was sent to for ``predict_ttl_s`` seconds (Dynamo's predict-on-route entries),
so siblings sent before the engine's first BlockStored follow it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, params_for
from baton.policies.prefix_scoring import (BoundedPrefixParams, PrefixStage, Predictions, bounded_matches,
                                          lower_is_better_of)
from baton.policies.selection import argmax_of


@dataclass(frozen=True, slots=True)
class PrefixPreciseParams(BoundedPrefixParams):
    """The precise prefix scorer's weights (llm-d's production profile) and predictions."""

    prefix_weight: float = setting(2.0, ge=0, doc="weight of the prefix score: the share of the prompt's blocks "
                                                  "the instance holds as a leading run (cached or predicted)")
    kv_weight: float = setting(1.0, ge=0, doc="weight of the free-KV score: 1 - the instance's KV-cache usage")
    queue_weight: float = setting(1.0, ge=0, doc="weight of the queue score: the router's outstanding requests "
                                                 "there, min-max normalised, 1 for the fewest")
    predict_ttl_s: float = setting(5.0, ge=0, unit="s", doc="how long a prompt's blocks count as cached on the "
                                                            "instance it was sent to (predict-on-route); 0: never")


class PrefixPrecise(PrefixStage):
    """Prefill on the instance with the best blend of cached prefix, free KV and short queue."""

    name = "prefix-precise"
    Params = PrefixPreciseParams

    def __init__(self, context: PolicyContext, params: PrefixPreciseParams | None = None, **values: Any) -> None:
        p = self.params = params_for(PrefixPrecise, params, values)
        super().__init__(context, p)
        self.weights = (p.prefix_weight, p.kv_weight, p.queue_weight)
        self.predicted = Predictions(p.predict_ttl_s)

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
        usages, counts = view.kv_usages(ids), view.own_request_counts(ids)
        cached = bounded_matches(self.params, self._where(ids), cached, usages, counts)
        free = 1.0 - usages
        # wp x match + wk x free + wq x queue, in that order (x * 1.0 is x: weights of 1 skip a pass)
        score = self.add_matched(ids, free if wk == 1.0 else wk * free, cached, wp / max(1, blocks))
        queue = lower_is_better_of(counts)
        score += queue if wq == 1.0 else wq * queue
        return score

    def record_placement(self, view: ClusterView, request: RequestState, instance_id: int) -> None:
        self.predicted.add(view.now_s, instance_id, request.block_keys)

STAGES = {PrefixPrecise.name: PrefixPrecise}
