"""SGLang's (and vllm-router's) cache-aware routing, at block granularity.

The router keeps its own approximate tree of the prompts it sent each instance
(``core/prefix_lru_tree.py``: SGLang's radix tree over block keys; each instance's least
recently used leaves are dropped beyond ``max_tree_blocks``, by default its KV capacity).
When the load is imbalanced (the router's own outstanding requests: max - min >
``balance_abs`` and max > ``balance_rel`` x min, defaults 64 and 1.5) the least-loaded
instance wins. Otherwise the instance holding the longest leading run of the prompt's blocks
wins if that run is more than ``cache_threshold`` (0.3) of the prompt; else the instance with
the smallest tree (SGLang's comment and code; ``fallback: least-loaded`` takes the one with
the fewest outstanding requests, as some versions do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.core.prefix_lru_tree import LruPrefixTree
from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, params_for
from baton.policies.prefix_scoring import PrefixParams, PrefixStage
from baton.policies.selection import argmin_of

FALLBACKS = ("smallest-tree", "least-loaded")


@dataclass(frozen=True, slots=True)
class CacheAwareParams(PrefixParams):
    """Cache-aware routing's balance and cache thresholds, fallback and tree size (SGLang's defaults)."""

    balance_abs: int = setting(64, ge=0, unit="requests",
                               doc="imbalance gap: the most outstanding requests on an instance must exceed the "
                                   "fewest by more than this (balance_rel holding too) for the least-loaded to win")
    balance_rel: float = setting(1.5, ge=1, doc="imbalance ratio: the most outstanding requests must also exceed "
                                                "this x the fewest for the least-loaded to win")
    cache_threshold: float = setting(0.3, ge=0, le=1, doc="follow the longest prefix sent to an instance only when "
                                                          "it is more than this share of the prompt's blocks")
    fallback: str = setting("smallest-tree", choices=FALLBACKS,
                            doc="where a prompt goes otherwise: smallest-tree (the fewest blocks in the router's "
                                "tree) or least-loaded (the fewest outstanding requests)")
    max_tree_blocks: int | None = setting(None, ge=1, unit="blocks",
                                          doc="blocks of each instance's tree kept, least recently used leaves "
                                              "dropped first; unset: its KV capacity")


class CacheAware(PrefixStage):
    """Balance when imbalanced, else follow the longest prefix the router sent, else fill
    the emptiest tree."""

    name = "cache-aware"
    Params = CacheAwareParams

    def __init__(self, context: PolicyContext, params: CacheAwareParams | None = None, **values: Any) -> None:
        p = self.params = params_for(CacheAware, params, values)
        super().__init__(context, p)
        self.balance_abs, self.balance_rel = p.balance_abs, p.balance_rel
        self.threshold, self.fallback, self.capacity = p.cache_threshold, p.fallback, p.max_tree_blocks
        self.history = LruPrefixTree()
        self.balanced = self.followed = self.filled = 0  # which rule placed each request

    def choose_prefill(self, view: ClusterView, request: RequestState) -> int | None:
        ids, keys = view.prefill_ids, request.block_keys
        loads = view.own_request_counts(ids)
        hi, lo = int(loads.max()), int(loads.min())
        sent = self.history.matches(keys)
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            choice = argmin_of(ids, loads)
            self.balanced += 1
        else:
            best = self.longest(ids, sent)
            if best is not None and keys and sent[best] / len(keys) > self.threshold:
                choice = best
                self.followed += 1
            else:
                fill = self.history.sizes(ids) if self.fallback == "smallest-tree" else view.own_request_counts(ids)
                choice = argmin_of(ids, fill)
                self.filled += 1
        if choice is not None:
            self.hit_blocks += sent.get(choice, 0)
            self.history.record(choice, keys, self.capacity or max(1, view.instance(choice).kv_blocks_total))
        return choice

    def report(self) -> dict[str, float]:
        out = super().report()
        out.update({"cache_aware_balanced": float(self.balanced), "cache_aware_followed": float(self.followed),
                    "cache_aware_filled": float(self.filled)})
        return out


STAGES = {CacheAware.name: CacheAware}
