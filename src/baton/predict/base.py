"""The remaining-length interface that decode assigners and rebalancers use.

An estimator answers "how many more tokens will this request generate?" from the
view, and may learn from observations (completions, progress). Implementations here:
``OracleLength`` (true remaining length) and ``NoPrediction`` (zero: current load
only). Survival-table and learned predictors implement the same interface.
"""

from __future__ import annotations

import numpy as np

from baton.core.events import Observation
from baton.core.view import ClusterView


class LengthEstimator:
    """Expected remaining output tokens of a running request."""

    name = "estimator"

    def remaining_tokens(self, view: ClusterView, req_id: int) -> float:
        raise NotImplementedError

    def remaining_batch(self, view: ClusterView, req_ids: np.ndarray, generated: np.ndarray) -> np.ndarray:
        """Expected remaining tokens of many running requests with ``generated`` tokens so
        far (the default asks one by one; estimators override it with a vectorised form)."""
        return np.array([self.remaining_tokens(view, int(r)) for r in req_ids], dtype=np.float64)

    def observe(self, view: ClusterView, observation: Observation) -> None:
        """Learn from an observation; the default ignores it."""
        return None


class OracleLength(LengthEstimator):
    """The true remaining length (an upper bound on what prediction can give)."""

    name = "oracle"

    def remaining_tokens(self, view: ClusterView, req_id: int) -> float:
        state = view.request(req_id)
        return float(state.request.output_tokens - view.generated_tokens(req_id))

    def remaining_batch(self, view: ClusterView, req_ids: np.ndarray, generated: np.ndarray) -> np.ndarray:
        lengths = np.fromiter((view.request(int(r)).request.output_tokens for r in req_ids),
                              dtype=np.float64, count=len(req_ids))
        return lengths - generated


class NoPrediction(LengthEstimator):
    """Assume nothing more will be generated: balance on current load only."""

    name = "none"

    def remaining_tokens(self, view: ClusterView, req_id: int) -> float:
        return 0.0

    def remaining_batch(self, view: ClusterView, req_ids: np.ndarray, generated: np.ndarray) -> np.ndarray:
        return np.zeros(len(req_ids))
