"""SIBYL's online survival estimator of output lengths.

``S(l) = P(L > l)`` is kept at bucket boundaries ``l = Δ, 2Δ, ...`` (``S(0) = 1``) and
interpolated linearly in between. Each completion with final length ``L`` updates every
boundary by an exponential moving average, ``S(l) <- α S(l) + (1 - α) 1[L >= l]``
(SIBYL eq. 4). Until ``1 / (1 - α)`` completions have been seen, the weight of the old
value is ``1 - 1/n`` instead of α, so the table starts as the plain empirical survival
rather than at its arbitrary initial value.

The same table answers ARES-style questions: the expected remaining length given the
tokens generated so far, ``E[L - g | L > g] = ∫_g^∞ S(x) dx / S(g)``.
"""

from __future__ import annotations

import numpy as np

from baton.core.errors import ConfigError
from baton.core.events import Completed, Observation
from baton.core.view import ClusterView
from baton.predict.base import LengthEstimator

_FLOOR = 1e-9  # keeps conditional probabilities defined where the table reached zero


class SurvivalTable(LengthEstimator):
    """Bucketed EMA estimate of the output-length survival function.

    ``delta_tokens`` is the bucket step Δ, ``alpha`` the EMA smoothing, ``max_tokens``
    the longest length tracked (longer outputs count as reaching every boundary).
    """

    name = "survival"

    def __init__(self, delta_tokens: int = 64, alpha: float = 0.995, max_tokens: int = 65536) -> None:
        if delta_tokens <= 0 or max_tokens < delta_tokens:
            raise ConfigError(f"survival: need 0 < delta_tokens <= max_tokens, got {delta_tokens}, {max_tokens}")
        if not 0.0 < alpha < 1.0:
            raise ConfigError(f"survival: alpha must be in (0, 1), got {alpha}")
        self.delta_tokens, self.alpha = int(delta_tokens), float(alpha)
        buckets = int(np.ceil(max_tokens / delta_tokens))
        self.bounds = np.arange(buckets + 1, dtype=np.float64) * delta_tokens  # 0, Δ, 2Δ, ...
        self.values = np.ones(buckets + 1)
        self.count = 0
        self._tail: np.ndarray | None = None

    # --- learning ----------------------------------------------------------------------
    def update(self, final_length: float) -> None:
        """Fold in one completed request of ``final_length`` output tokens."""
        self.count += 1
        keep = min(self.alpha, 1.0 - 1.0 / self.count)
        self.values *= keep
        self.values[self.bounds <= final_length] += 1.0 - keep
        self.values[0] = 1.0
        self._tail = None

    def observe(self, view: ClusterView, observation: Observation) -> None:
        if isinstance(observation, Completed):
            self.update(observation.output_tokens)

    # --- queries -----------------------------------------------------------------------
    def survival(self, lengths: np.ndarray | float) -> np.ndarray:
        """Ŝ at the given output lengths (tokens), interpolated between boundaries."""
        return np.interp(lengths, self.bounds, self.values)

    def conditional(self, now_tokens: np.ndarray | float, later_tokens: np.ndarray | float) -> np.ndarray:
        """P(L > later | L > now) = Ŝ(later) / Ŝ(now)."""
        num = self.survival(later_tokens)
        den = np.maximum(self.survival(now_tokens), _FLOOR)
        return np.minimum(num / den, 1.0)

    def _tail_integral(self) -> np.ndarray:
        """∫_{b}^{max} Ŝ(x) dx at every boundary b (trapezoids are exact for linear Ŝ)."""
        if self._tail is None:
            seg = 0.5 * (self.values[1:] + self.values[:-1]) * self.delta_tokens
            self._tail = np.concatenate([np.cumsum(seg[::-1])[::-1], [0.0]])
        return self._tail

    def expected_remaining(self, generated_tokens: np.ndarray | float) -> np.ndarray:
        """E[L - g | L > g] in tokens for g tokens generated so far."""
        g = np.minimum(np.asarray(generated_tokens, dtype=np.float64), self.bounds[-1])
        tail = self._tail_integral()
        i = np.minimum((g // self.delta_tokens).astype(np.int64), len(self.bounds) - 2)
        frac = (g - self.bounds[i]) / self.delta_tokens
        s_g = self.values[i] + frac * (self.values[i + 1] - self.values[i])
        # area from g to the next boundary under the linear piece, plus the tail after it
        area = 0.5 * (s_g + self.values[i + 1]) * (self.bounds[i + 1] - g) + tail[i + 1]
        return area / np.maximum(s_g, _FLOOR)

    def remaining_tokens(self, view: ClusterView, req_id: int) -> float:
        return float(self.expected_remaining(view.generated_tokens(req_id)))

    def remaining_batch(self, view: ClusterView, req_ids: np.ndarray, generated: np.ndarray) -> np.ndarray:
        return self.expected_remaining(generated)
