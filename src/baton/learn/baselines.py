"""The learned predictor's baselines, fitted on the same training split.

- ``mean``: the training samples' mean remaining length, whatever the request.
- ``survival``: E[L - g | L > g] from the training requests' final lengths (the survival
  estimator SIBYL and Baton's ``ares`` use online, here fitted offline on the whole
  training split: alpha is 1 - 1e-9, i.e. the plain empirical survival function).
- ``prompt_only``: ridge regression of the remaining length on what is known without the
  serving model: the prompt's length, the tokens generated so far and a hashed bag of the
  prompt's token ids. It stands in for ARES's auxiliary-model predictors, which also see
  only the prompt. The ridge strength is chosen on the validation split.
"""

from __future__ import annotations

import numpy as np

from baton.predict.survival import SurvivalTable

BAG_BUCKETS = 1024


def mean_baseline(y_train: np.ndarray) -> float:
    return float(y_train.mean())


def survival_baseline(final_lengths: np.ndarray) -> SurvivalTable:
    """The empirical survival table of the training requests' output lengths."""
    # one-token buckets: the table's linear pieces add half a bucket to every length
    table = SurvivalTable(delta_tokens=1, alpha=1.0 - 1e-9, max_tokens=int(final_lengths.max()) + 2)
    for length in final_lengths:
        table.update(float(length))
    return table


def prompt_features(prompt_ids: list[list[int]], generated: np.ndarray) -> np.ndarray:
    """Per sample: log prompt length, generated tokens (linear and log) and the prompt's
    hashed bag of token ids (log counts, ``BAG_BUCKETS`` columns)."""
    bags = np.zeros((len(prompt_ids), BAG_BUCKETS))
    for i, ids in enumerate(prompt_ids):
        np.add.at(bags[i], (np.asarray(ids, dtype=np.int64) * 2654435761) % BAG_BUCKETS, 1.0)
    lengths = np.array([len(ids) for ids in prompt_ids], dtype=np.float64)
    g = generated.astype(np.float64)
    return np.column_stack([np.log1p(lengths), g / 100.0, np.log1p(g), np.log1p(bags)])


class Ridge:
    """Ridge regression in closed form on centred features (intercept unpenalised). The
    features are not scaled to unit variance: that would make a token seen in one prompt
    as cheap to weigh as the prompt length, and the fit would memorise rare tokens."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    def fit(self, x: np.ndarray, y: np.ndarray) -> Ridge:
        self.mu, self.sd = x.mean(axis=0), 1.0
        z = x - self.mu
        self.y0 = y.mean()
        self.coef = np.linalg.solve(z.T @ z + self.alpha * np.eye(z.shape[1]), z.T @ (y - self.y0))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(((x - self.mu) / self.sd) @ self.coef + self.y0, 0.0)


def prompt_only_baseline(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
                         alphas: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0, 100.0, 1e3)) -> Ridge:
    """The ridge whose strength gives the lowest validation MAE."""
    fits = [Ridge(a).fit(x_train, y_train) for a in alphas]
    maes = [np.abs(f.predict(x_val) - y_val).mean() for f in fits]
    return fits[int(np.argmin(maes))]
