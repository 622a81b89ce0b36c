"""CascadeInfer's QoE model (section 4.1): normalised latency of a batch from its lengths.

A request's normalised latency (end-to-end latency over output tokens, s/token) is
``q = D . F`` with ``F = (1, n, sum I, sum I^2, sum L)`` over the batch it runs in: n
requests, prompt lengths I (0 for a request that arrived by migration: its prefill ran
elsewhere), and L the context a decode step reads (prompt plus tokens generated so far,
averaged over the request's life; the paper leaves L's exact meaning open). An instance's
QoE is ``Q^B = n * q``, the total normalised latency of its n requests. ``D`` is fitted by
ordinary least squares to profiled requests (``baton.profiling.qoe``); the paper reports
8.9% mean relative error for Llama-3.2-3B on H20.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEATURES = ("const", "batch", "sum_prompt", "sum_prompt_sq", "sum_context")


def features(prompt_tokens: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
    """F of one batch from its requests' prompt and mean context lengths (tokens)."""
    i = np.asarray(prompt_tokens, dtype=np.float64)
    return np.array([1.0, float(i.size), i.sum(), (i * i).sum(), float(np.sum(context_tokens))])


@dataclass(slots=True, frozen=True)
class QoEModel:
    """Coefficients ``d`` (seconds per output token per unit of each feature)."""

    d: tuple[float, ...]

    @classmethod
    def fit(cls, feature_rows: np.ndarray, normalised_latency_s: np.ndarray) -> "QoEModel":
        """Ordinary least squares (the paper's procedure; the constant is the intercept)."""
        coef, *_ = np.linalg.lstsq(np.asarray(feature_rows, float), np.asarray(normalised_latency_s, float),
                                   rcond=None)
        return cls(tuple(float(c) for c in coef))

    def batch_qoe_s(self, prompt_tokens: np.ndarray, context_tokens: np.ndarray) -> float:
        """Q^B = n * (D . F) for a batch; 0 when it is empty."""
        n = len(prompt_tokens)
        return 0.0 if n == 0 else n * float(np.dot(self.d, features(prompt_tokens, context_tokens)))

    def relative_errors(self, feature_rows: np.ndarray, normalised_latency_s: np.ndarray) -> np.ndarray:
        """|predicted - measured| / measured for each profiled request."""
        y = np.asarray(normalised_latency_s, float)
        return np.abs(np.asarray(feature_rows, float) @ np.asarray(self.d) - y) / y
