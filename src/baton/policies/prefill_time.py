"""Prefill time as SLO-aware policies predict it: a quadratic in the prompt length fitted
to the performance model at start-up (Arrow section 5.3), and the queueing delay of an
instance's queued prompts summed in O(1) from their moments."""

from __future__ import annotations

import numpy as np

from baton.core.view import ClusterView
from baton.perf.model import PerfModel


def fit_prefill_quadratic(perf: PerfModel, max_tokens: int = 32768) -> np.ndarray:
    """Coefficients (a, b, c) of pt(L) = a L^2 + b L + c seconds, relative least squares
    over single-request prefill times at 16 prompt lengths from 16 to ``max_tokens``."""
    lengths = np.unique(np.geomspace(16, max_tokens, 16).astype(int))
    times = np.array([perf.prefill_time_s(int(n)) for n in lengths])
    a = np.column_stack([lengths ** 2.0, lengths, np.ones_like(lengths)])
    # relative least squares: a 10 ms miss matters on a short prompt, not on a long one
    coef, *_ = np.linalg.lstsq(a / times[:, None], np.ones_like(times), rcond=None)
    return coef


class PrefillPredictor:
    """``pt(L)`` and per-instance queueing delay from one quadratic fit."""

    def __init__(self, perf: PerfModel) -> None:
        self.coef = fit_prefill_quadratic(perf)

    def pt(self, tokens: float) -> float:
        """Predicted prefill time of a prompt alone (s)."""
        a, b, c = self.coef
        return max(0.0, a * tokens * tokens + b * tokens + c) if tokens > 0 else 0.0

    def delay(self, view: ClusterView, instance_id: int) -> float:
        """Predicted time until a new prefill on the instance starts (s): the quadratic
        summed over the prompt tokens still queued there."""
        n, total, squares = self.moments(view, instance_id)
        a, b, c = self.coef
        return max(0.0, a * squares + b * total + c * n) if n else 0.0

    def delays(self, view: ClusterView, ids: list[int]) -> np.ndarray:
        """``delay`` of every instance of ``ids`` in one columnar read (s)."""
        n, total, squares = self.moments_of(view, ids)
        a, b, c = self.coef
        return np.where(n > 0, np.maximum(0.0, a * squares + b * total + c * n), 0.0)

    def moments(self, view: ClusterView, instance_id: int) -> tuple[int, int, int]:
        """(count, sum, sum of squares) of the tokens the instance's queued prompts cost."""
        return view.queued_prefill_moments(instance_id)

    def moments_of(self, view: ClusterView, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``moments`` of every instance of ``ids`` (arrays the caller may keep)."""
        return view.prefill_moments(ids)

    def queued_tokens(self, view: ClusterView, instance_id: int, req_id: int, left: int) -> int:
        """The tokens a prompt queued on an instance still costs to prefill (``left``: its
        booked remainder). All of them here; ``HitAwarePredictor`` takes off the cache hit
        the router expects."""
        return left


class HitAwarePredictor(PrefillPredictor):
    """A ``PrefillPredictor`` that prices a queued prompt by the tokens not cached where it
    was placed: the router records the cached prefix it expected (``expect``), and while
    the prompt's booked remainder is still its whole prompt the queue's moments count only
    the rest. In the simulator that is until its first chunk ends (an expected hit the
    engine did not find is discounted until then too); live, bookings do not progress, so
    until the prefill leg returns. An expectation lasts while the prompt is queued on that
    instance, so a preempted prompt, booked whole again, is discounted again. Bookings
    count whole prompts, so without this an instance holding a popular prefix looks as
    busy as one that must compute every queued token, and a cache-aware placement spreads
    prompts away from the cache they would hit."""

    def __init__(self, perf: PerfModel) -> None:
        super().__init__(perf)
        self.hits: dict[int, dict[int, int]] = {}  # instance -> req_id -> expected cached tokens

    def expect(self, instance_id: int, req_id: int, cached_tokens: int) -> None:
        """A prompt placed on an instance where ``cached_tokens`` of it are expected cached."""
        if cached_tokens > 0:
            self.hits.setdefault(instance_id, {})[req_id] = cached_tokens

    def queued_tokens(self, view: ClusterView, instance_id: int, req_id: int, left: int) -> int:
        hit = self.hits.get(instance_id, {}).get(req_id, 0)
        if hit and left == view.request(req_id).request.prompt_tokens:
            return max(1, left - hit)
        return left

    def _discount(self, view: ClusterView, instance_id: int) -> tuple[int, int]:
        """What the expected hits take off an instance's (sum, sum of squares) of queued
        tokens (the count stays: each prompt still costs its constant); entries of prompts
        no longer queued there are dropped (a started one stays, undiscounted: it may be
        preempted and booked whole again)."""
        hits = self.hits.get(instance_id)
        if not hits:
            return 0, 0
        queue = view.instance(instance_id).prefill_queue
        d_total = d_sq = 0
        for rid, hit in list(hits.items()):
            left = queue.get(rid)
            if left is None:
                del hits[rid]
                continue
            if left != view.request(rid).request.prompt_tokens:
                continue
            cost = max(1, left - hit)
            d_total += left - cost
            d_sq += left * left - cost * cost
        if not hits:
            del self.hits[instance_id]
        return d_total, d_sq

    def moments(self, view: ClusterView, instance_id: int) -> tuple[int, int, int]:
        n, total, squares = view.queued_prefill_moments(instance_id)
        if not n:
            return n, total, squares
        d_total, d_sq = self._discount(view, instance_id)
        return n, total - d_total, squares - d_sq

    def moments_of(self, view: ClusterView, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, total, squares = view.prefill_moments(ids)
        if self.hits:
            for k, i in enumerate(ids):
                if i in self.hits:
                    d_total, d_sq = self._discount(view, i)
                    total[k] -= d_total
                    squares[k] -= d_sq
        return n, total, squares
