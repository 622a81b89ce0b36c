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
        n, total, squares = view.queued_prefill_moments(instance_id)
        a, b, c = self.coef
        return max(0.0, a * squares + b * total + c * n) if n else 0.0

    def delays(self, view: ClusterView, ids: list[int]) -> np.ndarray:
        """``delay`` of every instance of ``ids`` in one columnar read (s)."""
        n, total, squares = view.prefill_moments(ids)
        a, b, c = self.coef
        return np.where(n > 0, np.maximum(0.0, a * squares + b * total + c * n), 0.0)
