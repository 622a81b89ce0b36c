"""What the prefix-aware stages share: blocks the router predicts an engine is about to
cache, score normalisation, and the placement rule.

Every prefix-aware stage chooses the prefill instance; on a colocated (mixed) instance the
request decodes there too, and in PD the decode instance is chosen when the prefill ends by
token load (``bind_decode``, as ``least-loaded``), or by a later stage of a composed
scheduler when ``bind_decode`` is false (e.g. prefix-aware prefill + SIBYL's decode binding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from baton.core.decisions import ArrivalPlan
from baton.core.instance import Role
from baton.core.prefix_tree import StampedPrefixTree
from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, Stage


@dataclass(frozen=True, slots=True)
class PrefixParams:
    """The parameter every prefix-aware stage has (each stage's Params extends it)."""

    bind_decode: bool = setting(True, doc="in PD, choose the decode instance by token load when the prefill ends; "
                                          "false leaves it to a later stage (e.g. SIBYL's)")


@dataclass(frozen=True, slots=True)
class BoundedPrefixParams(PrefixParams):
    """When a cached prefix stops counting (the blend scorers' load bound): SGLang's balance
    thresholds on the router's outstanding requests, and a KV-usage ceiling."""

    balance_abs: int = setting(64, ge=0, unit="requests",
                               doc="an instance with more than this many outstanding requests over the fewest "
                                   "(and balance_rel x as many) gets no credit for a cached prefix")
    balance_rel: float = setting(1.5, ge=1, doc="the ratio to the fewest outstanding requests that, with "
                                                "balance_abs, takes an instance's prefix credit away")
    saturated_kv_usage: float = setting(0.95, ge=0, le=1,
                                        doc="an instance whose KV-cache usage is at least this gets no credit for "
                                            "a cached prefix (only its load scores count); 1 keeps it to full KV")


def bounded_matches(params: BoundedPrefixParams, where: dict[int, int], cached: dict[int, int],
                    kv_usages: np.ndarray, counts: np.ndarray) -> dict[int, int]:
    """``cached`` without the instances too loaded to be worth a cached prefix: a full
    match scores the prefix weight, more than the load scores can take back, so without
    this bound one popular prefix piles onto one engine while another idles. ``where``
    maps an instance id to its position in ``kv_usages`` and ``counts``."""
    if not cached:
        return cached
    fewest = float(counts.min())
    ceiling = max(fewest + params.balance_abs, params.balance_rel * fewest)
    if counts.max() <= ceiling and kv_usages.max() < params.saturated_kv_usage:
        return cached  # nothing saturated (the usual case): three reductions, no walk over the matches
    kept = {}
    for i, m in cached.items():
        j = where.get(i)
        if j is not None and kv_usages[j] < params.saturated_kv_usage and counts[j] <= ceiling:
            kept[i] = m
    return kept


class Predictions:
    """Blocks an engine is predicted to hold because the router just sent it their prompt,
    kept ``ttl_s`` seconds (Dynamo's predict-on-route entries): a sibling request that
    arrives before the engine's first BlockStored event still finds them. Kept per prompt
    (a tree of chained keys), not per block: recording a prompt walks its branch points."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.tree = StampedPrefixTree()

    def add(self, now_s: float, instance_id: int, keys: Sequence[int]) -> None:
        if self.ttl_s > 0:
            self.tree.record(instance_id, keys, now_s + self.ttl_s)

    def matches(self, now_s: float, keys: Sequence[int]) -> dict[int, int]:
        self.tree.expire(now_s)
        return self.tree.matches(keys, now_s)


def lower_is_better_of(values: np.ndarray) -> np.ndarray:
    """Min-max scores in [0, 1], 1 for the lowest value (all 1 when the values are equal),
    as llm-d's queue scorer normalises queue lengths across pods."""
    lo, hi = values.min(), values.max()
    if hi <= lo:
        return np.ones(values.size)
    return (hi - values) / (hi - lo)


class PrefixStage(Stage):
    """Base of the prefix-aware stages: subclasses choose the prefill instance
    (``choose_prefill``); this class places it and binds the decode side."""

    needs_prefix_keys = True

    def __init__(self, context: PolicyContext, params: PrefixParams) -> None:
        super().__init__(context)
        self.bind_decode = params.bind_decode
        self.placed = self.hit_blocks = 0  # placements and the blocks they were matched on
        self._positions: tuple[Sequence[int] | None, dict[int, int]] = (None, {})

    @staticmethod
    def merged(first: dict[int, int], second: dict[int, int]) -> dict[int, int]:
        """Instance -> the longer of its two matches (one source as it is when the other
        is empty)."""
        if not first or not second:
            return first or second
        return {i: max(first.get(i, 0), second.get(i, 0)) for i in first.keys() | second.keys()}

    def add_matched(self, ids: Sequence[int], column: np.ndarray, matches: dict[int, int],
                    weight: float) -> np.ndarray:
        """``column + weight x match`` per instance of ``ids``, written in place only where
        an instance matched: elsewhere the term is ``weight x 0`` and ``x + 0.0`` is ``x``
        exactly, so the sum is the dense one, bit for bit, at a cost set by the matches."""
        where = self._where(ids)
        for i, m in matches.items():
            j = where.get(i)
            if j is not None:
                column[j] = weight * m + column[j]
        return column

    def longest(self, ids: Sequence[int], source: dict[int, int]) -> int | None:
        """The instance of ``ids`` with the longest match in ``source`` (the first in
        ``ids`` among equals), or None where none of them matched: the cost grows with the
        matches, not with the instances."""
        where = self._where(ids)
        best = min(((-m, where[i], i) for i, m in source.items() if m > 0 and i in where), default=None)
        return None if best is None else best[2]

    def _where(self, ids: Sequence[int]) -> dict[int, int]:
        """Instance id -> its position in ``ids`` (kept while the view hands out the same
        list: its id lists live until roles change)."""
        if ids is not self._positions[0]:
            self._positions = (ids, {i: j for j, i in enumerate(ids)})
        return self._positions[1]

    def cached_blocks(self, view: ClusterView, request: RequestState) -> dict[int, int]:
        """Instance -> leading blocks of the prompt this stage believes it holds cached."""
        raise NotImplementedError

    def pick_prefill(self, view: ClusterView, request: RequestState) -> tuple[int | None, int]:
        """(the prefill instance, leading prompt blocks it is matched on), with no side
        effects: a composed scheduler may still send the prompt elsewhere."""
        raise NotImplementedError

    def record_placement(self, view: ClusterView, request: RequestState, instance_id: int) -> None:
        """The prompt went to ``instance_id``: remember it (history, predictions)."""

    def choose_prefill(self, view: ClusterView, request: RequestState) -> int | None:
        """``pick_prefill``, recorded."""
        choice, matched = self.pick_prefill(view, request)
        if choice is not None:
            self.hit_blocks += matched
            self.record_placement(view, request, choice)
        return choice

    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        if plan.prefill_instance is not None or not view.prefill_ids:
            return plan
        choice = self.choose_prefill(view, request)
        if choice is None:
            return plan
        self.placed += 1
        if view.instance(choice).role is Role.MIXED:  # colocated: it decodes where it prefilled
            return ArrivalPlan(choice, choice, plan.prefill_chunk_limit_tokens)
        return ArrivalPlan(choice, plan.decode_instance, plan.prefill_chunk_limit_tokens)

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        if not self.bind_decode:
            return None
        return view.least_token_load(view.decode_ids)

    def report(self) -> dict[str, float]:
        """Mean leading blocks the chosen instance was matched on, per placement."""
        return {f"{self.name}_matched_blocks_mean": self.hit_blocks / self.placed if self.placed else 0.0}
