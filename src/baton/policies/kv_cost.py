"""Dynamo's KV router: the lowest estimated cost of serving the prompt on each instance.

cost = prefill_load_scale x max(prefill blocks - overlap_credit x overlap blocks, 0)
       + decode blocks

where prefill blocks are the instance's queued prefill work plus the prompt, in blocks; overlap
blocks the prompt's leading blocks the instance holds cached (from the engines' caches, as
Dynamo's indexer learns them from KV events, plus predict-on-route entries for
``predict_ttl_s`` seconds); decode blocks its KV blocks in use plus the prompt's. The defaults
are Dynamo's (overlap score weight 1, temperature 0: the lowest cost wins, ties to the lowest
id); with ``temperature`` > 0 the choice is a softmax over the costs normalised by the largest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, params_for
from baton.policies.prefix_scoring import PrefixParams, PrefixStage, Predictions


@dataclass(frozen=True, slots=True)
class KvCostParams(PrefixParams):
    """The KV router's cost weights (Dynamo's defaults), sampling temperature and predictions."""

    prefill_load_scale: float = setting(1.0, ge=0, doc="weight of the prefill term (queued prefill work plus the "
                                                       "prompt, less the credited overlap, in blocks) against the "
                                                       "decode blocks")
    overlap_credit: float = setting(1.0, ge=0, doc="prefill blocks each cached overlap block takes off the "
                                                   "prefill term (Dynamo's overlap score weight)")
    temperature: float = setting(0.0, ge=0, doc="softmax temperature over the costs normalised by the largest; "
                                                "0: the lowest cost wins (ties to the lowest id)")
    predict_ttl_s: float = setting(5.0, ge=0, unit="s", doc="how long a prompt's blocks count as cached on the "
                                                            "instance it was sent to (predict-on-route); 0: never")


class KvCost(PrefixStage):
    """Prefill on the instance where new prefill work plus KV in use costs least."""

    name = "kv-cost"
    Params = KvCostParams

    def __init__(self, context: PolicyContext, params: KvCostParams | None = None, **values: Any) -> None:
        p = self.params = params_for(KvCost, params, values)
        super().__init__(context, p)
        self.scale, self.credit, self.temperature = p.prefill_load_scale, p.overlap_credit, p.temperature
        self.predicted = Predictions(p.predict_ttl_s)
        self._shape_src: list[int] | None = None
        self._bs: int | np.ndarray = 1
        self._blocks = np.zeros(0, dtype=np.int64)

    def costs(self, view: ClusterView, request: RequestState, ids: list[int]) -> tuple[np.ndarray, dict[int, int]]:
        """(cost per instance of ``ids``, read as columns; instance -> overlap blocks)."""
        keys = request.block_keys
        overlaps = self.merged(view.prefix_matches(keys), self.predicted.matches(view.now_s, keys))
        prompt = request.request.prompt_tokens
        if ids is not self._shape_src:  # block sizes and capacities change only with membership
            self._shape_src = ids
            sizes = {view.instance(i).block_size_tokens for i in ids}
            # one block size (the common case): a scalar, the same quotients without a pass
            self._bs = sizes.pop() if len(sizes) == 1 else np.array(
                [view.instance(i).block_size_tokens for i in ids], dtype=np.int64)
            self._blocks = np.array([view.instance(i).kv_blocks_total for i in ids], dtype=np.int64)
        bs = self._bs
        # in place on the fresh columns read (the same operations, no new arrays)
        prefill_blocks = view.prefill_loads(ids)
        prefill_blocks += prompt
        prefill_blocks /= bs
        decode_blocks = view.kv_usages(ids)
        decode_blocks *= self._blocks
        decode_blocks += math.ceil(prompt / bs) if isinstance(bs, int) else np.ceil(prompt / bs)
        over = self.add_matched(ids, prefill_blocks, overlaps, -self.credit)  # x * 1.0 is x: no pass at 1
        cost = np.maximum(over, 0.0, out=over)
        if self.scale != 1.0:
            cost *= self.scale
        cost += decode_blocks
        return cost, overlaps

    def choose_prefill(self, view: ClusterView, request: RequestState) -> int | None:
        ids = view.prefill_ids
        costs, overlaps = self.costs(view, request, ids)
        if self.temperature > 0 and len(ids) > 1:
            norm = costs / max(float(costs.max()), 1e-12)
            weights = np.exp(-(norm - norm.min()) / self.temperature)
            k = int(self.context.rng.choice(len(ids), p=weights / weights.sum()))
        else:
            k = int(np.argmin(costs))
        self.hit_blocks += overlaps.get(ids[k], 0)
        self.predicted.add(view.now_s, ids[k], request.block_keys)
        return ids[k]


STAGES = {KvCost.name: KvCost}
