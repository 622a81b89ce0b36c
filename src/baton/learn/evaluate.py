"""Evaluating remaining-length predictors on the test split.

- MAE (tokens) per predictor, with a 95% bootstrap interval over test *requests* (the
  samples of one request are correlated, so requests are resampled, not samples);
- MAE and mean prediction by bucket of tokens generated so far (ARES Figure 7's axis):
  predictions should shrink as requests progress;
- latency per prediction at batch 1 and 10 (median of repeated calls, milliseconds);
- the error distribution by bucket that the simulator's ``learned-error`` estimator replays.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

REPORT_EDGES = (0, 1, 64, 128, 256, 512, 1024)  # generated-so-far buckets for the report
ERROR_EDGES = (0, 16, 32, 64, 128, 256, 512, 768)  # buckets of the simulator's error file
QUANTILES = np.linspace(0.0, 100.0, 101)


def mae(pred: np.ndarray, truth: np.ndarray) -> float:
    return float(np.abs(pred - truth).mean()) if truth.size else float("nan")


def bootstrap_ci(pred: np.ndarray, truth: np.ndarray, requests: np.ndarray, rounds: int = 1000,
                 seed: int = 0) -> tuple[float, float]:
    """95% interval of the MAE when test requests are resampled with replacement."""
    ids, inverse = np.unique(requests, return_inverse=True)
    err_sum = np.bincount(inverse, weights=np.abs(pred - truth), minlength=ids.size)
    count = np.bincount(inverse, minlength=ids.size).astype(np.float64)
    draws = np.random.default_rng(seed).integers(0, ids.size, size=(rounds, ids.size))
    values = err_sum[draws].sum(axis=1) / count[draws].sum(axis=1)
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def _buckets(edges: tuple[int, ...]) -> list[tuple[int, float]]:
    return [(lo, hi) for lo, hi in zip(edges, edges[1:])] + [(edges[-1], float("inf"))]


def by_bucket(preds: dict[str, np.ndarray], truth: np.ndarray, generated: np.ndarray) -> list[dict]:
    """Per generated-so-far bucket: samples, true mean, and each predictor's MAE and mean."""
    rows = []
    for lo, hi in _buckets(REPORT_EDGES):
        m = (generated >= lo) & (generated < hi)
        if not m.any():
            continue
        row = {"generated": f"{lo}-{'' if hi == float('inf') else int(hi) - 1}", "samples": int(m.sum()),
               "true_mean": float(truth[m].mean())}
        for name, p in preds.items():
            row[f"{name}_mae"] = mae(p[m], truth[m])
            row[f"{name}_mean"] = float(p[m].mean())
        rows.append(row)
    return rows


def mae_split(preds: dict[str, np.ndarray], truth: np.ndarray, generated: np.ndarray,
              at_tokens: int) -> dict[str, list[float]]:
    """Each predictor's MAE (tokens) on the samples with fewer than ``at_tokens`` generated
    so far and on the rest: [below, from]."""
    below = generated < at_tokens
    return {name: [mae(p[below], truth[below]), mae(p[~below], truth[~below])] for name, p in preds.items()}


def within_request(pred: np.ndarray, truth: np.ndarray, generated: np.ndarray, requests: np.ndarray,
                   min_points: int = 3) -> dict:
    """How predictions move as each request progresses: the median over requests (with at
    least ``min_points`` samples) of the slope of prediction against tokens generated (the
    truth's is -1), and the share of requests whose slope is negative."""
    slopes, true_slopes = [], []
    for r in np.unique(requests):
        m = requests == r
        if m.sum() >= min_points:
            slopes.append(np.polyfit(generated[m].astype(float), pred[m], 1)[0])
            true_slopes.append(np.polyfit(generated[m].astype(float), truth[m], 1)[0])
    if not slopes:
        return {"requests": 0, "median_slope": float("nan"), "shrinking_share": float("nan")}
    return {"requests": len(slopes), "median_slope": float(np.median(slopes)),
            "shrinking_share": float(np.mean(np.array(slopes) < -1e-6)), "true_median_slope": float(np.median(true_slopes))}


def error_file(pred: np.ndarray, truth: np.ndarray, generated: np.ndarray, meta: dict) -> dict:
    """Quantiles of the prediction error per generated-so-far bucket (``learned-error``'s
    input). A bucket with fewer than 20 samples borrows the previous bucket's quantiles."""
    buckets, last = [], None
    for lo, hi in _buckets(ERROR_EDGES):
        m = (generated >= lo) & (generated < hi)
        if m.sum() >= 20:
            last = {"abs_quantiles": np.percentile(pred[m] - truth[m], QUANTILES).round(2).tolist(),
                    "log_ratio_quantiles": np.percentile(np.log((pred[m] + 1) / (truth[m] + 1)), QUANTILES)
                    .round(4).tolist()}
        if last is None:
            continue
        buckets.append({"lo": lo, "hi": hi if hi != float("inf") else 1 << 30, "n": int(m.sum()), **last})
    return {**meta, "buckets": buckets}


def latency_ms(predict: Callable[[np.ndarray], object], d: int, batch: int, repeats: int = 300) -> float:
    """Median wall time of one ``predict`` call on ``batch`` random inputs (milliseconds)."""
    x = np.random.default_rng(0).standard_normal((batch, d)).astype(np.float32)
    for _ in range(20):
        predict(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        predict(x)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)
