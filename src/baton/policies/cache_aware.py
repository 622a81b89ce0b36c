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

from baton.core.prefix_lru_tree import LruPrefixTree
from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext
from baton.policies.prefix_scoring import PrefixStage
from baton.policies.selection import argmin_of

FALLBACKS = ("smallest-tree", "least-loaded")


class CacheAware(PrefixStage):
    """Balance when imbalanced, else follow the longest prefix the router sent, else fill
    the emptiest tree."""

    name = "cache-aware"

    def __init__(self, context: PolicyContext, balance_abs: int = 64, balance_rel: float = 1.5,
                 cache_threshold: float = 0.3, fallback: str = "smallest-tree",
                 max_tree_blocks: int | None = None, bind_decode: bool = True) -> None:
        super().__init__(context, bind_decode)
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback: expected one of {', '.join(FALLBACKS)}, got {fallback!r}")
        if balance_abs < 0 or balance_rel < 1 or not 0 <= cache_threshold <= 1:
            raise ValueError("balance_abs must be >= 0, balance_rel >= 1, cache_threshold in [0, 1]")
        if max_tree_blocks is not None and max_tree_blocks < 1:
            raise ValueError("max_tree_blocks must be >= 1")
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self.threshold, self.fallback, self.capacity = cache_threshold, fallback, max_tree_blocks
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
