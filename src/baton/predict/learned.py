"""ARES's learned remaining-length predictor at serving time: an MLP over the serving model's
last-layer hidden state, evaluated with numpy (no torch needed where it runs).

The network is trained by ``baton.learn.train`` (torch) and exported as an ``.npz`` of its
layers (``w0, b0, w1, b1, ...``, ReLU between them), the input standardisation (``mean``,
``std``) and the output scale (``scale``, tokens): prediction = scale * mlp((h - mean) / std),
clipped at zero.

``LearnedLength`` is the estimator live runtimes use: hidden states arrive as
``HiddenState`` observations every k generated tokens (from the engine or a sidecar), the
estimator predicts once per observation and counts down from there, as ARES does between
re-predictions. A request with no prediction yet counts as ``fallback_tokens`` remaining.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from baton.core.errors import ConfigError
from baton.core.events import Completed, HiddenState, Observation
from baton.core.view import ClusterView
from baton.predict.base import LengthEstimator


class MLP:
    """A ReLU MLP from an exported ``.npz`` (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        try:
            with np.load(Path(path)) as f:
                data = dict(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"learned predictor: cannot read {path}: {e}") from e
        self._load(data, str(path))

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> MLP:
        """The network from exported arrays held in memory."""
        mlp = cls.__new__(cls)
        mlp._load(arrays, "arrays")
        return mlp

    def _load(self, data: dict[str, np.ndarray], path: str) -> None:
        n = sum(1 for k in data if k.startswith("w"))
        missing = {"mean", "std", "scale"} - set(data)
        if n == 0 or missing:
            raise ConfigError(f"learned predictor {path}: not an exported MLP (layers {n}, missing {sorted(missing)})")
        self.weights = [(data[f"w{i}"].astype(np.float32), data[f"b{i}"].astype(np.float32)) for i in range(n)]
        self.mean, self.std = data["mean"].astype(np.float32), data["std"].astype(np.float32)
        self.scale = float(data["scale"])
        self.input_dim = self.weights[0][0].shape[0]

    @property
    def params(self) -> int:
        return int(sum(w.size + b.size for w, b in self.weights))

    def predict(self, hidden: np.ndarray) -> np.ndarray:
        """Predicted remaining tokens for each row of ``hidden`` (rows x input_dim)."""
        x = np.atleast_2d(np.asarray(hidden, dtype=np.float32))
        if x.shape[1] != self.input_dim:
            raise ValueError(f"hidden state of width {x.shape[1]}, the predictor expects {self.input_dim}")
        x = (x - self.mean) / self.std
        for i, (w, b) in enumerate(self.weights):
            x = x @ w + b
            if i < len(self.weights) - 1:
                np.maximum(x, 0.0, out=x)
        return np.maximum(x[:, 0] * self.scale, 0.0).astype(np.float64)


class LearnedLength(LengthEstimator):
    """Remaining length from the latest hidden-state prediction, counted down since.

    ``weights``: the exported ``.npz``; ``fallback_tokens``: what a request without a
    prediction yet counts as (tokens). ``predictions`` counts the predictions made (a
    runtime exports it as a metric).
    """

    name = "learned"

    def __init__(self, weights: str, fallback_tokens: float = 0.0) -> None:
        self.mlp = MLP(weights)
        self.fallback = float(fallback_tokens)
        self.latest: dict[int, tuple[float, int]] = {}  # req id -> (prediction, generated then)
        self.predictions = 0

    def observe(self, view: ClusterView, observation: Observation) -> None:
        if isinstance(observation, HiddenState):
            value = float(self.mlp.predict(observation.vector)[0])
            self.latest[observation.req_id] = (value, observation.generated_tokens)
            self.predictions += 1
            if self.predictions % 1024 == 0:  # requests that ended without a Completed (failed, cancelled)
                self.latest = {r: v for r, v in self.latest.items() if view.has_request(r)}
        elif isinstance(observation, Completed):
            self.latest.pop(observation.req_id, None)

    def remaining_tokens(self, view: ClusterView, req_id: int) -> float:
        return float(self.remaining_batch(view, np.array([req_id]), np.array([view.generated_tokens(req_id)]))[0])

    def remaining_batch(self, view: ClusterView, req_ids: np.ndarray, generated: np.ndarray) -> np.ndarray:
        out = np.full(len(req_ids), self.fallback)
        for i, (r, g) in enumerate(zip(req_ids, generated)):
            hit = self.latest.get(int(r))
            if hit is not None:
                # counted from the prediction point, which may lie past g: ARES asks at the
                # last multiple of its own k and subtracts the tokens since itself
                out[i] = max(hit[0] - (float(g) - hit[1]), 0.0)
        return out
